"""SieveragCompressor in LangChain's own retriever → compressor chains, against the embedded
server's rerank endpoint (tiny model, random filter adapter): the documents that come out are
exactly those the endpoint keeps, best first, with its scores in their metadata."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from rerank_server import CORPUS, KEY, QUERY, assert_errors, nothing_listening, rerank_directly
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.integrations.langchain import FilteredRetriever, SieveragCompressor
from sieverag.inference.integrations.rerank_client import RerankEndpointError


@pytest.fixture(scope="module")
def retriever() -> BaseRetriever:
    """langchain-core's in-memory vector store over the corpus, every document retrieved."""
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
    store.add_documents([Document(page_content=text, metadata={"source": f"{name}.txt"},
                                  id=name) for name, text in CORPUS.items()])
    return store.as_retriever(search_kwargs={"k": len(CORPUS)})


def expected(filter_url: str, retrieved: list[Document], granularity: str = "chunk"
             ) -> list[tuple[Document, dict[str, Any]]]:
    """Each retrieved document with its result from the endpoint itself, best first."""
    results = rerank_directly(filter_url, QUERY, [d.page_content for d in retrieved],
                              granularity)
    return [(retrieved[result["index"]], result) for result in results]


def assert_kept(documents: list[Document], wanted: list[tuple[Document, dict[str, Any]]]
                ) -> None:
    kept = [(document, result) for document, result in wanted if result["kept"]]
    assert len(kept) == 2  # MCF's default bar: the round's 2 best
    assert [d.id for d in documents] == [d.id for d, _ in kept]
    assert [d.page_content for d in documents] == [d.page_content for d, _ in kept]
    scores = [d.metadata["relevance_score"] for d in documents]
    assert scores == pytest.approx([r["relevance_score"] for _, r in kept], abs=1e-6)
    assert scores == sorted(scores, reverse=True)
    assert all(d.metadata["kept"] is True for d in documents)
    assert [d.metadata["source"] for d in documents] == [f"{d.id}.txt" for d in documents]


def test_the_compression_retriever_returns_what_the_endpoint_keeps(
        filter_url: str, retriever: BaseRetriever) -> None:
    compressed = ContextualCompressionRetriever(
        base_compressor=SieveragCompressor(base_url=filter_url, api_key=KEY),
        base_retriever=retriever)
    documents = compressed.invoke(QUERY)
    assert_kept(documents, expected(filter_url, retriever.invoke(QUERY)))


def test_a_core_only_chain_adopts_the_filter_by_wrapping_its_retriever(
        filter_url: str, retriever: BaseRetriever) -> None:
    """An LCEL chain (retriever → prompt) with its retriever wrapped: the prompt reads the kept
    documents only, best first; the async path gives the same documents."""
    filtered = SieveragCompressor(base_url=filter_url, api_key=KEY).wrap(retriever)
    assert isinstance(filtered, FilteredRetriever)
    chain = ({"context": filtered | RunnableLambda(
                  lambda documents: "\n\n".join(d.page_content for d in documents)),
              "question": RunnablePassthrough()}
             | PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}"))
    wanted = expected(filter_url, retriever.invoke(QUERY))
    kept_texts = [d.page_content for d, result in wanted if result["kept"]]
    assert chain.invoke(QUERY).to_string() == (
        "Context:\n" + "\n\n".join(kept_texts) + f"\n\nQuestion: {QUERY}")
    assert_kept(asyncio.run(filtered.ainvoke(QUERY)), wanted)


def test_sentence_granularity_keep_and_top_n(filter_url: str,
                                            retriever: BaseRetriever) -> None:
    """keep='top_n' passes every document on, best first, kept or not, a kept one narrowed to
    its key sentences; top_n cuts what is kept to the best."""
    compressor = SieveragCompressor(base_url=filter_url, api_key=KEY, keep="top_n",
                                    granularity="sentence")
    retrieved = retriever.invoke(QUERY)
    documents = compressor.compress_documents(retrieved, QUERY)
    wanted = expected(filter_url, retrieved, "sentence")
    assert [d.id for d in documents] == [d.id for d, _ in wanted]
    for document, (original, result) in zip(documents, wanted, strict=True):
        assert document.metadata["relevance_score"] == pytest.approx(result["relevance_score"],
                                                                     abs=1e-6)
        assert document.metadata["kept"] is result["kept"]
        assert document.metadata["key_sentences"] == result["key_sentences"]
        # A kept document is handed back as the endpoint's pruned text (what the proxy
        # forwards), the others as they were.
        assert document.page_content == (result["pruned_text"] if result["kept"]
                                         else original.page_content)
    assert sum(d.metadata["kept"] for d in documents) == 2
    # The retrieved documents are left as they were.
    assert [d.page_content for d in retrieved] == [CORPUS[d.id] for d in retrieved]
    assert all("relevance_score" not in d.metadata for d in retrieved)
    # Chunk granularity keeps what the sentence stage keeps (its replies never drop a chunk
    # under the server's default rules).
    best = SieveragCompressor(base_url=filter_url, api_key=KEY, top_n=1).compress_documents(
        retrieved, QUERY)
    assert [d.id for d in best] == [next(d.id for d, result in wanted if result["kept"])]


def test_endpoint_errors_are_one_clear_exception(filter_url: str,
                                                 retriever: BaseRetriever) -> None:
    down = nothing_listening()
    compressed = SieveragCompressor(base_url=down, api_key=KEY).wrap(retriever)
    assert_errors(
        down, filter_url, ask_down=lambda: compressed.invoke(QUERY),
        ask_down_async=lambda: compressed.ainvoke(QUERY),
        ask_without_key=lambda: SieveragCompressor(
            base_url=filter_url, api_key="sk-wrong").compress_documents(
                retriever.invoke(QUERY), QUERY))
    with pytest.raises(RerankEndpointError, match="HTTP 404: the model 'nope' does not exist"):
        SieveragCompressor(base_url=filter_url, api_key=KEY, model="nope").compress_documents(
            retriever.invoke(QUERY), QUERY)
    # No documents, no request.
    assert SieveragCompressor(base_url=down).compress_documents([], QUERY) == []


def test_in_process_the_chain_returns_what_the_endpoint_keeps(
        filter_url: str, lora_dir: Path, tiny_model_dir: Path, retriever: BaseRetriever) -> None:
    """With `filter` set the compressor runs the same adapter in this process (no server
    needed): the same documents as the endpoint keeps, its scores to 1e-4 (hf vs the server's
    engine), sentence granularity alike."""
    compressor = SieveragCompressor(filter=str(lora_dir), base_model=str(tiny_model_dir),
                                    base_url=nothing_listening())
    documents = ContextualCompressionRetriever(base_compressor=compressor,
                                               base_retriever=retriever).invoke(QUERY)
    wanted = expected(filter_url, retriever.invoke(QUERY))
    kept = [(document, result) for document, result in wanted if result["kept"]]
    assert [d.id for d in documents] == [d.id for d, _ in kept]
    assert [d.metadata["relevance_score"] for d in documents] == pytest.approx(
        [result["relevance_score"] for _, result in kept], abs=1e-4)
    narrowed = SieveragCompressor(filter=str(lora_dir), base_model=str(tiny_model_dir),
                                  granularity="sentence").wrap(retriever)
    sentence = [(d, r) for d, r in expected(filter_url, retriever.invoke(QUERY), "sentence")
                if r["kept"]]
    assert [(d.id, d.metadata["key_sentences"]) for d in asyncio.run(narrowed.ainvoke(QUERY))
            ] == [(d.id, result["key_sentences"]) for d, result in sentence]
