"""One example's result record (a line of results/<pipeline>.jsonl) and its metrics."""

from __future__ import annotations

from sieverag.inference.eval.metrics import (
    answer_accuracy,
    choice_accuracy,
    exact_match,
    filter_scores,
    token_f1,
)
from sieverag.inference.eval.trust import Embed, answer_quality, judge_answer, trust_report
from sieverag.inference.llm.base import LLMBackend, Usage
from sieverag.inference.pipelines.base import PipelineOutput
from sieverag.inference.types import Example


def answer_metrics(example: Example, answer: str) -> dict[str, float]:
    """EM, token F1 and accuracy against the gold aliases; choice accuracy for MC examples."""
    metrics = {
        "em": exact_match(answer, example.answers),
        "f1": token_f1(answer, example.answers),
        "accuracy": answer_accuracy(answer, example.answers),
    }
    if example.choices and example.answer_key:
        metrics["choice_accuracy"] = choice_accuracy(answer, example.choices, example.answer_key)
    return metrics


def build_record(
    example: Example, output: PipelineOutput, usage: dict[str, Usage], seconds: float
) -> dict:
    """The jsonl record: answer, metrics, documents read, filter scores, usage by agent."""
    gold_ids = [d.id for d in example.documents if d.is_gold]
    record: dict = {
        "id": example.id,
        "question": example.question,
        "answers": list(example.answers),
        "prediction": output.answer,
        "raw_prediction": output.raw_answer,
        "metrics": answer_metrics(example, output.answer),
        "documents_read": [d.id for d in output.documents_read],
        "documents_given": len(example.documents),
        "read_scores": (
            filter_scores([d.id for d in output.documents_read], gold_ids)
            if output.documents_read or output.filter_result
            else None
        ),
        "usage": {agent: vars(u) for agent, u in sorted(usage.items())},
        "llm_calls": sum(u.calls for u in usage.values()),
        "input_tokens": sum(u.prompt_tokens for u in usage.values()),
        "generator_input_tokens": usage["generator"].prompt_tokens if "generator" in usage else 0,
        "seconds": round(seconds, 4),
    }
    if output.filter_result is not None:
        record["filter"] = {
            "threshold": output.filter_result.threshold,
            "scores": [
                {
                    "id": s.document.id,
                    "score": s.score,
                    "kept": s.kept,
                    "is_gold": s.document.is_gold,
                    **s.details,
                }
                for s in output.filter_result.scored
            ],
        }
    if output.trace:
        record["trace"] = output.trace
    return record


def trust_metrics(example: Example, output: PipelineOutput, embed: Embed | None,
                  support_threshold: float, llm_judge: LLMBackend | None = None) -> dict:
    """Trust metrics of the answer against the documents read (inference/eval/trust.py),
    answer quality against the gold answers, and optionally the LLM judge's 1-5 grades."""
    metrics = trust_report(output.answer, output.documents_read, embed,
                           support_threshold).to_dict()
    if embed is not None:
        metrics["answer_quality"] = answer_quality(output.answer, example.answers, embed)
    if llm_judge is not None:
        verdict = judge_answer(llm_judge, example.question, output.answer,
                               example.answers[0], output.documents_read)
        metrics["llm_judge"] = {**verdict.scores(), "error": verdict.error}
    return metrics
