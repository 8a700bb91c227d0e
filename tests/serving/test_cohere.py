"""Cohere's own SDK against the embedded server with the shipped filter: the v1 `Client`
(POST /v1/rerank) and the v2 `ClientV2` (POST /v2/rerank) rerank as the filter ranks
in-process, `max_tokens_per_doc` cuts the documents, refusals are the SDK's errors, and the
SDK reads the pruned text and spans; LangChain's and LlamaIndex's own Cohere rerankers
(`langchain-cohere`, `llama-index-postprocessor-cohere-rerank`), pointed at the server, rank
as the filter ranks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import cohere
import pytest

from sieverag.inference.core.types import RerankResult
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.card.combination import adapter_combination
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.filters.ranking import as_documents, rank_by_filter
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.serving.api.field_policy import IGNORED_HEADER
from sieverag.serving.api.rerank.serving import cut_to_tokens
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

pytestmark = pytest.mark.integration

KEY_ENV = "SIEVERAG_COHERE_TEST_KEY"
KEY = "sk-cohere-test"
QUERY = "Where was Liora Tamsin born?"
DOCUMENTS = [
    "Penguins huddle together in winter.",
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer.",
    "The Calder Bridge opened in 1901. It crosses a gorge.",
    "Quorrin is a port town. Liora Tamsin grew up there.",
]
# Relevant only past its first dozen tokens.
LATE = ("The annual report lists the harbour's tonnage, its pilots and the repairs made to the "
        "eastern breakwater during the spring. Liora Tamsin was born in Quorrin.")


@pytest.fixture(scope="module")
def server(embedded_model_dir: Path) -> Iterator[LocalServer]:
    os.environ[KEY_ENV] = KEY
    config = LocalServerConfig(model=DEFAULT_MODEL, adapters=(f"filter={DEFAULT_FILTER_NAME}",),
                               port=0, access_log=False, api_key_env=KEY_ENV)
    try:
        with LocalServer(config) as running:
            yield running
    finally:
        del os.environ[KEY_ENV]


@pytest.fixture(scope="module")
def in_process(embedded_model_dir: Path) -> HFBackend:
    """The shipped filter in-process, as the server runs it (float32 on a CPU)."""
    adapter = resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL)
    return HFBackend(HFBackendConfig(model=DEFAULT_MODEL, adapter=str(adapter), device="cpu",
                                     dtype="float32"))


def root(server: LocalServer) -> str:
    """Cohere's base URL: the server's root (the SDK adds v1/ or v2/ itself)."""
    return server.base_url.removesuffix("/v1")


def expected(backend: HFBackend, texts: list[str]) -> dict[int, RerankResult]:
    """MCF in-process with the shipped card's combination, as the server ranks."""
    combination = adapter_combination(resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL))
    ranked = rank_by_filter(backend, MCFConfig(), QUERY, as_documents(texts), combination)
    return {r.index: r for r in ranked}


def test_the_v1_client_reranks_with_the_shipped_filter(server: LocalServer,
                                                       in_process: HFBackend) -> None:
    client = cohere.Client(api_key=KEY, base_url=root(server))
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1], "title": "Tamsin"}, *DOCUMENTS[2:]]
    raw = client.with_raw_response.rerank(
        model="filter", query=QUERY, documents=documents, top_n=3, return_documents=True,
        rank_fields=["text"], max_chunks_per_doc=1)
    # rank_fields ["text"] is what the server does anyway (a field policy `OnlyAt`).
    assert raw.headers[IGNORED_HEADER] == "documents[].title"  # max_chunks_per_doc is read
    results = raw.data.results
    reference = expected(in_process, DOCUMENTS)
    best = sorted(reference.values(), key=lambda r: -r.relevance_score)[:3]
    assert [r.index for r in results] == [r.index for r in best]
    assert [r.relevance_score for r in results] == pytest.approx(
        [r.relevance_score for r in best], abs=1e-4)
    assert [r.document.text for r in results] == [DOCUMENTS[r.index] for r in results]
    assert results[0].index in (1, 3)  # a document about her, first


def test_the_v2_client_reranks_with_the_shipped_filter(server: LocalServer,
                                                       in_process: HFBackend) -> None:
    client = cohere.ClientV2(api_key=KEY, base_url=root(server))
    reply = client.rerank(model="filter", query=QUERY, documents=DOCUMENTS, priority=0)
    reference = expected(in_process, DOCUMENTS)
    assert sorted(r.index for r in reply.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in reply.results]
    assert scores == sorted(scores, reverse=True)
    for result in reply.results:
        assert result.relevance_score == pytest.approx(
            reference[result.index].relevance_score, abs=1e-4)
        assert result.kept == reference[result.index].kept  # sieverag's verdict, beside
    assert reply.id.startswith("rerank-") and reply.meta.api_version.version == "2"
    assert reply.meta.billed_units.search_units == 1
    # The shipped card ranks by BM25 + dense alone: no document is sent to the filter.
    assert reply.meta.tokens.input_tokens == 0 and reply.meta.tokens.output_tokens == 0
    assert len(client.rerank(model="filter", query=QUERY, documents=DOCUMENTS,
                             top_n=2).results) == 2


