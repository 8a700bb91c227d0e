"""MCF's sentence stage by the priors (issue 53, `mcf.sentence_rule priors`): the fused score
of a chunk's sentences, the bar and the best kept, the narrowed chunk, and the rerank view's
key sentences, pruned text and spans. No model runs (a hashed bag-of-words encoder stands in
for the dense one)."""

from __future__ import annotations

import pytest
from fake_backend import ScriptedBackend
from fake_dense import fake_encoder

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.combination import _passage_priors
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.ranking import rank_by_filter
from sieverag.inference.filters.sentence_priors import (
    FIRST_SENTENCE_PRIOR,
    fused_sentence_scores,
    prior_key_sentences,
)

QUESTION = "Who designed the Eiffel Tower in Paris?"
TOWER = ("Paris is the capital of France. "
         "The Eiffel Tower in Paris was designed by the engineer Gustave Eiffel. "
         "Autumn brings rain and cooler days.")
RIVER = "The Seine flows through the city. Boats carry tourists along it."


@pytest.fixture
def bag_of_words_dense(monkeypatch):
    """The dense prior from `fake_encoder`, with the priors' cache emptied around the test."""
    from sieverag.inference.retrieval import dense

    monkeypatch.setattr(dense, "make_encoder", lambda config: fake_encoder)
    _passage_priors.cache_clear()
    yield
    _passage_priors.cache_clear()


def _ranked_priors(question, texts, model):
    """BM25 and dense both falling with the position in the round: text 0 best."""
    n = len(texts)
    return [float(n - i) for i in range(n)], [0.1 * (n - i) for i in range(n)]


def test_the_fused_score_is_z_bm25_plus_z_dense_plus_the_first_sentence_prior():
    calls = []

    def priors(question, texts, model):
        calls.append(list(texts))
        return _ranked_priors(question, texts, model)

    chunks = [["a.", "b.", "c.", "d."], ["e.", "f."], ["g."]]
    fused = fused_sentence_scores("q?", chunks, priors, "model", first_prior=0.5)
    assert calls == [["a.", "b.", "c.", "d.", "e.", "f.", "g."]]  # one call: IDF over the round
    z = 3 / 5 ** 0.5  # z of 4, 3, 2, 1 at the ends: ±1.342, ±0.447 between
    assert fused[0] == pytest.approx([2 * z + 0.5, 2 * z / 3, -2 * z / 3, -2 * z])
    assert fused[1] == pytest.approx([2.0 + 0.5, -2.0])
    assert fused[2] == [0.5]  # one sentence: z is 0
    default = fused_sentence_scores("q?", chunks, priors, "model")
    assert default[1] == pytest.approx([2.0 + FIRST_SENTENCE_PRIOR, -2.0])
    assert fused_sentence_scores("q?", [], priors, "model") == []


def test_the_bar_decides_and_the_best_is_kept_whatever_it():
    scores = [3.2, 0.9, -0.9, -2.7]
    assert prior_key_sentences(scores, 0.5, 1) == [0, 1]
    assert prior_key_sentences(scores, 1.0, 1) == [0]
    assert prior_key_sentences(scores, -1.0, 1) == [0, 1, 2]
    assert prior_key_sentences(scores, 10.0, 1) == [0]  # at least the best
    assert prior_key_sentences(scores, 10.0, 2) == [0, 1]
    assert prior_key_sentences(scores, 10.0, 0) == []
    assert prior_key_sentences([1.0, 2.0, 2.0], 10.0, 1) == [1]  # ties to the earlier


def test_the_sentence_that_answers_the_question_is_key(bag_of_words_dense):
    chunk = ScoredDocument(Document(id="t", text=TOWER, title="Eiffel Tower"), 1.0, True)
    backend = ScriptedBackend()
    mcf = MultiGranularFilter(backend, MCFConfig(sentence_stage=True, sentence_rule="priors",
                                                 sentence_bar=10.0))
    [narrowed] = mcf.sentence_stage(QUESTION, [chunk])
    assert narrowed.details["key_sentences"] == [1]
    assert narrowed.details["sentence_status"] == "parsed"
    assert narrowed.details["sentence_rule"] == "priors"
    assert len(narrowed.details["sentence_prior_scores"]) == 3
    assert narrowed.document.text == ("The Eiffel Tower in Paris was designed by the engineer "
                                      "Gustave Eiffel.")
    assert (narrowed.document.id, narrowed.document.title) == ("t", "Eiffel Tower")
    assert backend.calls == []  # the filter is not asked


def test_a_chunk_with_no_sentence_at_the_bar_is_whole_or_dropped(bag_of_words_dense):
    chunk = ScoredDocument(Document(id="t", text=TOWER), 1.0, True)
    none_kept = MCFConfig(sentence_stage=True, sentence_rule="priors", sentence_bar=10.0,
                          sentence_min_keep=0)
    [whole] = MultiGranularFilter(ScriptedBackend(), none_kept).sentence_stage(QUESTION,
                                                                               [chunk])
    assert whole.details["sentence_status"] == "none" and whole.document.text == TOWER
    dropping = MultiGranularFilter(ScriptedBackend(), MCFConfig(
        sentence_stage=True, sentence_rule="priors", sentence_bar=10.0, sentence_min_keep=0,
        empty_sentence_answer="drop_chunk"))
    result = dropping.narrow(QUESTION, FilterResult(kept=(chunk,), scored=(chunk,),
                                                    threshold=None))
    assert result.kept == () and result.scored[0].details["sentence_status"] == "none_dropped"
    low = MCFConfig(sentence_stage=True, sentence_rule="priors", sentence_bar=-10.0)
    [every] = MultiGranularFilter(ScriptedBackend(), low).sentence_stage(QUESTION, [chunk])
    assert every.details["key_sentences"] == [0, 1, 2]


def test_rerank_results_hold_the_priors_key_sentences_and_spans(bag_of_words_dense):
    backend = ScriptedBackend()
    config = MCFConfig(bar="top_k", top_k=1, sentence_stage=True, sentence_rule="priors",
                       sentence_bar=10.0)
    documents = [Document(id="0", text=RIVER), Document(id="1", text=TOWER)]
    river, tower = rank_by_filter(backend, config, QUESTION, documents)
    assert tower.kept and not river.kept
    answer = "The Eiffel Tower in Paris was designed by the engineer Gustave Eiffel."
    assert tower.key_sentences == (answer,) and tower.pruned_text == answer
    assert [TOWER[s.start:s.end] for s in tower.spans] == [
        "Paris is the capital of France.", answer, "Autumn brings rain and cooler days."]
    assert [s.kept for s in tower.spans] == [False, True, False]
    assert all(s.score is None for s in tower.spans)  # no filter scored a sentence
    assert river.key_sentences == () and river.pruned_text == ""
    assert not any(s.kept for s in river.spans)
    assert "filter_sentence" not in {agent for agent, _ in backend.calls}


def test_the_config_refuses_an_unknown_sentence_rule():
    assert MCFConfig().sentence_rule == "filter"
    with pytest.raises(ConfigError, match="sentence_rule"):
        MCFConfig(sentence_rule="oracle")
