"""Trust-aware metrics on hand-checked cases (a fake embedding function, a fake backend)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from sieverag.inference.errors import ConfigError
from sieverag.inference.eval.trust import (
    JUDGE_CRITERIA,
    JUDGE_PROMPT,
    QualityWeights,
    TrustWeights,
    answer_quality,
    content_tokens,
    context_precision_gold,
    context_precision_used,
    faithfulness,
    hallucination_rate,
    judge_answer,
    keyword_coverage,
    parse_judge_reply,
    sentence_support_rate,
    trust_report,
    trust_score,
)
from sieverag.inference.llm.base import GenerationSettings, UsageMeter
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.types import Document

DOCS = [
    Document(id="d1", text="Paris is the capital of France.", is_gold=True),
    Document(id="d2", text="Berlin is the capital of Germany.", is_gold=False),
    Document(id="d3", text="Bananas are yellow.", is_gold=False),
]

# Fixed vectors so cosines are known: cos(x, y) = dot of unit vectors.
VECTORS = {
    "Paris is the capital.": [1.0, 0.0, 0.0],
    "It has the Louvre.": [0.0, 1.0, 0.0],
    "Paris is the capital of France.": [0.8, 0.6, 0.0],   # cos 0.8 with sentence 1
    "Berlin is the capital of Germany.": [0.0, 0.0, 1.0],
    "Bananas are yellow.": [0.0, 0.3, 0.954],           # cos 0.3 with sentence 2
}


def fake_embed(texts: Sequence[str]) -> np.ndarray:
    return np.array([VECTORS[t] for t in texts], dtype=np.float32)


def test_content_tokens_drop_stop_words() -> None:
    assert content_tokens("The capital of France is Paris!") == {"capital", "france", "paris"}


def test_faithfulness_and_hallucination_rate() -> None:
    # answer content tokens: paris, capital, big → 2 of 3 found in the documents
    assert faithfulness("Paris is the big capital", DOCS) == pytest.approx(2 / 3)
    assert hallucination_rate("Paris is the big capital", DOCS) == pytest.approx(1 / 3)
    assert faithfulness("Paris", ["Paris, France"]) == 1.0  # plain strings work too
    assert faithfulness("It is what it is.", DOCS) is None  # only stop words / nothing to check
    assert hallucination_rate("", DOCS) is None
    assert faithfulness("Paris", []) == 0.0


def test_context_precision_variants() -> None:
    # "Paris capital" shares tokens with d1 and d2 (capital), not d3 → 2/3 used
    assert context_precision_used("Paris capital", DOCS) == pytest.approx(2 / 3)
    assert context_precision_used("Paris", []) is None
    assert context_precision_gold(DOCS) == pytest.approx(1 / 3)
    assert context_precision_gold([Document(id="x", text="t")]) is None
    assert context_precision_gold([]) is None


def test_sentence_support_rate_threshold() -> None:
    answer = "Paris is the capital. It has the Louvre."
    # sentence 1: best cos 0.8 (d1); sentence 2: best cos 0.6 (d1) → both pass 0.5
    assert sentence_support_rate(answer, DOCS, fake_embed) == 1.0
    # at 0.7 only sentence 1 passes
    assert sentence_support_rate(answer, DOCS, fake_embed, threshold=0.7) == 0.5
    # without d1, sentence 2's best is 0.3 (d3), sentence 1's is 0.0
    assert sentence_support_rate(answer, DOCS[1:], fake_embed) == 0.0
    assert sentence_support_rate(answer, [], fake_embed) == 0.0
    assert sentence_support_rate("", DOCS, fake_embed) is None
    presplit = Document(id="s", text="ignored", sentences=("Paris is the capital of France.",))
    assert sentence_support_rate("Paris is the capital.", [presplit], fake_embed) == 1.0


def test_trust_score_weights_and_missing_parts() -> None:
    assert trust_score(1.0, 0.5, 0.0) == pytest.approx(0.4 * 1 + 0.3 * 0.5 + 0.3 * 0)
    # missing sentence support → renormalise over faithfulness and precision
    assert trust_score(1.0, None, 0.5) == pytest.approx((0.4 + 0.3 * 0.5) / 0.7)
    assert trust_score(None, None, None) is None
    assert trust_score(0.5, 1.0, 1.0, TrustWeights(1, 0, 0)) == 0.5
    with pytest.raises(ConfigError):
        TrustWeights(-1, 0, 0)


def test_trust_report_collects_everything() -> None:
    report = trust_report("Paris is the capital. It has the Louvre.", DOCS, fake_embed)
    # content tokens: paris, capital, louvre → 2/3 faithful; d1, d2 used
    assert report.faithfulness == pytest.approx(2 / 3)
    assert report.hallucination_rate == pytest.approx(1 / 3)
    assert report.context_precision_used == pytest.approx(2 / 3)
    assert report.context_precision_gold == pytest.approx(1 / 3)
    assert report.sentence_support_rate == 1.0
    expected = 0.4 * (2 / 3) + 0.3 * 1.0 + 0.3 * (2 / 3)
    assert report.trust_score == pytest.approx(expected)
    assert trust_report("Paris", DOCS).sentence_support_rate is None
    assert set(report.to_dict()) >= {"faithfulness", "trust_score"}


def test_answer_quality_combines_similarity_and_keywords() -> None:
    vectors = {"Paris": [1.0, 0.0], "Paris, France": [0.6, 0.8], "Lyon": [0.0, 1.0],
               "France": [0.0, 1.0]}

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.array([vectors[t] for t in texts])

    assert keyword_coverage("Paris", "Paris, France") == 0.5
    # cos 0.6, coverage 0.5 → 0.6·0.6 + 0.4·0.5 = 0.56
    assert answer_quality("Paris", "Paris, France", embed) == pytest.approx(0.56)
    # best alias counts: "Paris" vs "Paris" → 1.0
    assert answer_quality("Paris", ["Lyon", "Paris"], embed) == pytest.approx(1.0)
    # orthogonal vectors, no shared keyword → 0
    assert answer_quality("Paris", "France", embed) == 0.0
    assert answer_quality("", "Paris", embed) == 0.0
    assert answer_quality("Paris", [], embed) is None
    assert answer_quality("Paris", "Paris, France", embed, QualityWeights(1, 0)) == \
        pytest.approx(0.6)


# --- LLM judge ------------------------------------------------------------------------------

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


VALID = ('{"correctness": 5, "relevance": 4, "completeness": 3, "evidence_grounding": 5, '
         '"hallucination_risk": 4, "overall": 4}')


def test_judge_answer_builds_prompt_and_parses_scores() -> None:
    backend = FakeBackend(f"Here you go:\n```json\n{VALID}\n```")
    verdict = judge_answer(backend, "Capital of France?", "Paris", "Paris", DOCS[:1])
    assert verdict.ok and verdict.scores() == {
        "correctness": 5, "relevance": 4, "completeness": 3, "evidence_grounding": 5,
        "hallucination_risk": 4, "overall": 4}
    system, user = backend.prompts[0]
    assert system["role"] == "system" and "hallucination_risk" in system["content"]
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
def test_judge_invalid_replies_give_none_scores(reply: str, reason: str) -> None:
    verdict = judge_answer(FakeBackend(reply), "q", "a", "r", [])
    assert not verdict.ok and reason in (verdict.error or "")
    assert all(verdict.scores()[name] is None for name in JUDGE_CRITERIA)
    assert verdict.raw == reply


def test_parse_ignores_extra_keys_and_prompt_file_is_valid() -> None:
    assert parse_judge_reply(VALID[:-1] + ', "why": "fine"}').overall == 4
    template = load_template(JUDGE_PROMPT)
    assert template.name == "llm_judge_eval"
    assert template.inputs == ("question", "answer", "reference", "documents")
