"""Trust-aware metrics on hand-checked cases (a fake embedding function, a fake backend)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from sieverag.inference.composition.config import TrustConfig
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.metrics.trust import (
    STUDY_TAAS_WEIGHTS,
    QualityWeights,
    SupportMatrix,
    TAASWeights,
    answer_quality,
    content_tokens,
    context_precision,
    context_precision_gold,
    evidence_noise,
    faithfulness,
    hallucination_rate,
    keyword_coverage,
    lexical_context_use,
    sentence_context_precision,
    sentence_evidence_noise,
    sentence_similarity,
    sentence_support_by_sentence,
    sentence_support_rate,
    sentence_taas,
    taas,
    trust_report,
    unsupported_sentence_rate,
)

DOCS = [
    Document(id="d1", text="Paris is the capital of France.", is_gold=True),
    Document(id="d2", text="Berlin is the capital of Germany.", is_gold=False),
    Document(id="d3", text="Bananas are yellow.", is_gold=False),
]
ANSWER = "Paris is the capital. It has the Louvre."
QUESTION = "Capital of France?"

# Fixed vectors so cosines are known: cos(x, y) = dot of unit vectors.
VECTORS = {
    "Paris is the capital.": [1.0, 0.0, 0.0],
    "It has the Louvre.": [0.0, 1.0, 0.0],
    "Paris is the capital of France.": [0.8, 0.6, 0.0],   # cos 0.8 / 0.6 with the two above
    "Berlin is the capital of Germany.": [0.0, 0.0, 1.0],
    "Bananas are yellow.": [0.0, 0.3, 0.954],           # cos 0.3 with sentence 2
    QUESTION: [1.0, 0.0, 0.0],                          # cos 0.8 / 0 / 0 with the documents
    "Paris": [1.0, 0.0, 0.0],
    "Paris, France": [0.6, 0.8, 0.0],                   # cos 0.6 with "Paris"
    ANSWER: [0.0, 0.6, 0.8],                            # cos 0.48 with "Paris, France"
}


def fake_embed(texts: Sequence[str]) -> np.ndarray:
    return np.array([VECTORS[t] for t in texts], dtype=np.float32)


def support() -> SupportMatrix:
    return SupportMatrix.of(ANSWER, DOCS, fake_embed)


def test_content_tokens_drop_stop_words() -> None:
    assert content_tokens("The capital of France is Paris!") == {"capital", "france", "paris"}


def test_faithfulness_is_the_share_of_answer_tokens_found_in_the_context() -> None:
    # answer content tokens: paris, capital, big → 2 of 3 found in the documents
    assert faithfulness("Paris is the big capital", DOCS) == pytest.approx(2 / 3)
    assert hallucination_rate("Paris is the big capital", DOCS) == pytest.approx(1 / 3)
    assert faithfulness("Paris", []) is None and hallucination_rate("Paris", []) is None
    assert faithfulness("It is what it is", DOCS) is None  # no content token


def test_sentence_similarity_is_the_mean_best_cosine_of_the_answer_sentences() -> None:
    # sentence 1's best context sentence: 0.8 (d1); sentence 2's: 0.6 (d1) → mean 0.7
    assert sentence_similarity(support()) == pytest.approx(0.7)
    assert sentence_similarity(SupportMatrix.of(ANSWER, [], fake_embed)) is None
    assert sentence_similarity(SupportMatrix.of("", DOCS, fake_embed)) is None


def test_supported_and_unsupported_sentences_share_one_threshold() -> None:
    assert sentence_support_by_sentence(support(), 0.5) == 1.0  # 0.8 and 0.6 both ≥ 0.5
    assert unsupported_sentence_rate(support(), 0.5) == 0.0
    assert sentence_support_by_sentence(support(), 0.7) == 0.5  # only 0.8 ≥ 0.7
    assert unsupported_sentence_rate(support(), 0.7) == 0.5  # "It has the Louvre." is not
    assert unsupported_sentence_rate(SupportMatrix.of(ANSWER, [], fake_embed)) is None


def test_context_precision_is_the_share_of_context_tokens_the_answer_uses() -> None:
    # the context's content tokens: paris, capital, france, berlin, germany, bananas,
    # yellow (7); the answer uses paris and capital (louvre is not read) → 2/7
    assert context_precision(ANSWER, DOCS) == pytest.approx(2 / 7)
    assert evidence_noise(ANSWER, DOCS) == pytest.approx(5 / 7)  # the study's: 1 − it
    assert context_precision("Bananas are yellow.", DOCS[2:]) == 1.0
    assert context_precision(ANSWER, []) is None and evidence_noise(ANSWER, []) is None


def test_sentence_support_rate_counts_a_sentence_some_retrieved_chunk_supports() -> None:
    # the study's Eq. 14 with τ: sentence 1's best chunk 0.8 (d1), sentence 2's 0.6 (d1)
    assert sentence_support_rate(ANSWER, DOCS, fake_embed, 0.5) == 1.0
    assert sentence_support_rate(ANSWER, DOCS, fake_embed, 0.7) == 0.5
    assert sentence_support_rate(ANSWER, DOCS[1:], fake_embed, 0.5) == 0.0  # 0 and 0.3
    assert sentence_support_rate(ANSWER, [], fake_embed) is None


def test_sentence_support_rate_compares_whole_chunks_not_their_sentences() -> None:
    # one chunk of two sentences: each answer sentence matches one of them (cos 1), but the
    # chunk as a whole is as close to either as its own vector says
    chunk = Document(id="c", text="Paris is the capital. It has the Louvre.")
    vectors = {**VECTORS, chunk.as_context(): [0.6, 0.0, 0.8]}  # cos 0.6 / 0 with the two

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.array([vectors[t] for t in texts], dtype=np.float32)

    assert sentence_support_by_sentence(SupportMatrix.of(ANSWER, [chunk], embed), 0.5) == 1.0
    assert sentence_support_rate(ANSWER, [chunk], embed, 0.5) == 0.5


def test_sentence_context_precision_is_the_share_of_context_sentences_used() -> None:
    # context sentences supporting some answer sentence: d1 (0.8); d2 (0), d3 (0.3) unused
    assert sentence_context_precision(support(), 0.5) == pytest.approx(1 / 3)
    assert sentence_context_precision(support(), 0.9) == 0.0
    assert sentence_context_precision(SupportMatrix.of(ANSWER, [], fake_embed)) is None


def test_sentence_evidence_noise_is_the_share_of_context_off_the_question() -> None:
    # cosine to the question: d1 0.8, d2 0, d3 0 → two of three below 0.3
    assert sentence_evidence_noise(QUESTION, DOCS, fake_embed, 0.3) == pytest.approx(2 / 3)
    assert sentence_evidence_noise(QUESTION, DOCS[:1], fake_embed, 0.3) == 0.0
    assert sentence_evidence_noise(QUESTION, [], fake_embed) is None


def test_lexical_context_use_is_the_share_of_documents_sharing_a_content_token() -> None:
    assert lexical_context_use("Paris capital", DOCS) == pytest.approx(2 / 3)
    assert lexical_context_use("Paris", []) is None


def test_context_precision_gold() -> None:
    assert context_precision_gold(DOCS) == pytest.approx(1 / 3)
    assert context_precision_gold([Document(id="x", text="t")]) is None
    assert context_precision_gold([]) is None


def test_keyword_coverage_matches_whole_words_and_phrases() -> None:
    assert keyword_coverage("Paris", ["Paris", "France"]) == 0.5
    assert keyword_coverage("Paris is the capital of France.", ["capital of france"]) == 1.0
    assert keyword_coverage("It is Vitamin C.", ["vitamin c"]) == 1.0
    assert keyword_coverage("vitamin cc", ["vitamin c"]) == 0.0
    assert keyword_coverage("Paris", []) is None


def test_answer_quality_combines_similarity_and_keywords() -> None:
    # cos 0.6; the reference's content tokens paris, france: coverage 0.5 → 0.36 + 0.2
    assert answer_quality("Paris", "Paris, France", fake_embed) == pytest.approx(0.56)
    # the question's own keywords replace the reference's tokens: coverage 1 → 0.36 + 0.4
    assert answer_quality("Paris", "Paris, France", fake_embed, ["paris"]) == \
        pytest.approx(0.76)
    assert answer_quality("Paris", ["Paris, France", "Paris"], fake_embed) == \
        pytest.approx(1.0)  # the best alias counts
    assert answer_quality("", "Paris", fake_embed) == 0.0
    assert answer_quality("Paris", [], fake_embed) is None
    assert answer_quality("Paris", "Paris, France", fake_embed,
                          weights=QualityWeights(similarity=1, keywords=0)) == pytest.approx(0.6)


def test_taas_is_the_studys_eq_11() -> None:
    # r(q) = 0: AQS alone, grounding not applicable
    assert taas(0.6, retrieved=False, faithfulness=0.1, hallucination_rate=0.9) == 0.6
    # r(q) = 1: 0.4·AQS + 0.3·faithfulness + 0.3·(1 − hallucination rate)
    assert taas(0.6, True, faithfulness=0.8, hallucination_rate=0.2) == pytest.approx(0.72)
    assert dict(STUDY_TAAS_WEIGHTS) == {"quality": 0.4, "faithfulness": 0.3,
                                        "hallucination_control": 0.3}
    # nothing read (no faithfulness, no hallucination rate): AQS alone
    assert taas(0.6, True) == 0.6
    assert taas(None, True, faithfulness=0.8, hallucination_rate=0.2) is None
    # a call written for sentence_taas's positional terms fails at once
    with pytest.raises(TypeError):
        taas(0.6, True, 0.7, 1.0)  # type: ignore[misc]


# (AQS, faithfulness, TAAS) as the Auto-RAG study reports them (its Tables 3, 4, 9 and 10).
STUDY_ROWS = [(0.796, 0.809, 0.804), (0.851, 0.818, 0.831), (0.867, 0.795, 0.824),
              (0.857, 0.327, 0.539), (0.823, 0.788, 0.802), (0.834, 0.767, 0.794)]


@pytest.mark.parametrize(("quality", "faithful", "reported"), STUDY_ROWS)
def test_taas_reproduces_the_studys_rows(quality: float, faithful: float,
                                         reported: float) -> None:
    computed = taas(quality, True, faithfulness=faithful, hallucination_rate=1 - faithful)
    assert computed == pytest.approx(reported, abs=0.001)


def test_sentence_taas_switches_on_retrieval() -> None:
    # r(q) = 0: AQS alone, grounding not applicable
    assert sentence_taas(0.6, retrieved=False, similarity=0.1, support=0.1) == 0.6
    # r(q) = 1: 0.5·0.6 + 0.25·0.7 (sentence similarity) + 0.25·1 (sentence support) = 0.725
    assert sentence_taas(0.6, True, 0.7, 1.0) == pytest.approx(0.725)
    # a term undefined (no answer sentence) is left out, the weights renormalised
    assert sentence_taas(0.6, True, 0.7, None) == pytest.approx((0.3 + 0.175) / 0.75)
    assert sentence_taas(None, True, 0.7, 1.0) is None
    no_grounding = TAASWeights(quality=1, sentence_similarity=0, sentence_support=0)
    assert sentence_taas(0.6, True, 0.7, 1.0, no_grounding) == pytest.approx(0.6)
    with pytest.raises(ConfigError, match="trust.taas weights"):
        TAASWeights(quality=-1)
    with pytest.raises(ConfigError, match="trust.quality weights"):
        QualityWeights(similarity=0, keywords=0)


def test_trust_report_with_and_without_retrieval() -> None:
    report = trust_report(QUESTION, ANSWER, DOCS, ["Paris, France"], fake_embed,
                          keywords=["paris", "louvre"])
    assert report.retrieved is True
    # AQS: 0.6·0.48 + 0.4·(paris and louvre both said: 1.0) = 0.688
    assert report.answer_quality == pytest.approx(0.688)
    # paris and capital are read, louvre is not
    assert report.faithfulness == pytest.approx(2 / 3)
    assert report.hallucination_rate == pytest.approx(1 / 3)
    assert report.sentence_similarity == pytest.approx(0.7)
    assert report.sentence_support_by_sentence == 1.0
    assert report.unsupported_sentence_rate == 0.0
    assert report.sentence_support_rate == 1.0  # each sentence's best chunk: d1
    assert report.context_precision == pytest.approx(2 / 7)
    assert report.evidence_noise == pytest.approx(5 / 7)
    assert report.sentence_context_precision == pytest.approx(1 / 3)
    assert report.sentence_evidence_noise == pytest.approx(2 / 3)
    assert report.taas == pytest.approx(0.4 * 0.688 + 0.6 * 2 / 3)
    assert report.sentence_taas == pytest.approx(0.5 * 0.688 + 0.25 * 0.7 + 0.25 * 1.0)
    alone = trust_report(QUESTION, "Paris", [], ["Paris, France"], fake_embed)
    assert alone.retrieved is False and alone.answer_quality == pytest.approx(0.56)
    assert alone.taas == alone.sentence_taas == alone.answer_quality
    assert (alone.faithfulness, alone.hallucination_rate, alone.sentence_similarity,
            alone.sentence_support_rate, alone.sentence_support_by_sentence,
            alone.unsupported_sentence_rate, alone.context_precision, alone.evidence_noise,
            alone.sentence_context_precision, alone.sentence_evidence_noise,
            alone.lexical_context_use) == (None,) * 11
    no_encoder = trust_report(QUESTION, ANSWER, DOCS, ["Paris"], None)
    assert no_encoder.answer_quality is None and no_encoder.sentence_similarity is None
    assert no_encoder.faithfulness == pytest.approx(2 / 3)  # tokens need no encoder
    assert no_encoder.context_precision == pytest.approx(2 / 7)
    assert no_encoder.sentence_support_rate is None


def test_taas_weights_read_their_old_keys() -> None:
    config = TrustConfig(taas={"quality": 0.6, "faithfulness": 0.3, "grounding": 0.1})
    assert config.taas == TAASWeights(quality=0.6, sentence_similarity=0.3, sentence_support=0.1)


def test_trust_config_checks_its_thresholds() -> None:
    with pytest.raises(ConfigError, match="trust.noise_threshold"):
        TrustConfig(noise_threshold=2.0)
    with pytest.raises(ConfigError, match="trust.alignment_threshold"):
        TrustConfig(alignment_threshold=1.5)
