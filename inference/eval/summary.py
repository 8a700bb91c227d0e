"""Aggregate per-example records of one pipeline into its summary figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sieverag.inference.eval.result_records import EvalRecord, answered_with_retrieval
from sieverag.inference.metrics.grader import GRADER_CRITERIA

ANSWER_METRICS = ("em", "f1", "accuracy", "choice_accuracy", "str_em", "str_hit", "rouge_l")
# Trust metrics (inference/metrics/trust.py), averaged over the answers where each is defined;
# `trust_counts` says how many that is (grounding metrics: the answers that retrieved).
TRUST_METRICS = ("answer_quality", "taas", "sentence_taas", "faithfulness",
                 "hallucination_rate", "context_precision", "evidence_noise",
                 "sentence_support_rate", "sentence_similarity", "sentence_support_by_sentence",
                 "unsupported_sentence_rate", "sentence_context_precision",
                 "sentence_evidence_noise", "lexical_context_use", "context_precision_gold")
# The per-kind table (the study's Table 5): a question set's kinds (`kind` in its records).
KIND_METRICS = ("accuracy", "answer_quality", "taas", "faithfulness", "hallucination_rate",
                "context_precision", "retrieval_usage_rate")


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def retrieval_usage(records: Sequence[EvalRecord]) -> float | None:
    """Share of questions answered with retrieval, r(q) = 1 (`answered_with_retrieval`: the
    pipeline's own decision where its trace holds one, a router's, else whether retrieved
    context was read)."""
    return _mean([float(answered_with_retrieval(r.trace, r.documents_read)) for r in records])


def trust_summary(records: Sequence[EvalRecord]) -> dict:
    """Each trust metric's mean over the answers where it is defined, how many those are
    (`trust_counts`), and the LLM grader's mean grade per criterion with its invalid replies."""
    trusted = [r.trust for r in records if r.trust is not None]
    if not trusted:
        return {}
    summary: dict = {}
    counts: dict[str, int] = {}
    for metric in TRUST_METRICS:
        values = [value for t in trusted if (value := getattr(t, metric)) is not None]
        summary[metric] = _mean(values)
        counts[metric] = len(values)
    summary["trust_counts"] = counts
    grades = [t.llm_grader for t in trusted if t.llm_grader is not None]
    if grades:
        for criterion in GRADER_CRITERIA:
            values = [v for g in grades if (v := getattr(g, criterion)) is not None]
            summary[f"grader_{criterion}"] = _mean(values)
        summary["grader_invalid"] = sum(1 for g in grades if g.error is not None)
    return summary


def kind_summary(records: Sequence[EvalRecord]) -> dict:
    """The per-kind figures (`KIND_METRICS`) of one kind's records."""
    figures: dict = {"examples": len(records),
                     "accuracy": _mean([r.metrics.accuracy for r in records]),
                     "retrieval_usage_rate": retrieval_usage(records)}
    trust = trust_summary(records)
    figures.update({m: trust.get(m) for m in KIND_METRICS if m not in figures})
    return figures


def summarize(records: Sequence[EvalRecord]) -> dict:
    """Means over examples; filter precision/recall/F1 over examples with gold documents.

    `read_*` are precision/recall/F1 of the documents the generator read against the gold
    documents: for `main-rag` the filter's quality, for `vanilla` the keep-all baseline;
    `read_all_gold` is the share of those examples whose gold documents were all read.
    `truncated_rate` is the share of examples with some prompt cut to fit the model's context
    (inference/llm/context_guard.py), `tokens_dropped_per_question` the prompt tokens cut.
    """
    summary: dict = {"examples": len(records)}
    for metric in ANSWER_METRICS:
        values = [value for r in records if (value := getattr(r.metrics, metric)) is not None]
        if values:
            summary[metric] = _mean(values)
    graded = [r.read_scores for r in records if r.read_scores is not None]
    for part in ("precision", "recall", "f1"):
        summary[f"read_{part}"] = _mean([getattr(g, part) for g in graded])
    # Every gold document read (HotpotQA: the gold pair) — the retrieval side of the run.
    summary["read_all_gold"] = _mean([float(g.recall == 1.0) for g in graded])
    summary["read_graded_examples"] = len(graded)
    summary.update(trust_summary(records))
    summary["retrieval_usage_rate"] = retrieval_usage(records)
    kinds = sorted({r.kind for r in records if r.kind is not None})
    if kinds:
        summary["by_kind"] = {kind: kind_summary([r for r in records if r.kind == kind])
                              for kind in kinds}
    summary["documents_read_per_question"] = _mean([len(r.documents_read) for r in records])
    summary["input_tokens_per_question"] = _mean([r.input_tokens for r in records])
    summary["generator_input_tokens_per_question"] = _mean(
        [r.generator_input_tokens for r in records]
    )
    summary["llm_calls_per_question"] = _mean([r.llm_calls for r in records])
    summary["truncated_rate"] = _mean([float(r.truncated_prompts > 0) for r in records])
    summary["tokens_dropped_per_question"] = _mean([r.tokens_dropped for r in records])
    summary["seconds_per_question"] = _mean([r.seconds for r in records])
    agents: dict[str, dict[str, float]] = {}
    for record in records:
        for agent, usage in record.usage.items():
            totals = agents.setdefault(
                agent, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0}
            )
            for key in totals:
                totals[key] += getattr(usage, key)
    if records:
        summary["usage_per_question"] = {
            agent: {k: round(v / len(records), 2) for k, v in totals.items()}
            for agent, totals in sorted(agents.items())
        }
    return summary
