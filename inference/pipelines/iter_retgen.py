"""`iter-retgen`: Iter-RetGen (Shao et al., 2023) as FlashRAG implements it — the field's usual
iterative baseline beside amber.

Each iteration retrieves the top `iter_retgen.k` documents for its query and generates an
answer from them; iteration 1's query is the question, each later one is the question
followed by the previous iteration's answer. The last iteration's answer is the answer.
Documents come from the index (`context.search`, gold-marked from the question's given
passages) or, without one, from the question's given documents ranked by a BM25 built over
them, as amber's rounds take theirs. Documents are not deduplicated across iterations
(FlashRAG's behaviour): `documents_read` lists every distinct document some iteration read,
in the order first read. The trace holds each iteration's query, documents and raw answer.
"""

from __future__ import annotations

from dataclasses import field

from pydantic import BaseModel, ConfigDict, Field

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import Section, settings
from sieverag.inference.core.types import Document, Example
from sieverag.inference.pipelines.pipeline_registry import (
    PipelineContext,
    PipelineOutput,
    Reader,
    register_pipeline,
)
from sieverag.inference.pipelines.rounds import RoundDocuments
from sieverag.inference.pipelines.traces import PipelineTrace


@settings
class IterRetGenConfig:
    """Documents per iteration and iterations (reading budget = k x iterations)."""

    k: int = field(default=3, metadata={"help": "documents retrieved per iteration"})
    iterations: int = field(default=2, metadata={"help": "retrieve-generate iterations"})

    def __post_init__(self) -> None:
        if self.k < 1 or self.iterations < 1:
            raise ConfigError(f"iter_retgen.k and iter_retgen.iterations must be >= 1, got "
                              f"{self.k} and {self.iterations}")


ITER_RETGEN_SECTION = Section("iter_retgen", IterRetGenConfig, "the `iter-retgen` baseline")


def next_query(question: str, answer: str) -> str:
    """FlashRAG's Iter-RetGen query: the question, then the last answer."""
    return f"{question} {answer}".strip()


class Iteration(BaseModel):
    """One retrieve-then-generate iteration."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="what this iteration searched for")
    retrieved: list[str] = Field(description="the ids of the documents it read")
    answer: str = Field(description="the generator's raw answer from them")


class IterRetGenTrace(PipelineTrace):
    """`iter-retgen`'s trace: each iteration's query, documents and raw answer."""

    iterations: list[Iteration] = Field(description="the iterations, in order")


def render_iterations(trace: IterRetGenTrace) -> str:
    """Each iteration in two lines: its query and documents, then its answer."""
    lines = []
    for number, step in enumerate(trace.iterations, start=1):
        lines.append(f"Iteration {number} — query: {step.query!r}; read "
                     f"{', '.join(step.retrieved) or 'nothing'}")
        lines.append(f"  answer: {' '.join(step.answer.split()) or '(empty)'}")
    return "\n".join(lines)


@register_pipeline("iter-retgen", sections=[ITER_RETGEN_SECTION], trace=IterRetGenTrace,
                   render_trace=render_iterations)
class IterRetGenPipeline:
    """Retrieve with question + last answer, generate, repeat; answer with the last one."""

    name = "iter-retgen"

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.config = context.settings(IterRetGenConfig)
        self.reader = Reader(context)

    def run(self, example: Example) -> PipelineOutput:
        source = RoundDocuments(self.context, example, self.config.k)
        read: dict[str, Document] = {}
        iterations = []
        query = example.question
        answer, raw = "", ""
        for _ in range(self.config.iterations):
            documents = source.ranked(query)[:self.config.k]
            for document in documents:
                read.setdefault(document.id, document)
            answer, raw = self.reader.answer(example, documents)
            iterations.append({"query": query, "retrieved": [d.id for d in documents],
                               "answer": raw})
            query = next_query(example.question, answer)
        return PipelineOutput(answer=answer, raw_answer=raw,
                              documents_read=tuple(read.values()),
                              trace={"iterations": iterations})
