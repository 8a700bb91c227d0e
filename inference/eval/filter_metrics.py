"""How well a filter's decisions match the gold: passages kept (precision, recall, F1, macro
and micro), passage scores ranked (AUROC, average precision), and key sentences kept against
supporting facts. `sieverag eval-filter` (training/filter_eval.py) reports these figures."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from sieverag.inference.eval.metrics import filter_scores
from sieverag.inference.types import Example


def chunk_quality(examples: Sequence[Example], kept: Mapping[str, Iterable[str]],
                  scores: Mapping[str, float] | None) -> dict[str, float | None]:
    """Chunk-level figures of one method — the passage ids it kept per question id, and its
    score per passage id where it scores — against the gold passages.

    precision / recall / f1: `filter_scores` per question, averaged over questions;
    micro_*: the same counts pooled over every passage of every question;
    kept_per_question: mean number of passages kept;
    auroc: area under the ROC curve of the method's score over all passages (gold = positive),
    average_precision: area under its precision–recall curve (None without a score).
    """
    per_question = []
    hits = kept_total = gold_total = 0
    for example in examples:
        chosen = set(kept[example.id])
        gold = {d.id for d in example.documents if d.is_gold}
        figures = filter_scores(chosen, gold)
        if figures is not None:
            per_question.append(figures)
        hits += len(chosen & gold)
        kept_total += len(chosen)
        gold_total += len(gold)
    result = _averaged(per_question)
    result.update(_micro(hits, kept_total, gold_total))
    result["kept_per_question"] = statistics.fmean(len(set(kept[e.id])) for e in examples)
    result.update(ranking_quality(examples, scores))
    return result


def ranking_quality(examples: Sequence[Example], scores: Mapping[str, float] | None
                    ) -> dict[str, float | None]:
    """AUROC and average precision of passage scores against gold (None when undefined)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    if scores is None:
        return {"auroc": None, "average_precision": None}
    labels = [bool(d.is_gold) for e in examples for d in e.documents]
    values = [scores[d.id] for e in examples for d in e.documents]
    if all(labels) or not any(labels):
        return {"auroc": None, "average_precision": None}
    return {"auroc": float(roc_auc_score(labels, values)),
            "average_precision": float(average_precision_score(labels, values))}


def sentence_quality(examples: Sequence[Example],
                     kept: Mapping[str, Iterable[tuple[str, int]]]) -> dict[str, float]:
    """Sentence-level figures: kept (passage id, sentence index) pairs against supporting facts.

    precision / recall / f1 per question (`filter_scores`), averaged over questions; micro_*
    pooled; kept_per_question: mean sentences kept.
    """
    per_question = []
    hits = kept_total = gold_total = 0
    sizes = []
    for example in examples:
        chosen = set(kept[example.id])
        gold = supporting_facts(example)
        scores = filter_scores(chosen, gold)
        if scores is not None:
            per_question.append(scores)
        hits += len(chosen & gold)
        kept_total += len(chosen)
        gold_total += len(gold)
        sizes.append(len(chosen))
    result = _averaged(per_question)
    result.update(_micro(hits, kept_total, gold_total))
    result["kept_per_question"] = statistics.fmean(sizes) if sizes else 0.0
    return result


def supporting_facts(example: Example) -> set[tuple[str, int]]:
    """The question's gold (passage id, sentence index) pairs."""
    return {(d.id, i) for d in example.documents for i in (d.supporting_sentences or ())}


def has_supporting_facts(example: Example) -> bool:
    """True when the row carries sentence-level gold and every passage has its sentences."""
    return (any(d.supporting_sentences for d in example.documents)
            and all(d.sentences for d in example.documents))


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
