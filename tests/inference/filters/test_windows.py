"""Long documents read window by window (inference/filters/windows.py), as MCF reads every
round: windows of whole sentences within the filter's budget (a sentence too long cut at
token boundaries), the ones retrieval ranks best read, the document judged by its best window
as if that window had been sent alone, spans mapped back to the whole document, and a blank
document scored 0 without being read."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card import combination
from sieverag.inference.filters.card.combination import Combination, card_combination
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.ranking import as_documents, rank_by_filter
from sieverag.inference.filters.windows import (
    DEFAULT_WINDOW_TOKENS,
    WindowRule,
    card_window_tokens,
    windows_read,
    word_piece_offsets,
)
from sieverag.inference.retrieval.sentences import sentence_spans

QUESTION = "Where was Liora Tamsin born?"
FILLER = [f"Filler sentence number {i} says little." for i in range(10)]
ANSWER = "Liora Tamsin was born in Quorrin."
LONG = " ".join(FILLER[:5] + [ANSWER] + FILLER[5:])
# A combination that reads the filter's score and the priors, fitted-looking.
READS_ALL = Combination(weights={"filter_log_odds": 1.0, "filter_z": 0.5, "bm25_z": 0.5,
                                 "dense": 1.0, "dense_z": 0.25}, bias=-0.5, fitted=True)


def word_overlap_priors(question: str, texts: Sequence[str], model: str
                        ) -> tuple[list[float], list[float]]:
    """Deterministic priors: BM25 and dense stand-ins, the question's words each text holds."""
    words = {w.strip("?.").lower() for w in question.split()}
    overlap = [float(sum(w.strip(".").lower() in words for w in t.split())) for t in texts]
    return overlap, [v / 10 for v in overlap]


def answer_scorer() -> ScriptedBackend:
    """The filter finds a text holding "Quorrin" relevant, others not."""
    return ScriptedBackend(labels=lambda text: {"Yes": 2.0 if "Quorrin" in text else -3.0,
                                                "No": 0.0})


def tokens(text: str) -> int:
    return len(word_piece_offsets(text)[0])


# ----- windows -----

def test_windows_hold_whole_sentences_within_the_budget() -> None:
    rule = WindowRule(window_tokens=14, max_windows=4)
    windows = rule.windows(LONG)
    sentences = sentence_spans(LONG)
    assert len(windows) > 1
    assert [unit for w in windows for unit in w.units] == sentences  # in order, each once
    for window in windows:
        assert window.tokens == tokens(LONG[window.start:window.end]) <= 14


def test_a_sentence_longer_than_a_window_is_cut_at_token_boundaries() -> None:
    text = "word " * 50 + "end."
    units = WindowRule(window_tokens=8, max_windows=4).units(text)
    assert [n for _, _, n in units] == [8] * 6 + [4]
    pieces = [text[s:e] for s, e, _ in units]
    assert " ".join(pieces) == text.strip() and all(p == p.strip() for p in pieces)


def test_a_document_that_fits_is_one_window_as_sent_and_a_blank_one_none() -> None:
    rule = WindowRule(window_tokens=DEFAULT_WINDOW_TOKENS, max_windows=4)
    (window,) = rule.windows("  A short passage. Two sentences.\n")
    assert (window.start, window.end) == (0, len("  A short passage. Two sentences.\n"))
    assert rule.windows("") == [] and rule.windows(" \n\t ") == []


def test_a_cut_keeps_the_first_or_the_last_window() -> None:
    rule = WindowRule(window_tokens=5, max_windows=4)
    assert rule.cut("one two three four five six seven") == "one two three four five"
    assert rule.cut("one two three four five six seven", "end") == "three four five six seven"
    assert rule.cut("one two") == "one two"


def test_the_window_comes_from_the_card() -> None:
    assert card_window_tokens({"dataset": {"record_tokens": {"max": 180}},
                               "recipe": {"training": {"max_length": 256}}}) == 180
    assert card_window_tokens({"recipe": {"training": {"max_length": 300}}}) == 300
    assert card_window_tokens({}) == card_window_tokens(None) == DEFAULT_WINDOW_TOKENS
    card = {"recipe": {"training": {"max_length": 128}}}
    assert card_combination(card).window_tokens == 128
    assert card_combination(None).window_tokens == DEFAULT_WINDOW_TOKENS


