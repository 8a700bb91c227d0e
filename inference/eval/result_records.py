"""One example's result record (a line of results/<pipeline>.jsonl): its typed form
(`EvalRecord`), how it is built from a pipeline's output, and its metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, PlainValidator, SerializeAsAny, model_validator

from sieverag.inference.composition.config import TrustConfig
from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.core.types import Example
from sieverag.inference.data.gold_match import read_passage_ids
from sieverag.inference.eval.migration import migrate_record, migrate_trust
from sieverag.inference.filters.document_filter import ScoredDocumentRecord
from sieverag.inference.llm.backend_protocol import LLMBackend, Usage
from sieverag.inference.metrics.answer_scores import (
    answer_accuracy,
    asqa_rouge_l,
    asqa_string_scores,
    choice_accuracy,
    exact_match,
    filter_scores,
    token_f1,
)
from sieverag.inference.metrics.grader import GraderItem, grade_answers
from sieverag.inference.metrics.trust import Embed, trust_report
from sieverag.inference.pipelines.pipeline_registry import (
    PipelineOutput,
    declared_traces,
    question_text,
)
from sieverag.inference.pipelines.traces import PipelineTrace, trace_model


class AnswerMetrics(JsonlRecord):
    """The answer against the gold aliases (inference/metrics/answer_scores.py)."""

    em: float = Field(description="exact match after normalisation")
    f1: float = Field(description="token F1, best over the aliases")
    accuracy: float = Field(description="an alias is contained in the answer")
    choice_accuracy: float | None = Field(
        None, description="the chosen option is the key (multiple-choice examples only)")
    str_em: float | None = Field(
        None, description="share of the disambiguations answered (ASQA examples only)")
    str_hit: float | None = Field(
        None, description="every disambiguation answered (ASQA examples only)")
    rouge_l: float | None = Field(
        None, description="ROUGE-L (Lsum F) against the best long answer (ASQA examples only)")


class ReadScores(JsonlRecord):
    """Precision, recall and F1 of the documents read against the gold documents."""

    precision: float
    recall: float
    f1: float


class AgentUsage(JsonlRecord):
    """One agent's LLM usage on the example (`llm.backend_protocol.Usage`)."""

    calls: int = Field(description="prompts sent")
    prompt_tokens: int
    completion_tokens: int
    truncated_prompts: int = Field(0, description="prompts cut to fit the model's context "
                                                  "(absent when none was)")
    tokens_dropped: int = Field(0, description="prompt tokens those cuts removed (absent when "
                                               "none was cut)")
    seconds: float = Field(0.0, description="wall seconds the agent's LLM operations took")

    @classmethod
    def of(cls, usage: Usage) -> AgentUsage:
        """The record of `usage`; the truncation counts only where a prompt was cut."""
        cut = ({"truncated_prompts": usage.truncated_prompts,
                "tokens_dropped": usage.tokens_dropped} if usage.truncated_prompts else {})
        return cls(calls=usage.calls, prompt_tokens=usage.prompt_tokens,
                   completion_tokens=usage.completion_tokens,
                   seconds=round(usage.seconds, 4), **cut)


class FilterRecord(JsonlRecord):
    """The filter's decisions over all the documents it scored."""

    threshold: float | None = Field(description="the bar; None where rounds used different ones")
    rule: str | None = Field(None, description=(
        "which rule set the bar (MCF: calibrated, shift_guard, top_k, fixed, adaptive); "
        "rounds that differ are joined with '+'"))
    rule_reason: str | None = Field(None, description="why, in words (MCF)")
    scores: list[ScoredDocumentRecord] = Field(description="every scored document, in order")


class GraderGrades(JsonlRecord):
    """The LLM grader's 1-5 grades (`metrics.grader.GraderVerdict`): higher is better except
    `hallucination_risk` (1 = nothing invented); `evidence_grounding` None without retrieval
    (not applicable); all None when its reply was invalid."""

    correctness: int | None
    relevance: int | None
    completeness: int | None
    evidence_grounding: int | None
    hallucination_risk: int | None
    overall: int | None
    error: str | None = Field(description="why the reply was not a verdict; None when it was")


