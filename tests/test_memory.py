"""AMU: Reviewer, then Challenger who reads the review, then Refiner; the memory cap; the
shared prompt prefix of every memory and collector agent."""

from __future__ import annotations

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.errors import ConfigError
from sieverag.inference.pipelines.memory import (
    EMPTY_MEMORY,
    MemoryConfig,
    MemoryUpdater,
    cap_memory,
)
from sieverag.inference.prompt_templates import load_template


def agent_reply(text: str) -> str:
    for task, reply in (("Task (Reviewer)", "Quorrin is correct."),
                        ("Task (Challenger)", "The year is not asked."),
                        ("Task (Refiner)", "Liora Tamsin was born in Quorrin. She mapped coasts.")):
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
    assert "Reviewer's check: Quorrin is correct." in backend.calls[1][1]
    refiner_prompt = backend.calls[2][1]
    assert f"Memory:\n{EMPTY_MEMORY}" in refiner_prompt
    assert "Reviewer's check: Quorrin is correct." in refiner_prompt
    assert "Challenger's objection: The year is not asked." in refiner_prompt
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
    values = {"question": "Q?", "memory": "M.", "evidence": "[1] E.", "review": "R",
              "challenge": "C", "queries": "- Q?"}
    rendered = {}
    for name in ("amu_reviewer", "amu_challenger", "amu_refiner", "aic_sufficiency",
                 "aic_query"):
        template = load_template(name)
        rendered[name] = template.messages(**{k: values[k] for k in template.inputs})
    systems = {messages[0]["content"] for messages in rendered.values()}
    assert len(systems) == 1  # one system prompt for every memory agent
    for messages in rendered.values():
        assert messages[1]["content"].startswith("Question: Q?\n\nMemory:\nM.\n\n")
    evidence_prefix = "Question: Q?\n\nMemory:\nM.\n\nNew evidence:\n[1] E.\n\n"
    for name in ("amu_reviewer", "amu_challenger", "amu_refiner"):
        assert rendered[name][1]["content"].startswith(evidence_prefix)
