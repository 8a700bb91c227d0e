"""Aggregate per-example records of one pipeline into its summary figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sieverag.inference.eval.records import EvalRecord

ANSWER_METRICS = ("em", "f1", "accuracy", "choice_accuracy", "str_em", "str_hit")
TRUST_METRICS = ("faithfulness", "hallucination_rate", "context_precision_used",
                 "context_precision_gold", "sentence_support_rate", "trust_score",
                 "answer_quality")


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def summarize(records: Sequence[EvalRecord]) -> dict:
    """Means over examples; filter precision/recall/F1 over examples with gold documents.

    `read_*` are precision/recall/F1 of the documents the generator read against the gold
    documents: for `main-rag` the filter's quality, for `vanilla` the keep-all baseline;
    `read_all_gold` is the share of those examples whose gold documents were all read.
    `truncated_rate` is the share of examples with some prompt cut to fit the model's context
    (inference/llm/context.py), `tokens_dropped_per_question` the prompt tokens cut.
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
    trusted = [r.trust for r in records if r.trust is not None]
    for metric in TRUST_METRICS:
        values = [value for t in trusted if (value := getattr(t, metric)) is not None]
        summary[metric] = _mean(values)
    judged = [t.llm_judge.overall for t in trusted
              if t.llm_judge is not None and t.llm_judge.overall is not None]
    if judged:
        summary["llm_judge_overall"] = _mean(judged)
    routed = [r.route.retrieve for r in records if r.route is not None]
    if routed:
        summary["retrieval_usage_rate"] = _mean([float(x) for x in routed])
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
                agent, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
            )
            for key in totals:
                totals[key] += getattr(usage, key)
    if records:
        summary["usage_per_question"] = {
            agent: {k: round(v / len(records), 2) for k, v in totals.items()}
            for agent, totals in sorted(agents.items())
        }
    return summary
