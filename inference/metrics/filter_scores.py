"""How well a filter's decisions match the gold: passages kept (precision, recall, F1, macro
and micro), passage scores ranked (AUROC, average precision), passage probabilities
calibrated (expected calibration error), and key sentences kept against supporting facts.
`sieverag eval-filter` (training/evaluation/filter_eval.py) reports these figures."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence

from sieverag.inference.core.types import Example
from sieverag.inference.metrics.answer_scores import filter_scores


def chunk_quality(examples: Sequence[Example], kept: Mapping[str, Iterable[str]],
                  scores: Mapping[str, float] | None,
                  probabilities: Mapping[str, float] | None = None
                  ) -> dict[str, float | None]:
    """Chunk-level figures of one method — the passage ids it kept per question id, and its
    score per passage id where it scores — against the gold passages.

    precision / recall / f1: `filter_scores` per question, averaged over questions;
    micro_*: the same counts pooled over every passage of every question;
    kept_per_question: mean number of passages kept;
    auroc: area under the ROC curve of the method's score over all passages (gold = positive),
    average_precision: area under its precision–recall curve (None without a score);
    ece: `calibration_error` of the method's P(relevant) over the passages that have one
    (None without any); calibrated_share: the share of passages that have one (MCF gives none
    on a round it does not call calibrated; None for a method without probabilities).
    """
    result = decision_quality([(set(kept[e.id]), {d.id for d in e.documents if d.is_gold})
                               for e in examples])
    result.update(ranking_quality(examples, scores))
    passages = [d for e in examples for d in e.documents]
    given = [d for d in passages if probabilities is not None and d.id in probabilities]
    result["ece"] = None if probabilities is None else calibration_error(
        [bool(d.is_gold) for d in given], [probabilities[d.id] for d in given])
    result["calibrated_share"] = (None if probabilities is None
                                  else len(given) / max(len(passages), 1))
    return result


def calibration_error(labels: Sequence[bool], probabilities: Sequence[float],
                      bins: int = 10) -> float | None:
    """Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017): the
    probabilities cut into `bins` equal-width bins over [0, 1]; the mean over bins, weighted by
    each bin's share of the passages, of |share relevant − mean probability|. 0 is perfectly
    calibrated. None without passages."""
    if not probabilities:
        return None
    totals = [[0, 0.0, 0.0] for _ in range(bins)]  # count, relevant, probability sum
    for label, probability in zip(labels, probabilities, strict=True):
        cell = totals[min(int(probability * bins), bins - 1)]
        cell[0] += 1
        cell[1] += bool(label)
        cell[2] += probability
    return sum(abs(relevant - total) for count, relevant, total in totals
               if count) / len(probabilities)


def ranking_quality(examples: Sequence[Example], scores: Mapping[str, float] | None
                    ) -> dict[str, float | None]:
    """AUROC and average precision of passage scores against gold (None when undefined)."""
    from sklearn.metrics import average_precision_score

    if scores is None:
        return {"auroc": None, "average_precision": None}
    labels = [bool(d.is_gold) for e in examples for d in e.documents]
    values = [scores[d.id] for e in examples for d in e.documents]
    if all(labels) or not any(labels):
        return {"auroc": None, "average_precision": None}
    return {"auroc": auroc(labels, values),
            "average_precision": float(average_precision_score(labels, values))}


def auroc(labels: Sequence[bool], values: Sequence[float]) -> float | None:
    """Area under the ROC curve of `values` against `labels` (True = relevant): the chance
    that a relevant passage outscores an irrelevant one (ties count half). None unless both
    classes occur."""
    from sklearn.metrics import roc_auc_score

    if all(labels) or not any(labels):
        return None
    return float(roc_auc_score(labels, values))


def sentence_quality(examples: Sequence[Example],
                     kept: Mapping[str, Iterable[tuple[str, int]]]) -> dict[str, float | None]:
    """Sentence-level figures: kept (passage id, sentence index) pairs against supporting facts.

    precision / recall / f1 per question (`filter_scores`), averaged over questions; micro_*
    pooled; kept_per_question: mean sentences kept.
    """
    return decision_quality([(set(kept[e.id]), supporting_facts(e)) for e in examples])


def supporting_facts(example: Example) -> set[tuple[str, int]]:
    """The question's gold (passage id, sentence index) pairs."""
    return {(d.id, i) for d in example.documents for i in (d.supporting_sentences or ())}


def has_supporting_facts(example: Example) -> bool:
    """True when the row carries sentence-level gold and every passage has its sentences."""
    return (any(d.supporting_sentences for d in example.documents)
            and all(d.sentences for d in example.documents))


def decision_quality(questions: Sequence[tuple[set, set]]) -> dict[str, float | None]:
    """Figures of what was kept against the gold, given (kept, gold) per question: precision,
    recall and F1 per question (`filter_scores`, questions without gold left out) averaged
    over questions; micro_* the same counts pooled; kept_per_question."""
    per_question = [f for f in (filter_scores(kept, gold) for kept, gold in questions)
                    if f is not None]
    result = _averaged(per_question)
    result.update(_micro(sum(len(kept & gold) for kept, gold in questions),
                         sum(len(kept) for kept, _ in questions),
                         sum(len(gold) for _, gold in questions)))
    result["kept_per_question"] = (statistics.fmean(len(kept) for kept, _ in questions)
                                   if questions else 0.0)
    return result


def top_k_indices(values: Sequence[float], k: int) -> list[int]:
    """The positions of the k highest values, best first (ties: the earlier position): what a
    top-k baseline keeps."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]


def paired_f1_difference(questions_a: Sequence[tuple[set, set]],
                         questions_b: Sequence[tuple[set, set]], *, resamples: int = 2000,
                         seed: int = 0) -> dict[str, object] | None:
    """Method a's per-question F1 minus method b's on the same questions, given each method's
    (kept, gold) per question in the same order (questions without gold left out): the mean
    difference, its 95 % paired bootstrap interval (the 2.5th and 97.5th percentiles of
    `resamples` means of questions drawn with replacement), and the questions a wins and
    loses. None when no question has gold."""
    differences = []
    for (kept_a, gold), (kept_b, gold_b) in zip(questions_a, questions_b, strict=True):
        if gold != gold_b:
            raise ValueError("paired_f1_difference needs the same questions in the same order")
        a, b = filter_scores(kept_a, gold), filter_scores(kept_b, gold)
        if a is not None and b is not None:
            differences.append(a["f1"] - b["f1"])
    if not differences:
        return None
    rng = random.Random(seed)
    count = len(differences)
    means = sorted(statistics.fmean(rng.choices(differences, k=count))
                   for _ in range(resamples))
    return {"difference": statistics.fmean(differences),
            "interval95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]],
            "wins": sum(d > 0 for d in differences), "losses": sum(d < 0 for d in differences),
            "questions": count}


def _averaged(per_question: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    if not per_question:
        return {"precision": None, "recall": None, "f1": None}
    return {key: statistics.fmean(s[key] for s in per_question)
            for key in ("precision", "recall", "f1")}


def _micro(hits: int, kept: int, gold: int) -> dict[str, float]:
    precision = hits / kept if kept else 0.0
    recall = hits / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {"micro_precision": precision, "micro_recall": recall, "micro_f1": f1}
