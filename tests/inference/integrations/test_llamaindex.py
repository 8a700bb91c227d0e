"""SieveragPostprocessor in LlamaIndex's own retriever → post-processor → synthesizer chain (a
vector index on a mock embedding, a query engine on MockLLM, which echoes its prompt), against
the embedded server's rerank endpoint (tiny model, random filter adapter): the nodes that come
out are exactly those the endpoint keeps, best first, with its scores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode
from rerank_server import CORPUS, KEY, QUERY, assert_errors, nothing_listening, rerank_directly
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.integrations.llamaindex import SieveragPostprocessor


@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    """A vector index over the corpus; its mock embedding retrieves every node."""
    nodes = [TextNode(text=text, id_=name, metadata={"source": f"{name}.txt"})
             for name, text in CORPUS.items()]
    return VectorStoreIndex(nodes, embed_model=MockEmbedding(embed_dim=8))


def retrieved(index: VectorStoreIndex) -> list[NodeWithScore]:
    return index.as_retriever(similarity_top_k=len(CORPUS)).retrieve(QUERY)


def expected(filter_url: str, nodes: list[NodeWithScore], granularity: str = "chunk"
             ) -> list[tuple[NodeWithScore, dict[str, Any]]]:
    """Each retrieved node with its result from the endpoint itself, best first."""
    results = rerank_directly(filter_url, QUERY, [n.node.get_content() for n in nodes],
                              granularity)
    return [(nodes[result["index"]], result) for result in results]


def test_a_query_engine_reads_what_the_endpoint_keeps(filter_url: str,
                                                      index: VectorStoreIndex) -> None:
    engine = index.as_query_engine(
        llm=MockLLM(), similarity_top_k=len(CORPUS),
        node_postprocessors=[SieveragPostprocessor(base_url=filter_url, api_key=KEY)])
    response = engine.query(QUERY)
    kept = [(node, result) for node, result in expected(filter_url, retrieved(index))
            if result["kept"]]
    assert len(kept) == 2  # MCF's default bar: the round's 2 best
    sources = response.source_nodes
    assert [n.node.node_id for n in sources] == [n.node.node_id for n, _ in kept]
    assert [n.score for n in sources] == pytest.approx(
        [result["relevance_score"] for _, result in kept], abs=1e-6)
    assert [n.score for n in sources] == sorted((n.score for n in sources), reverse=True)
    for node in sources:
        assert node.node.metadata["relevance_score"] == node.score
        assert node.node.metadata["kept"] is True
        assert node.node.metadata["source"] == f"{node.node.node_id}.txt"
        assert node.node.get_content() == CORPUS[node.node.node_id]
        # The generator reads the node's metadata, not the filter's annotations.
        llm_view = node.node.get_content(metadata_mode=MetadataMode.LLM)
        assert "source:" in llm_view and "relevance_score" not in llm_view
    # MockLLM echoes its prompt: the generator read the kept nodes and nothing else.
    prompt = str(response)
    for name, text in CORPUS.items():
        assert (text in prompt) == (name in {n.node.node_id for n in sources})
    assert "relevance_score" not in prompt and "kept:" not in prompt
    # The index's nodes are left as they were.
    assert "relevance_score" not in index.docstore.get_node(sources[0].node.node_id).metadata
    # The async path gives the same nodes.
    again = asyncio.run(engine.aquery(QUERY)).source_nodes
    assert [(n.node.node_id, n.score) for n in again] == [
        (n.node.node_id, pytest.approx(n.score, abs=1e-6)) for n in sources]


def test_sentence_granularity_keep_and_top_n(filter_url: str,
                                            index: VectorStoreIndex) -> None:
    """keep='top_n' passes every node on, best first, kept or not, a kept one narrowed to its
    key sentences; top_n cuts what is kept to the best."""
    nodes = retrieved(index)
    postprocessor = SieveragPostprocessor(base_url=filter_url, api_key=KEY, keep="top_n",
                                          granularity="sentence")
    ranked = postprocessor.postprocess_nodes(nodes, query_str=QUERY)
    wanted = expected(filter_url, nodes, "sentence")
    assert [n.node.node_id for n in ranked] == [n.node.node_id for n, _ in wanted]
    for node, (original, result) in zip(ranked, wanted, strict=True):
        assert node.score == pytest.approx(result["relevance_score"], abs=1e-6)
        assert node.node.metadata["kept"] is result["kept"]
        assert node.node.metadata["key_sentences"] == result["key_sentences"]
        # A kept node is handed back as the endpoint's pruned text (what the proxy forwards),
        # the others as they were.
        assert node.node.get_content() == (result["pruned_text"] if result["kept"]
                                           else original.node.get_content())
    assert sum(n.node.metadata["kept"] for n in ranked) == 2
    assert [n.node.get_content() for n in nodes] == [CORPUS[n.node.node_id] for n in nodes]
    # Chunk granularity keeps what the sentence stage keeps (its replies never drop a chunk
    # under the server's default rules).
    best = SieveragPostprocessor(base_url=filter_url, api_key=KEY, top_n=1).postprocess_nodes(
        nodes, query_str=QUERY)
    assert [n.node.node_id for n in best] == [
        next(n.node.node_id for n, result in wanted if result["kept"])]


def test_endpoint_errors_are_one_clear_exception(filter_url: str,
                                                 index: VectorStoreIndex) -> None:
    down = nothing_listening()
    engine = index.as_query_engine(
        llm=MockLLM(), node_postprocessors=[SieveragPostprocessor(base_url=down)])
    assert_errors(
        down, filter_url, ask_down=lambda: engine.query(QUERY),
        ask_down_async=lambda: engine.aquery(QUERY),
        ask_without_key=lambda: SieveragPostprocessor(base_url=filter_url).postprocess_nodes(
            retrieved(index), query_str=QUERY))
    with pytest.raises(ValueError, match="query"):
        SieveragPostprocessor(base_url=filter_url, api_key=KEY).postprocess_nodes(
            retrieved(index))


def test_in_process_the_query_engine_reads_what_the_endpoint_keeps(
        filter_url: str, lora_dir: Path, tiny_model_dir: Path, index: VectorStoreIndex) -> None:
    """With `filter` set the post-processor runs the same adapter in this process (no server
    needed): the same nodes as the endpoint keeps, its scores to 1e-4 (hf vs the server's
    engine), sentence granularity alike."""
    postprocessor = SieveragPostprocessor(filter=str(lora_dir), base_model=str(tiny_model_dir),
                                          base_url=nothing_listening())
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=len(CORPUS),
                                   node_postprocessors=[postprocessor])
    sources = engine.query(QUERY).source_nodes
    kept = [(node, result) for node, result in expected(filter_url, retrieved(index))
            if result["kept"]]
    assert [n.node.node_id for n in sources] == [n.node.node_id for n, _ in kept]
    assert [n.score for n in sources] == pytest.approx(
        [result["relevance_score"] for _, result in kept], abs=1e-4)
    nodes = retrieved(index)
    narrowed = SieveragPostprocessor(filter=str(lora_dir), base_model=str(tiny_model_dir),
                                     granularity="sentence")
    ranked = asyncio.run(narrowed.apostprocess_nodes(nodes, query_str=QUERY))
    wanted = [(n, r) for n, r in expected(filter_url, nodes, "sentence") if r["kept"]]
    assert [(n.node.node_id, n.node.metadata["key_sentences"]) for n in ranked] == [
        (n.node.node_id, result["key_sentences"]) for n, result in wanted]
