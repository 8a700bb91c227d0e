"""QA metrics against the official SQuAD v1.1 definitions and hand-computed cases."""

from __future__ import annotations

import pytest

from sieverag.inference.metrics.answer_scores import (
    answer_accuracy,
    asqa_rouge_l,
    asqa_string_scores,
    choice_accuracy,
    exact_match,
    extract_choice,
    filter_scores,
    normalize_answer,
    token_f1,
)

ARC_CHOICES = {
    "A": "Planetary density will decrease.",
    "B": "Planetary years will become longer.",
    "C": "Planetary days will become shorter.",
    "D": "Planetary gravity will become stronger.",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Cat!", "cat"),
        ("the Denver Broncos", "denver broncos"),
        ("An apple, a day.", "apple day"),
        ("  Santa Clara,\tCalifornia ", "santa clara california"),
        ("theory of an atheist", "theory of atheist"),  # articles only as whole words
        ("Levi's Stadium", "levis stadium"),
        ("$1,000 (approx.)", "1000 approx"),  # ASCII punctuation as in the official script
        ("", ""),
    ],
)
def test_normalize_answer_official_cases(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_normalize_answer_unicode() -> None:
    assert normalize_answer("ＡＢＣ　１２３") == "abc 123"  # full width → ASCII (NFKC)
    assert normalize_answer("ﬁve\u00a0ﬂies") == "five flies"  # ligatures, no-break space
    assert normalize_answer("Fat Larry’s Band") == normalize_answer("Fat Larry's Band")
    assert normalize_answer("«Straße» – ¿qué?") == "strasse qué"
    assert normalize_answer("Röntgen") != normalize_answer("Rontgen")  # accents stay


def test_exact_match() -> None:
    assert exact_match("the Denver Broncos.", ["Denver Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0
    assert exact_match("Carolina Panthers", ["Denver Broncos", "carolina panthers"]) == 1.0
    assert exact_match("Paris", "Paris") == 1.0  # a bare string is one alias


def test_token_f1_by_hand() -> None:
    # prediction tokens [santa, clara], gold [santa, clara, california]: P=1, R=2/3, F1=0.8
    assert token_f1("Santa Clara", ["Santa Clara, California"]) == pytest.approx(0.8)
    # [levis, stadium, in, bay, area] vs [levis, stadium]: P=2/5, R=1 → F1 = 0.8/1.4 = 4/7
    assert token_f1("Levi's Stadium in the Bay Area", ["Levi's Stadium"]) == pytest.approx(4 / 7)
    assert token_f1("nothing shared", ["Denver Broncos"]) == 0.0
    assert token_f1("Denver Broncos", ["Denver Broncos"]) == 1.0


def test_token_f1_counts_repeated_tokens_once_per_occurrence() -> None:
    # [new, new, york] vs [new, york]: common = {new: 1, york: 1}; P = 2/3, R = 1 → 0.8
    assert token_f1("new new york", ["New York"]) == pytest.approx(0.8)


def test_token_f1_takes_the_best_alias() -> None:
    answers = ["Santa Clara, California", "Levi's Stadium"]
    assert token_f1("Levi's Stadium", answers) == 1.0
    assert token_f1("Santa Clara", answers) == pytest.approx(0.8)


def test_token_f1_empty_after_normalisation_scores_zero() -> None:
    # As in the official script: no common token → 0, even when both sides are empty.
    assert token_f1("the", ["a"]) == 0.0
    assert exact_match("the", ["a"]) == 1.0


def test_metrics_refuse_empty_answers() -> None:
    for metric in (exact_match, token_f1, answer_accuracy):
        with pytest.raises(ValueError, match="answers is empty"):
            metric("x", [])


def test_answer_accuracy() -> None:
    assert answer_accuracy("I believe the answer is Paris.", ["Paris"]) == 1.0
    assert answer_accuracy("It was Yuri Gagarin, in 1961", ["Gagarin", "Yuri"]) == 1.0
    assert answer_accuracy("London", ["Paris", "City of Light"]) == 0.0
    # On word boundaries: "961" inside "1961" and "pol" inside "politics" do not count.
    assert answer_accuracy("in 1961", ["961"]) == 0.0
    assert answer_accuracy("he went into politics", ["pol"]) == 0.0
    # An alias that normalises to nothing never matches.
    assert answer_accuracy("anything", ["", "the", "!"]) == 0.0
    assert answer_accuracy("", ["the"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "label"),
    [
        ("C", "C"),
        ("(C)", "C"),
        ("C.", "C"),
        ("[C]", "C"),
        ("c", "C"),
        ("(c)", "C"),
        ("C) Planetary days will become shorter.", "C"),
        ("C: because days shorten", "C"),
        ("The answer is C", "C"),
        ("Answer: (c)", "C"),
        ("The correct answer is B because orbits change.", "B"),
        ("Planetary days will become shorter.", "C"),
        ("planetary days will become shorter", "C"),
        ("I think planetary gravity will become stronger here.", "D"),
        ("A rock forms", None),  # "A" is a word here, not a label
        ("E", None),
        ("I am not sure", None),
        ("Answering this needs care", None),
        ("", None),
    ],
)
def test_extract_choice(prediction: str, label: str | None) -> None:
    assert extract_choice(prediction, ARC_CHOICES) == label


def test_asqa_string_scores_by_hand() -> None:
    """STR-EM: the share of disambiguations with a short answer in the prediction (any of
    its aliases, whole words); STR-Hit: all of them; a pair without answers is left out."""
    pairs = [["Cammie King"], ["Eleanore Cammack King", "Cammie"], ["Vivien Leigh"], []]
    assert asqa_string_scores("Bonnie was played by Cammie King.", pairs) == (2 / 3, 0.0)
    assert asqa_string_scores("Cammie King; Vivien Leigh", pairs) == (1.0, 1.0)
    assert asqa_string_scores("Cammies", pairs) == (0.0, 0.0)  # whole words only
    with pytest.raises(ValueError, match="short answer"):
        asqa_string_scores("x", [[], []])


def test_asqa_rouge_l_by_hand() -> None:
    """ROUGE-Lsum F against the best long answer: "the cat sat" against "the cat sat on the
    mat" has LCS 3, P = 3/3, R = 3/6, F = 2/3; stemming counts "sitting" as "sit"; empty long
    answers are left out."""
    long_answers = ["The cat sat on the mat.", "A dog ran.", " "]
    assert asqa_rouge_l("The cat sat.", long_answers) == pytest.approx(2 / 3)
    assert asqa_rouge_l("A dog ran.", long_answers) == pytest.approx(1.0)
    assert asqa_rouge_l("Dogs running", ["the dog runs"]) == pytest.approx(2 * 2 / 5)
    assert asqa_rouge_l("", long_answers) == 0.0
    with pytest.raises(ValueError, match="long answer"):
        asqa_rouge_l("x", ["", "  "])


def test_extract_choice_prefers_the_longest_contained_choice_and_refuses_ties() -> None:
    choices = {"1": "red", "2": "red and blue", "3": "green"}
    assert extract_choice("it is red and blue", choices) == "2"
    assert extract_choice("red or green", choices) is None
    assert extract_choice("2", choices) == "2"


def test_choice_accuracy() -> None:
    assert choice_accuracy("(C)", ARC_CHOICES, "C") == 1.0
    assert choice_accuracy("B", ARC_CHOICES, "C") == 0.0
    assert choice_accuracy("no idea", ARC_CHOICES, "C") == 0.0


def test_filter_scores_by_hand() -> None:
    scores = filter_scores(["d1", "d2", "d3"], ["d2", "d4"])
    assert scores is not None
    assert scores["precision"] == pytest.approx(1 / 3)
    assert scores["recall"] == pytest.approx(1 / 2)
    assert scores["f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert filter_scores(["a", "b"], ["b", "a"]) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


def test_filter_scores_on_sentence_indices() -> None:
    assert filter_scores([0, 2], (0, 1)) == {"precision": 0.5, "recall": 0.5, "f1": 0.5}


def test_filter_scores_empty_conventions() -> None:
    assert filter_scores([], ["g"]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert filter_scores(["x"], ["g"]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert filter_scores(["x"], []) is None
    assert filter_scores([], []) is None
