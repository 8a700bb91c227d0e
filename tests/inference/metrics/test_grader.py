"""The Auto-RAG study's LLM grader: its prompt, strict parsing of a reply (a fake backend)."""

from __future__ import annotations

import pytest

from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.types import Document
from sieverag.inference.llm.backend_protocol import GenerationSettings, UsageMeter
from sieverag.inference.metrics.grader import (
    GRADER_CRITERIA,
    GRADER_PROMPT,
    GRADER_PROMPT_NO_CONTEXT,
    GraderItem,
    grade_answers,
    parse_grader_reply,
)

DOCS = [Document(id="d1", text="Paris is the capital of France.", is_gold=True)]

class FakeBackend:
    """Returns a canned reply and records the conversations it was sent."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list = []
        self.meter = UsageMeter()

    @property
    def model_name(self) -> str:
        return "fake"

    def generate(self, prompts, settings=GenerationSettings(), *, agent="generator"):
        self.prompts.extend(prompts)
        return [self.reply for _ in prompts]

    def label_logprobs(self, prompts, labels, *, agent="scorer"):
        raise NotImplementedError

    def continuation_logprob(self, prompts, continuations, *, agent="scorer"):
        raise NotImplementedError

    def marked_label_logprobs(self, prompts, labels, *, agent="scorer"):
        raise NotImplementedError


VALID = ('{"correctness": 5, "relevance": 4, "completeness": 3, "evidence_grounding": 5, '
         '"hallucination_risk": 4, "overall": 4}')


def test_grader_builds_prompt_and_parses_scores() -> None:
    backend = FakeBackend(f"Here you go:\n```json\n{VALID}\n```")
    (verdict,) = grade_answers(backend, [GraderItem("Capital of France?", "Paris", "Paris",
                                                    DOCS[:1])])
    assert verdict.ok and verdict.scores() == {
        "correctness": 5, "relevance": 4, "completeness": 3, "evidence_grounding": 5,
        "hallucination_risk": 4, "overall": 4}
    system, user = backend.prompts[0]
    assert system["role"] == "system" and "hallucination_risk (1 = best)" in system["content"]
    assert "Capital of France?" in user["content"] and "[1] Paris is the capital" in \
        user["content"]
    assert '{"correctness": _' in user["content"]  # escaped braces rendered literally


@pytest.mark.parametrize(("reply", "reason"), [
    ("I think it is good.", "no JSON object"),
    ("{correctness: 5}", "not valid JSON"),
    ('{"correctness": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"correctness": ' + "9" * 5000 + "}", "holds a number longer than"),
    ('{"correctness": 5}', "missing score(s): relevance"),
    (VALID.replace('"overall": 4', '"overall": 6'), "not an integer 1-5: overall"),
    (VALID.replace('"overall": 4', '"overall": "4"'), "not an integer 1-5: overall"),
    (VALID.replace('"overall": 4', '"overall": 4.5'), "not an integer 1-5: overall"),
    (VALID.replace('"overall": 4', '"overall": true'), "not an integer 1-5: overall"),
    ("[1, 2]", "no JSON object"),
])
def test_grader_invalid_replies_give_none_scores(reply: str, reason: str) -> None:
    (verdict,) = grade_answers(FakeBackend(reply), [GraderItem("q", "a", "r", DOCS[:1])])
    assert not verdict.ok and reason in (verdict.error or "")
    assert all(verdict.scores()[name] is None for name in GRADER_CRITERIA)
    assert verdict.raw == reply


def test_parse_ignores_extra_keys_and_prompt_file_is_valid() -> None:
    assert parse_grader_reply(VALID[:-1] + ', "why": "fine"}').overall == 4
    template = load_template(GRADER_PROMPT)
    assert template.name == "answer_grader"
    assert template.inputs == ("question", "answer", "reference", "documents")


def test_grader_without_retrieval_asks_no_grounding() -> None:
    reply = ('{"correctness": 2, "relevance": 4, "completeness": 3, "hallucination_risk": 1, '
             '"overall": 3}')
    backend = FakeBackend(reply)
    (verdict,) = grade_answers(backend, [GraderItem("Capital of France?", "Lyon", "Paris")])
    assert verdict.ok and verdict.evidence_grounding is None and verdict.hallucination_risk == 1
    system, user = backend.prompts[0]
    assert "evidence_grounding" not in system["content"] + user["content"]
    assert "Documents" not in user["content"]
    # a grounding score given anyway is ignored; one missing with retrieval is an error
    assert parse_grader_reply(VALID, retrieved=False).evidence_grounding is None
    assert "missing score(s): evidence_grounding" in parse_grader_reply(reply).error
    template = load_template(GRADER_PROMPT_NO_CONTEXT)
    assert template.name == "answer_grader_no_context"
    assert template.inputs == ("question", "answer", "reference")
