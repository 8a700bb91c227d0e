"""LangChain: the trained filter as a document compressor (`pip install "sieverag[langchain]"`).

`SieveragCompressor` sends the retrieved documents' `page_content` to the rerank endpoint
(`rerank_client`), or with `filter` set runs the filter in this process (`in_process`), and
returns the documents it keeps, best first, each a copy with
`relevance_score`, `kept` and (at sentence granularity) `key_sentences` added to its
metadata. At sentence granularity a kept document's `page_content` becomes the text the
filter keeps of it (`pruned_text`: its key sentences, exactly what the filtering proxy
forwards; the compressor compresses); the rest of its metadata and its id stay.

Use it where LangChain takes a compressor (langchain-classic's
`ContextualCompressionRetriever`), or, with langchain-core alone, wrap a retriever:
`SieveragCompressor(...).wrap(retriever)` is a `FilteredRetriever`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever, RetrieverLike
from pydantic import ConfigDict, PrivateAttr

from sieverag.inference.core.types import RerankResult
from sieverag.inference.integrations.rerank_client import Ranker, RerankSettings


class SieveragCompressor(RerankSettings, BaseDocumentCompressor):
    """The documents the filter keeps, best first (see `RerankSettings` for the settings;
    `api_key` is the server's key, held out of the fields so it is never shown)."""

    model_config = ConfigDict(extra="forbid")

    _ranker: Ranker = PrivateAttr()

    def __init__(self, *, api_key: str | None = None, **settings: Any) -> None:
        super().__init__(**settings)
        self._ranker = self.ranker(api_key)

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """The documents the filter keeps for `query`, best first, annotated."""
        documents = list(documents)
        selected = self._ranker.select(query, [d.page_content for d in documents])
        return [_annotated(documents[result.index], result) for result in selected]

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        """`compress_documents`, without blocking the event loop."""
        documents = list(documents)
        selected = await self._ranker.aselect(query, [d.page_content for d in documents])
        return [_annotated(documents[result.index], result) for result in selected]

    def wrap(self, retriever: RetrieverLike) -> FilteredRetriever:
        """`retriever`, its documents passed through this compressor."""
        return FilteredRetriever(retriever=retriever, compressor=self)


class FilteredRetriever(BaseRetriever):
    """A retriever's documents as the filter keeps them: langchain-classic's
    `ContextualCompressionRetriever` for a `SieveragCompressor`, with langchain-core alone."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    retriever: RetrieverLike
    compressor: SieveragCompressor

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        documents = self.retriever.invoke(query, config={"callbacks": run_manager.get_child()})
        return list(self.compressor.compress_documents(documents, query,
                                                       callbacks=run_manager.get_child()))

    async def _aget_relevant_documents(
            self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        documents = await self.retriever.ainvoke(query,
                                                 config={"callbacks": run_manager.get_child()})
        return list(await self.compressor.acompress_documents(
            documents, query, callbacks=run_manager.get_child()))


def _annotated(document: Document, result: RerankResult) -> Document:
    return Document(page_content=result.text(document.page_content),
                    metadata={**document.metadata, **result.metadata()}, id=document.id)