class TrustMetrics(JsonlRecord):
    """Trust metrics of the answer (inference/metrics/trust.py, where each is defined): the
    Auto-RAG study's under its names, ours under names of their own. The grounding metrics
    are None when the answer was given without retrieval (`retrieved` false: not
    applicable), the embedding ones None without an encoder. A line written under the old
    names is read under today's (`migration.migrate_trust`)."""

    retrieved: bool = Field(description="r(q): answered with retrieval (`auto`'s routing "
                                        "decision, else: retrieved context was read)")
    answer_quality: float | None = Field(description="AQS: similarity + keyword coverage")
    faithfulness: float | None = Field(description="share of the answer's content tokens "
                                                   "found in the context read")
    hallucination_rate: float | None = Field(description="1 − faithfulness; lower is better")
    context_precision: float | None = Field(None, description=(
        "the study's, token-level: share of the context's content tokens the answer uses "
        "(absent in runs before it)"))
    evidence_noise: float | None = Field(None, description=(
        "the study's: 1 − context precision; lower is better (absent in runs before it)"))
    sentence_support_rate: float | None = Field(None, description=(
        "the study's SSR: share of the answer's sentences some retrieved chunk supports "
        "(cosine ≥ trust.alignment_threshold; absent in runs before it)"))
    taas: float | None = Field(description="the study's trust-aware answer score: AQS when "
                                           "not retrieved, else 0.4·AQS + 0.6·faithfulness")
    sentence_similarity: float | None = Field(description="ours: the answer sentences' mean "
                                                          "best cosine to the context")
    sentence_support_by_sentence: float | None = Field(None, description=(
        "ours: share of the answer's sentences some context sentence supports"))
    unsupported_sentence_rate: float | None = Field(description="ours: 1 − sentence support "
                                                                "by sentence; lower is better")
    sentence_context_precision: float | None = Field(None, description=(
        "ours: share of the context's sentences that support an answer sentence"))
    sentence_evidence_noise: float | None = Field(None, description=(
        "ours: share of the context's sentences off the question; lower is better"))
    sentence_taas: float | None = Field(None, description="ours: TAAS over sentence "
                                                          "similarity and sentence support "
                                                          "(absent in runs before it)")
    lexical_context_use: float | None = Field(description="ours: share of the documents read "
                                                          "sharing a content token with the "
                                                          "answer")
    context_precision_gold: float | None = Field(description="share of the documents read "
                                                             "that are gold")
    llm_grader: GraderGrades | None = Field(
        None, description="the LLM grader's grades (absent unless trust.llm_grader)")

    _read_old_names = model_validator(mode="before")(migrate_trust)


def read_trace(data: PipelineTrace | Mapping[str, Any]) -> PipelineTrace:
    """A pipeline's trace (a `PipelineOutput.trace`, a record's `trace`) as the model the
    registered pipelines declare for its keys (`traces.trace_model`): several declared
    models found are one, an instance of each (`auto`'s route beside the routed pipeline's
    trace); keys no declared model has are an `OpenTrace` (any JSON values). A pydantic
    ValidationError names a bad key by its place."""
    if isinstance(data, PipelineTrace):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"a trace is a JSON object, got {type(data).__name__}")
    return trace_model(data, declared_traces()).model_validate(data)


# Read by the registry at validation time, so a pipeline registered after this module was
# imported has its trace read as its own model too.
Trace = Annotated[SerializeAsAny[PipelineTrace], PlainValidator(read_trace)]


class HygieneRemoval(JsonlRecord):
    """A retrieved chunk evidence hygiene removed before any agent read it."""

    id: str = Field(description="the chunk's id in the index")
    reason: str = Field(description="the rule that removed it (inference/retrieval/hygiene.py)")


class EvalRecord(JsonlRecord):
    """One example's result: a line of results/<pipeline>.jsonl."""

    id: str = Field(description="the example's id")
    question: str
    answers: list[str] = Field(description="the gold aliases")
    reference: str | None = Field(
        None, description="the dataset's reference answer (absent unless the example's "
                          "metadata holds a `reference` string)")
    kind: str | None = Field(
        None, description="the question's kind (absent unless the example's metadata holds a "
                          "`kind`, e.g. the nutrition set's factual / conceptual / "
                          "textbook-specific)")
    prediction: str = Field(description="the answer scored (extracted from the reply)")
    raw_prediction: str = Field(description="the generator's whole reply")
    metrics: AnswerMetrics
    documents_read: list[str] = Field(description="ids of the documents the generator read")
    contexts: list[str] = Field(
        default_factory=list,
        description="the text of each document read, in `documents_read`'s order, as the "
                    "generator's prompt shows it (`Document.as_context`: title line, then the "
                    "text; amber: the key sentences kept); absent in records of older versions")
    documents_given: int = Field(description="documents the example came with")
    read_scores: ReadScores | None = Field(
        description="documents read against gold; None without gold marks or documents read")
    usage: dict[str, AgentUsage] = Field(description="LLM usage by agent name")
    llm_calls: int = Field(description="prompts sent, all agents")
    input_tokens: int = Field(description="prompt tokens, all agents")
    generator_input_tokens: int = Field(description="prompt tokens of the `generator` agent")
    seconds: float = Field(description="wall time of the example")
    truncated_prompts: int = Field(
        0, description="prompts cut to fit the model's context, all agents (absent when none "
                       "was; inference/llm/context_guard.py)")
    tokens_dropped: int = Field(0, description="prompt tokens those cuts removed, all agents "
                                               "(absent when none was cut)")
    hygiene_removed: list[HygieneRemoval] | None = Field(
        None, description="the chunks evidence hygiene (`retrieval.hygiene`) removed from the "
                          "example's searches, in the order removed, each once; absent when "
                          "hygiene is off or the run reads no index")
    filter: FilterRecord | None = Field(None, description="absent for pipelines without one")
    trace: Trace | None = Field(None, description=(
        "how the pipeline answered, as the model it declares (`register_pipeline(trace=...)`; "
        "`read_trace`: a trace no declared model matches is an `OpenTrace`, any JSON values); "
        "absent when the pipeline recorded none"))
    trust: TrustMetrics | None = Field(None, description="absent unless trust.enabled")

    _read_old_trust = model_validator(mode="before")(migrate_record)


