"""`main-rag`: the MAIN-RAG judge filters the documents, then Agent-3 answers from the kept ones.

`main-rag-naive` is the paper's naive multi-agent baseline: the same Agent-1, but Agent-2
generates a Yes/No verdict instead of being scored (inference/filters/naive_judge.py), so
there is no adaptive bar. Every agent reads the question as the generator does
(`question_text`: multiple-choice options listed); the documents are those the run's
document source gives for the plain question.
"""

from __future__ import annotations

from sieverag.inference.core.types import Example
from sieverag.inference.filters.document_filter import DocumentFilter
from sieverag.inference.filters.filter_registry import FilterSetup
from sieverag.inference.filters.judge import JUDGE_SECTION, JudgeConfig, MainRagJudge
from sieverag.inference.filters.naive_judge import NaiveJudge
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.pipelines.pipeline_registry import (
    PipelineContext,
    PipelineOutput,
    Reader,
    question_text,
    register_pipeline,
)


def judge_model(context: PipelineContext) -> LLMBackend:
    """The judge role's backend, which composition builds for a run that declares the role
    (the same check as the judge filter's)."""
    return FilterSetup(judge_backend=context.judge_backend).judge_model("main-rag")


# Its records hold the judge's score r of every document under one bar τq, so `sieverag
# judge-sweep` may recompute the bar (main-rag-naive's verdicts have no score).
@register_pipeline("main-rag", filter_stage=lambda settings: "judge", sections=[JUDGE_SECTION],
                   judge_sweep=True)
class MainRagPipeline:
    """Predictor + Judge (inference/filters/judge.py) → Final-Predictor on kept documents."""

    name = "main-rag"

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.judge = self.build_judge(context)
        self.reader = Reader(context)

    @staticmethod
    def build_judge(context: PipelineContext) -> DocumentFilter:
        return MainRagJudge(judge_model(context), context.settings(JudgeConfig))

    def run(self, example: Example) -> PipelineOutput:
        result = self.judge.select(question_text(example), self.context.documents(example))
        kept = tuple(result.kept_documents)
        answer, raw = self.reader.answer(example, kept)
        return PipelineOutput(answer=answer, raw_answer=raw, documents_read=kept,
                              filter_result=result)


@register_pipeline("main-rag-naive", roles=("generator", "judge"), sections=[JUDGE_SECTION])
class NaiveMainRagPipeline(MainRagPipeline):
    """Predictor + a generated Yes/No verdict → Final-Predictor on the Yes documents."""

    name = "main-rag-naive"

    @staticmethod
    def build_judge(context: PipelineContext) -> DocumentFilter:
        return NaiveJudge(judge_model(context), context.settings(JudgeConfig))
