"""Answer metrics (EM, token F1, accuracy, multiple choice, ASQA's STR-EM / STR-Hit and
ROUGE-L) and filter precision / recall / F1.

Answer metrics compare a prediction with a list of gold aliases and keep the best alias,
after `normalize_answer`. Each metric's definition is in its docstring.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import cache
from typing import TypedDict

from rouge_score import rouge_scorer

from sieverag.inference.retrieval.sentences import split_sentences

_ASCII_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

# A leading choice label: "B", "(B)", "[B]", "B.", "B)", "B:", optionally after "answer:",
# "the answer is", "option", "choice"; the label ends at the end of the text, whitespace or
# one of . : , ) ]
_ANSWER_PREFIX = re.compile(
    r"^\s*(?:the\s+)?(?:correct\s+)?(?:answer|option|choice)\b(?:\s+is)?\s*[:\-]?\s*",
    re.IGNORECASE,
)
_LEADING_LABEL = re.compile(
    r"^\s*(?P<open>[(\[])?\s*(?P<label>[A-Za-z0-9]+)\s*(?P<close>[)\].:,])?(?=\s|$)"
)


class FilterScores(TypedDict):
    """Precision, recall and F1 of a filter's kept items against the gold items."""

    precision: float
    recall: float
    f1: float


def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation, made Unicode-aware.

    Steps: Unicode NFKC, lower case (`casefold`), remove punctuation, remove the articles
    a / an / the, collapse whitespace. On ASCII text this is exactly the official script's
    `normalize_answer`.

    Why the Unicode steps: models and datasets write the same answer with different code
    points (full-width digits, the "ﬁ" ligature, non-breaking spaces, "²"), which NFKC folds
    to one form, and `casefold` matches cases `lower` misses ("Straße" / "STRASSE").
    Punctuation is the ASCII set of the official script plus every Unicode punctuation
    character (curly quotes, dashes, "¿"), so "Fat Larry’s Band" and "Fat Larry's Band"
    agree. Accents are kept: "Röntgen" and "Rontgen" still differ.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(char for char in text if not _is_punctuation(char))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _aliases(answers: str | Sequence[str]) -> Sequence[str]:
    """The gold aliases; a bare string is one alias, not a sequence of characters."""
    aliases = (answers,) if isinstance(answers, str) else answers
    if not aliases:
        raise ValueError("answers is empty: a metric needs at least one gold answer")
    return aliases


def _best_over_aliases(
    score: Callable[[str, str], float], prediction: str, answers: str | Sequence[str]
) -> float:
    return max(score(prediction, alias) for alias in _aliases(answers))


def _exact_match_one(prediction: str, alias: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(alias))


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
    """Exact match (EM), as in SQuAD v1.1.

    1.0 when the normalised prediction equals some normalised gold alias, else 0.0.
    `answers` is a sequence of aliases (a bare string counts as one); raises ValueError when
    it is empty.
    """
    return _best_over_aliases(_exact_match_one, prediction, answers)