def test_max_tokens_per_doc_judges_each_document_on_its_first_tokens(
    server: LocalServer, in_process: HFBackend
) -> None:
    client = cohere.ClientV2(api_key=KEY, base_url=root(server))
    texts = [LATE, DOCUMENTS[0]]
    whole = {r.index: r.relevance_score for r in client.rerank(
        model="filter", query=QUERY, documents=texts).results}
    cut = {r.index: r.relevance_score for r in client.rerank(
        model="filter", query=QUERY, documents=texts, max_tokens_per_doc=12).results}
    tokenizer = server.engine.served.tokenizer
    shortened = cut_to_tokens(tokenizer, texts, 12)
    assert len(tokenizer(shortened[0], add_special_tokens=False)["input_ids"]) == 12
    assert shortened[1] == texts[1]  # short enough already
    reference = expected(in_process, shortened)
    assert cut == pytest.approx({i: r.relevance_score for i, r in reference.items()}, abs=1e-4)
    # Each call scores as MCF does in-process on the texts it judged; the cut document's
    # text changed, so its score did (a score reads the round's other passages too).
    whole_reference = expected(in_process, texts)
    assert whole == pytest.approx({i: r.relevance_score for i, r in whole_reference.items()},
                                  abs=1e-4)
    assert abs(whole[0] - cut[0]) > 1e-3


def test_refusals_are_the_sdks_errors(server: LocalServer) -> None:
    client = cohere.ClientV2(api_key=KEY, base_url=root(server))
    with pytest.raises(cohere.BadRequestError) as refused:
        client.rerank(model="filter", query=QUERY, documents=DOCUMENTS, request_options={
            "additional_body_parameters": {"relevant_spans": {"mode": "enabled"}}})
    assert refused.value.body["error"]["param"] == "relevant_spans"
    with pytest.raises(cohere.NotFoundError):
        client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS)
    stranger = cohere.ClientV2(api_key="sk-wrong", base_url=root(server))
    with pytest.raises(cohere.UnauthorizedError):
        stranger.rerank(model="filter", query=QUERY, documents=DOCUMENTS)
    with pytest.raises(cohere.UnauthorizedError):
        cohere.Client(api_key="sk-wrong", base_url=root(server)).rerank(
            model="filter", query=QUERY, documents=DOCUMENTS)


def test_the_sdk_reads_the_pruned_text_and_spans(server: LocalServer) -> None:
    """sieverag's return_spans through the SDK's extra body parameters: each result keeps
    `pruned_text` and `spans` as extra attributes."""
    client = cohere.ClientV2(api_key=KEY, base_url=root(server))
    reply = client.rerank(model="filter", query=QUERY, documents=DOCUMENTS, request_options={
        "additional_body_parameters": {"return_spans": True}})
    for result in reply.results:
        text = DOCUMENTS[result.index]
        spans = result.spans
        assert [text[s["start"]:s["end"]] for s in spans if s["kept"]] == list(
            result.key_sentences)
        assert result.pruned_text in ((text, " ".join(result.key_sentences)) if result.kept
                                      else ("",))


def best_of(reference: dict[int, RerankResult], top_n: int) -> list[RerankResult]:
    return sorted(reference.values(), key=lambda r: -r.relevance_score)[:top_n]


def test_langchains_cohere_reranker_ranks_with_the_filter(server: LocalServer,
                                                          in_process: HFBackend) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model="filter", cohere_api_key=KEY, base_url=root(server), top_n=2)
    documents = [Document(page_content=text, metadata={"n": i})
                 for i, text in enumerate(DOCUMENTS)]
    compressed = reranker.compress_documents(documents, QUERY)
    best = best_of(expected(in_process, DOCUMENTS), 2)
    assert [d.metadata["n"] for d in compressed] == [r.index for r in best]
    assert [d.metadata["relevance_score"] for d in compressed] == pytest.approx(
        [r.relevance_score for r in best], abs=1e-4)


def test_llamaindexs_cohere_reranker_ranks_with_the_filter(server: LocalServer,
                                                           in_process: HFBackend) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(top_n=2, model="filter", api_key=KEY, base_url=root(server),
                            max_retries=1)
    nodes = [NodeWithScore(node=TextNode(text=text, id_=str(i)), score=0.0)
             for i, text in enumerate(DOCUMENTS)]
    ranked = reranker.postprocess_nodes(nodes, query_str=QUERY)
    best = best_of(expected(in_process, DOCUMENTS), 2)
    assert [n.node.node_id for n in ranked] == [str(r.index) for r in best]
    assert [n.score for n in ranked] == pytest.approx([r.relevance_score for r in best],
                                                      abs=1e-4)


def test_a_served_filter_role_named_filter_ranks_with_the_shipped_card(
        server: LocalServer) -> None:
    """/v1/models shows each adapter's card (the base model none, and OpenAI's client still
    reads the list), so the served-eval example of docs/serving/index.md
    (`--models.filter.model filter` on a server started with `--adapters
    filter=smollm2-filter`) ranks with the shipped card's combination."""
    import httpx
    import openai

    from sieverag.inference.filters.card.card_file import read_card
    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    shipped_folder = resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL)
    entries = {m["id"]: m for m in httpx.get(
        f"{server.base_url}/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]}
    assert entries["filter"]["filter_card"] == read_card(shipped_folder)
    assert "filter_card" not in entries[DEFAULT_MODEL]
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == list(entries)
    role = BackendSpec(endpoint=server.base_url, model="filter", api_key_env=KEY_ENV)
    shipped = adapter_combination(shipped_folder)
    card = filter_card(role)
    assert shipped.fitted and card.combination == shipped
    assert "/models shows for 'filter'" in card.source