def test_the_windows_read_are_those_retrieval_ranks_best() -> None:
    texts = [f"Nothing here, part {i}." for i in range(9)]
    texts[6] = "Liora Tamsin was born there."
    texts[2] = "Tamsin once."
    assert windows_read(QUESTION, texts, 2, word_overlap_priors, "unused") == [2, 6]
    assert windows_read(QUESTION, texts[:2], 2, word_overlap_priors, "unused") == [0, 1]


@pytest.mark.parametrize("max_windows", [0, -1])
def test_max_windows_per_doc_is_checked(max_windows: int) -> None:
    with pytest.raises(Exception, match="max_windows_per_doc must be >= 1"):
        MCFConfig(max_windows_per_doc=max_windows)


# ----- MCF -----

def test_a_long_document_is_judged_by_its_best_window_as_if_sent_alone() -> None:
    config = MCFConfig(window_tokens=14, max_windows_per_doc=2)
    backend = answer_scorer()
    mcf = MultiGranularFilter(backend, config, READS_ALL, priors=word_overlap_priors)
    other = Document(id="other", text="Penguins huddle together in winter.")
    result = mcf.select(QUESTION, [Document(id="long", text=LONG), other])
    judged = result.scored[0]
    start, end = judged.details["window"]
    window = LONG[start:end]
    assert ANSWER in window and judged.details["windows_read"] == 2
    assert judged.details["windows"] == len(WindowRule(14, 2).windows(LONG))
    # The filter read two windows of the long document and the other document, no more.
    assert len([1 for agent, _ in backend.calls if agent == "filter_chunk"]) == 3
    alone = MultiGranularFilter(answer_scorer(), config, READS_ALL,
                                priors=word_overlap_priors).select(
        QUESTION, [Document(id="long", text=window), other])
    assert judged.details["p_relevant"] == pytest.approx(
        alone.scored[0].details["p_relevant"], abs=1e-9)
    assert judged.score == pytest.approx(alone.scored[0].score, abs=1e-9)
    assert [s.document.id for s in result.kept] == [s.document.id for s in alone.kept]


def test_a_blank_document_is_not_read_and_scores_zero() -> None:
    backend = answer_scorer()
    mcf = MultiGranularFilter(backend, MCFConfig(min_keep=0), READS_ALL,
                              priors=word_overlap_priors)
    result = mcf.select(QUESTION, [Document(id="blank", text="  \n "),
                                   Document(id="answer", text=ANSWER)])
    blank, answer = result.scored
    assert (blank.kept, blank.score, blank.details["p_relevant"]) == (False, 0.0, 0.0)
    assert blank.details["windows"] == 0 and answer.kept
    assert len(backend.calls) == 1 and "Quorrin" in backend.calls[0][1]  # the blank unread
    every_blank = mcf.select(QUESTION, [Document(id="a", text=""), Document(id="b", text=" ")])
    assert [s.kept for s in every_blank.scored] == [False, False] and not every_blank.kept


def test_spans_of_a_windowed_document_are_offsets_into_the_whole_document(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combination, "_passage_priors", lambda q, texts, model:
                        tuple(map(tuple, word_overlap_priors(q, texts, model))))
    backend = ScriptedBackend(reply=lambda text: "2",
                              labels=lambda text: {"Yes": 2.0 if "Quorrin" in text else -3.0,
                                                   "No": 0.0})
    config = MCFConfig(window_tokens=14, max_windows_per_doc=2, sentence_stage=True)
    (ranked,) = rank_by_filter(backend, config, QUESTION, as_documents([LONG]), READS_ALL)
    assert ranked.kept and ranked.spans is not None
    assert [(s.start, s.end) for s in ranked.spans] == sentence_spans(LONG)
    (key,) = [s for s in ranked.spans if s.kept]
    # The best window is FILLER[4] and ANSWER; the filter named its second sentence.
    assert LONG[key.start:key.end] == ranked.pruned_text == ranked.key_sentences[0] == ANSWER