def _token_f1_one(prediction: str, alias: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    alias_tokens = normalize_answer(alias).split()
    overlap = sum((Counter(prediction_tokens) & Counter(alias_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(alias_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: str | Sequence[str]) -> float:
    """Token F1, as in SQuAD v1.1, maximised over the gold aliases.

    Tokens are the whitespace-split words of the normalised texts. For one alias, with
    `common` = the multiset intersection of prediction and alias tokens:
    precision = |common| / |prediction tokens|, recall = |common| / |alias tokens|,
    F1 = 2PR / (P + R), and 0.0 when nothing is in common (so also when either side
    normalises to nothing). Raises ValueError when `answers` is empty.
    """
    return _best_over_aliases(_token_f1_one, prediction, answers)


def _accuracy_one(prediction: str, alias: str) -> float:
    normalized_alias = normalize_answer(alias)
    if not normalized_alias:
        return 0.0
    return float(f" {normalized_alias} " in f" {normalize_answer(prediction)} ")


def answer_accuracy(prediction: str, answers: str | Sequence[str]) -> float:
    """Accuracy ("any gold alias contained in the prediction", as Self-RAG and FILCO use).

    1.0 when some normalised alias occurs in the normalised prediction on word boundaries,
    i.e. as a run of whole words: "1961" does not count "961", "the answer is paris" counts
    "Paris". (The published scripts test a raw substring; word boundaries avoid crediting
    short aliases inside longer words.) An alias that normalises to nothing ("", "the")
    never matches. Raises ValueError when `answers` is empty.
    """
    return _best_over_aliases(_accuracy_one, prediction, answers)


def asqa_string_scores(prediction: str, short_answers: Sequence[Sequence[str]]
                       ) -> tuple[float, float]:
    """ASQA's STR-EM and STR-Hit as ALCE computes them: over the question's disambiguations
    (each given by its short answers), the share whose answer the prediction contains
    (`answer_accuracy`'s rule), and 1.0 when it contains all of them. Disambiguations without
    a short answer are left out; raises ValueError when none is left."""
    answered = [answers for answers in short_answers if answers]
    if not answered:
        raise ValueError("ASQA scores need at least one disambiguation with a short answer")
    present = [answer_accuracy(prediction, answers) for answers in answered]
    str_em = sum(present) / len(present)
    return str_em, float(str_em == 1.0)


@cache
def _rouge_lsum() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)


def asqa_rouge_l(prediction: str, long_answers: Sequence[str]) -> float:
    """ASQA's ROUGE-L as ALCE computes it: the ROUGE-Lsum F-measure (`rouge-score`, Porter
    stemming, one sentence a line) of the prediction against each annotator's long answer,
    the best one kept. In [0, 1] (ALCE prints it ×100). Empty long answers are left out;
    raises ValueError when none is left. An empty prediction scores 0.0."""
    references = [answer for answer in long_answers if answer.strip()]
    if not references:
        raise ValueError("ASQA's ROUGE-L needs at least one non-empty long answer")
    hypothesis = "\n".join(split_sentences(prediction))
    return max(float(_rouge_lsum().score("\n".join(split_sentences(reference)), hypothesis)
               ["rougeLsum"].fmeasure) for reference in references)


def extract_choice(prediction: str, choices: Mapping[str, str]) -> str | None:
    """The label of the choice a prediction names, or None when it names none (or several).

    In order:
    1. the whole normalised prediction equals a choice's normalised text → that choice;
    2. a leading label, optionally after "answer:", "the answer is", "option" or "choice":
       "B", "(B)", "[B]", "B.", "B)", "B:", "B, ...". The label matches case-sensitively,
       or case-insensitively when bracketed, followed by punctuation or alone ("(b)", "b.",
       "b"). A bare label followed by more words ("A rock forms") only counts after such a
       prefix, since "A" and "I" are also words;
    3. the prediction contains exactly one choice's normalised text on word boundaries
       (ignoring choices whose text lies inside another matching choice's text).
    """
    normalized = normalize_answer(prediction)
    texts = {label: normalize_answer(text) for label, text in choices.items()}
    for label, text in texts.items():
        if normalized and normalized == text:
            return label
    label = _leading_label(prediction, choices)
    if label is not None:
        return label
    found = {
        label: text for label, text in texts.items() if text and f" {text} " in f" {normalized} "
    }
    maximal = [
        label
        for label, text in found.items()
        if not any(text != other and f" {text} " in f" {other} " for other in found.values())
    ]
    return maximal[0] if len(maximal) == 1 else None


def _leading_label(prediction: str, choices: Mapping[str, str]) -> str | None:
    prefix = _ANSWER_PREFIX.match(prediction)
    rest = prediction[prefix.end() :] if prefix else prediction
    match = _LEADING_LABEL.match(rest)
    if match is None:
        return None
    token = match["label"]
    marked = bool(match["open"] or match["close"])
    alone = not rest[match.end() :].strip()
    if not (marked or alone or prefix):
        return None
    if token in choices:
        return token
    folded = {label.casefold(): label for label in choices}
    return folded.get(token.casefold())


def choice_accuracy(prediction: str, choices: Mapping[str, str], answer_key: str) -> float:
    """Multiple-choice accuracy: 1.0 when `extract_choice` finds the `answer_key` choice.

    `choices` maps label → text (as `Example.choices`); a prediction naming no choice, or
    several, scores 0.0.
    """
    return float(extract_choice(prediction, choices) == answer_key)


def filter_scores(
    kept_ids: Iterable[Hashable], gold_ids: Iterable[Hashable]
) -> FilterScores | None:
    """Precision, recall and F1 of the items a filter kept against the gold items.

    Items are compared as sets of ids: document ids for chunk-level filtering, sentence
    indices for sentence-level filtering (against `Document.supporting_sentences`).
    precision = |kept ∩ gold| / |kept|, recall = |kept ∩ gold| / |gold|,
    F1 = 2PR / (P + R) (0.0 when P + R = 0).

    Conventions for empty sets:
    - no gold items → None: recall is undefined, so the example is left out of averages
      (pass only examples whose gold is marked);
    - gold items but nothing kept → precision 0.0 (and recall 0.0, F1 0.0), so dropping
      everything never scores a perfect precision.
    """
    gold = set(gold_ids)
    if not gold:
        return None
    kept = set(kept_ids)
    hits = len(kept & gold)
    precision = hits / len(kept) if kept else 0.0
    recall = hits / len(gold)
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return FilterScores(precision=precision, recall=recall, f1=f1)
