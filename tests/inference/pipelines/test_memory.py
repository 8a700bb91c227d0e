"""AMU: Reviewer, then Challenger who reads the review, then Refiner; the memory cap; the
shared prompt prefix of every memory and collector agent."""

from __future__ import annotations

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.pipelines.amber.memory import (
    EMPTY_MEMORY,
    MemoryConfig,
    MemoryUpdater,
    cap_memory,
)


def agent_reply(text: str) -> str:
    # One conversation: a later agent's prompt holds the earlier ones', so look from the last.
    for task, reply in (("Task (Refiner)", "Liora Tamsin was born in Quorrin. She mapped coasts."),
                        ("Task (Challenger)", "The year is not asked."),
                        ("Task (Reviewer)", "Quorrin is correct.")):
        if task in text:
            return reply
    raise AssertionError(f"unexpected prompt {text!r}")


def test_update_runs_reviewer_then_challenger_on_the_review_then_refines():
    backend = ScriptedBackend(reply=agent_reply)
    update = MemoryUpdater(backend).update("Where was Liora born?", "",
                                           "[1] Liora Tamsin was born in Quorrin.")
    assert update.memory == "Liora Tamsin was born in Quorrin. She mapped coasts."
    assert (update.review, update.challenge) == ("Quorrin is correct.", "The year is not asked.")
    assert not update.truncated
    assert [agent for agent, _ in backend.calls] == ["reviewer", "challenger", "refiner"]
    refiner_prompt = backend.calls[2][1]
    assert f"Memory:\n{EMPTY_MEMORY}" in refiner_prompt and "Task (Challenger)" in refiner_prompt
    assert update.to_dict()["refiner"] == update.refined


def test_memory_is_capped_and_an_empty_refiner_reply_keeps_it():
    backend = ScriptedBackend(reply=agent_reply)
    capped = MemoryUpdater(backend, MemoryConfig(max_chars=40)).update("q?", "old", "[1] e")
    assert capped.memory == "Liora Tamsin was born in Quorrin." and capped.truncated
    silent = ScriptedBackend(reply=lambda text: "" if "Task (Refiner)" in text else "ok")
    assert MemoryUpdater(silent).update("q?", "old notes", "[1] e").memory == "old notes"


def test_cap_memory_cuts_at_a_sentence_end_else_a_word_break():
    assert cap_memory("  short  ", 10) == ("short", False)
    assert cap_memory("One two. Three four five.", 15) == ("One two.", True)
    assert cap_memory("alpha beta gamma delta", 12) == ("alpha beta", True)
    with pytest.raises(ConfigError, match="max_chars"):
        MemoryConfig(max_chars=0)


def test_memory_and_collector_prompts_share_their_prefix():
    values = {"question": "Q?", "memory": "M.", "evidence": "[1] E.", "queries": "- Q?",
              "candidate": "C"}
    rendered = {}
    for name in ("amu_reviewer", "aic_sufficiency", "aic_query", "aic_bridge"):
        template = load_template(name)
        rendered[name] = template.messages(**{k: values[k] for k in template.inputs})
    systems = {messages[0]["content"] for messages in rendered.values()}
    assert len(systems) == 1  # one system prompt for every memory and collector agent
    for messages in rendered.values():
        assert messages[1]["content"].startswith("Question: Q?\n\nMemory:\nM.\n\n")


def test_each_memory_agent_continues_the_conversation_before_it():
    seen = []

    class Recording(ScriptedBackend):
        def generate(self, prompts, settings=None, *, agent="generator"):
            seen.extend(prompts)
            return super().generate(prompts, settings, agent=agent)

    MemoryUpdater(Recording(reply=agent_reply)).update("Q?", "M.", "[1] E.")
    reviewer, challenger, refiner = seen
    # Each prompt extends the previous one (the prompt cache reads the evidence once).
    assert challenger[:len(reviewer)] == reviewer and refiner[:len(challenger)] == challenger
    assert challenger[len(reviewer)] == {"role": "assistant", "content": "Quorrin is correct."}
    assert refiner[len(challenger)] == {"role": "assistant",
                                        "content": "The year is not asked."}
    assert "New evidence:\n[1] E." in reviewer[-1]["content"]
    assert challenger[-1]["content"].startswith("Task (Challenger)")
    assert refiner[-1]["content"].startswith("Task (Refiner)")
