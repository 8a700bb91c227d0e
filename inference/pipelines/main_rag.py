"""`main-rag`: the MAIN-RAG judge filters the documents, then Agent-3 answers from the kept ones.

Every agent reads the question as the generator does (`question_text`: multiple-choice
options listed); the documents are those the run's document source gives for the plain
question.
"""

from __future__ import annotations

from sieverag.inference.filters.judge import MainRagJudge
from sieverag.inference.pipelines.base import (
    PipelineContext,
    PipelineOutput,
    Reader,
    question_text,
    register_pipeline,
)
from sieverag.inference.types import Example


@register_pipeline("main-rag")
class MainRagPipeline:
    """Predictor + Judge (inference/filters/judge.py) → Final-Predictor on kept documents."""

    name = "main-rag"

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.judge = MainRagJudge(context.judge_backend, context.judge)
        self.reader = Reader(context)

    def run(self, example: Example) -> PipelineOutput:
        result = self.judge.select(question_text(example), self.context.documents(example))
        kept = tuple(result.kept_documents)
        answer, raw = self.reader.answer(example, kept)
        return PipelineOutput(answer=answer, raw_answer=raw, documents_read=kept,
                              filter_result=result)
