"""CXMI: the shared-prefix scorer equals the naive reference; the answer-bearing context wins."""

from __future__ import annotations

import pytest

from sieverag.data_gen.cxmi import BatchedCXMI, SharedPrefixCXMI, cxmi_scorer, naive_cxmi
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

QUESTION = "In which city was the physicist Lise Meitner born?"
ANSWERS = ["Vienna", "Wien"]
CONTEXTS = [
    "Lise Meitner was born in Vienna on 7 November 1878.",
    "The Danube flows through ten countries.",
    "Meitner worked in Berlin with Otto Hahn for thirty years before she had to leave Germany.",
    "Vienna",
]


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir) -> HFBackend:
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu", batch_size=3))


def test_shared_prefix_equals_naive_and_batched(tiny_backend: HFBackend) -> None:
    fast = SharedPrefixCXMI(tiny_backend).score(QUESTION, ANSWERS, CONTEXTS)
    naive = naive_cxmi(tiny_backend, QUESTION, ANSWERS, CONTEXTS)
    batched = BatchedCXMI(tiny_backend).score(QUESTION, ANSWERS, CONTEXTS)
    for f, n, b in zip(fast, naive, batched, strict=True):
        assert f.alias == n.alias == b.alias
        assert f.score == pytest.approx(n.score, abs=1e-4)
        assert b.score == pytest.approx(n.score, abs=1e-4)
        assert f.logprob_with == pytest.approx(n.logprob_with, abs=1e-4)
        assert f.logprob_without == pytest.approx(n.logprob_without, abs=1e-4)
        assert f.score == pytest.approx(f.logprob_with - f.logprob_without, abs=1e-9)
    # many small batches (a tight token budget) give the same scores
    small = SharedPrefixCXMI(tiny_backend, batch_tokens=20).score(QUESTION, ANSWERS, CONTEXTS)
    assert [s.score for s in small] == pytest.approx([f.score for f in fast], abs=1e-4)


def test_best_alias_is_taken_and_no_context_term_is_shared(tiny_backend: HFBackend) -> None:
    scorer = SharedPrefixCXMI(tiny_backend)
    both = scorer.score(QUESTION, ANSWERS, CONTEXTS)
    per_alias = [scorer.score(QUESTION, [alias], CONTEXTS) for alias in ANSWERS]
    for i, score in enumerate(both):
        best = max((s[i] for s in per_alias), key=lambda s: s.score)
        assert score.alias == best.alias
        assert score.score == pytest.approx(best.score, abs=1e-4)
    # the no-context term is one number per alias, whatever the context
    assert len({round(s.logprob_without, 6) for s in per_alias[0]}) == 1


def test_one_pass_per_question_counts_each_sequence_once(tiny_backend: HFBackend) -> None:
    before = tiny_backend.meter.snapshot().get("cxmi")
    SharedPrefixCXMI(tiny_backend).score(QUESTION, ["Vienna"], CONTEXTS)
    after = tiny_backend.meter.snapshot()["cxmi"]
    # one no-context sequence for the question, one per context
    assert after.calls - (before.calls if before else 0) == 1 + len(CONTEXTS)


def test_duplicate_and_blank_aliases_are_dropped_and_no_alias_is_an_error(tiny_backend) -> None:
    scorer = cxmi_scorer(tiny_backend)
    assert isinstance(scorer, SharedPrefixCXMI)
    assert scorer.score(QUESTION, ["Vienna", "Vienna", " "], CONTEXTS[:1])[0].alias == "Vienna"
    with pytest.raises(ValueError):
        scorer.score(QUESTION, ["  "], CONTEXTS)


@pytest.mark.integration
def test_embedded_model_prefers_the_context_with_the_answer(embedded_model_dir) -> None:
    backend = HFBackend(HFBackendConfig(model=str(embedded_model_dir), device="cpu"))
    contexts = [CONTEXTS[0], CONTEXTS[2]]  # the answer; a context about her without it
    fast = SharedPrefixCXMI(backend).score(QUESTION, ["Vienna"], contexts)
    naive = naive_cxmi(backend, QUESTION, ["Vienna"], contexts)
    assert fast[0].score > 0
    assert fast[0].score > fast[1].score
    for f, n in zip(fast, naive, strict=True):
        assert f.score == pytest.approx(n.score, abs=1e-4)
