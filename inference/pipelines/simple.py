"""The baselines: `direct` (no documents) and `vanilla` (every document it is given)."""

from __future__ import annotations

from sieverag.inference.core.types import Example
from sieverag.inference.pipelines.pipeline_registry import (
    PipelineContext,
    PipelineOutput,
    Reader,
    register_pipeline,
)


@register_pipeline("direct", reads_documents=False)
class DirectPipeline:
    """Answer from the model's own knowledge; no retrieval, no documents."""

    name = "direct"

    def __init__(self, context: PipelineContext) -> None:
        self.reader = Reader(context)

    def run(self, example: Example) -> PipelineOutput:
        answer, raw = self.reader.answer(example, [])
        return PipelineOutput(answer=answer, raw_answer=raw, documents_read=())


@register_pipeline("vanilla", default=True)
class VanillaPipeline:
    """Read every document the source gives, in its order."""

    name = "vanilla"

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.reader = Reader(context)

    def run(self, example: Example) -> PipelineOutput:
        documents = tuple(self.context.documents(example))
        answer, raw = self.reader.answer(example, documents)
        return PipelineOutput(answer=answer, raw_answer=raw, documents_read=documents)