def answer_metrics(example: Example, answer: str) -> AnswerMetrics:
    """EM, token F1 and accuracy against the gold aliases; choice accuracy for MC examples;
    STR-EM and STR-Hit for ASQA's (their `qa_pairs` metadata), and ROUGE-L against their
    `long_answers`."""
    metrics = AnswerMetrics(em=exact_match(answer, example.answers),
                            f1=token_f1(answer, example.answers),
                            accuracy=answer_accuracy(answer, example.answers))
    if example.choices and example.answer_key:
        metrics.choice_accuracy = choice_accuracy(answer, example.choices, example.answer_key)
    short_answers = [pair["short_answers"] for pair in example.metadata.get("qa_pairs", ())]
    if any(short_answers):
        metrics.str_em, metrics.str_hit = asqa_string_scores(answer, short_answers)
    long_answers = [a for a in example.metadata.get("long_answers", ()) if a and a.strip()]
    if long_answers:
        metrics.rouge_l = asqa_rouge_l(answer, long_answers)
    return metrics


def build_record(
    example: Example, output: PipelineOutput, usage: dict[str, Usage], seconds: float
) -> EvalRecord:
    """The jsonl record: answer, metrics, documents read (ids and text), filter scores,
    usage by agent."""
    gold_ids = [d.id for d in example.documents if d.is_gold]
    optional: dict[str, Any] = {}
    if output.filter_result is not None:
        optional["filter"] = FilterRecord(
            threshold=output.filter_result.threshold, rule=output.filter_result.rule,
            rule_reason=output.filter_result.rule_reason,
            scores=[ScoredDocumentRecord(id=s.document.id, score=s.score, kept=s.kept,
                                         is_gold=s.document.is_gold, **s.details)
                    for s in output.filter_result.scored])
    if output.trace:
        optional["trace"] = output.trace
    for annotation in ("reference", "kind"):  # strings by the loaders' rule
        if annotation in example.metadata:
            optional[annotation] = example.metadata[annotation]
    truncated = sum(u.truncated_prompts for u in usage.values())
    if truncated:
        optional["truncated_prompts"] = truncated
        optional["tokens_dropped"] = sum(u.tokens_dropped for u in usage.values())
    return EvalRecord(
        id=example.id, question=example.question, answers=list(example.answers),
        prediction=output.answer, raw_prediction=output.raw_answer,
        metrics=answer_metrics(example, output.answer),
        documents_read=[d.id for d in output.documents_read],
        contexts=[d.as_context() for d in output.documents_read],
        documents_given=len(example.documents),
        read_scores=(filter_scores(read_passage_ids(example, output.documents_read), gold_ids)
                     if output.documents_read or output.filter_result else None),
        usage={agent: AgentUsage.of(u) for agent, u in sorted(usage.items())},
        llm_calls=sum(u.calls for u in usage.values()),
        input_tokens=sum(u.prompt_tokens for u in usage.values()),
        generator_input_tokens=usage["generator"].prompt_tokens if "generator" in usage else 0,
        seconds=round(seconds, 4), **optional)


def answered_with_retrieval(trace: PipelineTrace | None,
                            documents_read: Sequence[object]) -> bool:
    """r(q): whether the question was answered with retrieval — the pipeline's own decision
    where its trace holds one (`PipelineTrace.retrieval_decision`: a router's), else whether
    the generator read retrieved context."""
    decided = trace.retrieval_decision() if trace is not None else None
    return decided if decided is not None else bool(documents_read)


def trust_metrics(example: Example, output: PipelineOutput, embed: Embed | None,
                  config: TrustConfig, grader: LLMBackend | None = None) -> TrustMetrics:
    """Trust metrics of the answer against what the generator read (inference/metrics/trust.py):
    against the example's reference answer where it has one (`metadata["reference"]`, with
    its `keywords`), else its gold aliases; optionally the LLM grader's 1-5 grades."""
    reference = example.metadata.get("reference")
    report = trust_report(
        question_text(example), output.answer, output.documents_read,
        [reference] if reference else example.answers, embed,
        retrieved=answered_with_retrieval(read_trace(output.trace) if output.trace else None,
                                          output.documents_read),
        keywords=example.metadata.get("keywords"), support_threshold=config.support_threshold,
        noise_threshold=config.noise_threshold, alignment_threshold=config.alignment_threshold,
        quality_weights=config.quality, taas_weights=config.taas)
    metrics = TrustMetrics(**report.to_dict())
    if grader is not None:
        verdict = grade_answers(grader, [GraderItem(
            question_text(example), output.answer, reference or example.answers[0],
            output.documents_read)])[0]
        metrics.llm_grader = GraderGrades(**verdict.scores(), error=verdict.error)
    return metrics
