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

from sieverag.inference.pipelines.amber import RoundDocuments
from sieverag.inference.pipelines.base import (
    PipelineContext,
    PipelineOutput,
    Reader,
    register_pipeline,
)
from sieverag.inference.types import Document, Example


def next_query(question: str, answer: str) -> str:
    """FlashRAG's Iter-RetGen query: the question, then the last answer."""
    return f"{question} {answer}".strip()


@register_pipeline("iter-retgen")
class IterRetGenPipeline:
    """Retrieve with question + last answer, generate, repeat; answer with the last one."""

    name = "iter-retgen"

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.config = context.iter_retgen
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
