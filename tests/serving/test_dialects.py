"""Every common reranker dialect against /v1/rerank (and vLLM's /v1/score), driven by the real
client packages where they are installed (Voyage's `voyageai`, LiteLLM's `rerank` on each of
its reranker routes) and by each dialect's documented request otherwise (TEI's, Jina's,
Infinity's, vLLM's): each gets the filter's ranking in its own shape, and every mix of
dialects or query too long is one clear 400, and a document of any length is read."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from rerank_server import http_at_root, post, root  # noqa: F401 (http_at_root: the http fixture)

from sieverag.inference.filters.mcf import MCFConfig
from sieverag.serving.api.endpoint_base import ServingContext
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
from sieverag.serving.refusals import APIError

QUERY = "Where was Liora Tamsin born?"
TEXTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer.",
    "Quorrin is a port town. Liora Tamsin grew up there.",
    "The Calder Bridge opened in 1901. It crosses a gorge.",
    "Penguins huddle together in winter.",
]
# Far more tokens than the tiny model's 1,024-token context.
TOO_LONG = "Liora Tamsin mapped the coast of Quorrin. " * 400


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path) -> Iterator[LocalServer]:
    # No card: BM25 + dense rank; the filter still reads every chunk (its tokens counted).
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"filter={adapter_dir}",),
                               rerank=MCFConfig(always_score_chunks=True),
                               port=0, access_log=False)
    with LocalServer(config) as running:
        yield running


def cohere_scores(http: httpx.Client, texts: list[str] = TEXTS) -> dict[int, float]:
    """Each document's relevance_score in the Cohere dialect: what every dialect must equal."""
    body = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "documents": texts})
    return {r["index"]: r["relevance_score"] for r in body["results"]}


def refused(http: httpx.Client, path: str, body: dict[str, Any], param: str) -> str:
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    return error["message"]


# ----- the documented request shapes -----

def test_tei_texts_get_a_bare_array_of_the_filters_scores(http: httpx.Client) -> None:
    expected = cohere_scores(http)
    answer = post(http, "/rerank", {"query": QUERY, "texts": TEXTS, "return_text": True,
                                    "truncate": False, "truncation_direction": "Right",
                                    "raw_scores": False})
    assert isinstance(answer, list) and len(answer) == len(TEXTS)
    assert [r["score"] for r in answer] == sorted((r["score"] for r in answer), reverse=True)
    assert {r["index"]: r["score"] for r in answer} == pytest.approx(expected, abs=1e-6)
    assert all(r["text"] == TEXTS[r["index"]] and isinstance(r["kept"], bool) for r in answer)
    plain = post(http, "/rerank", {"query": QUERY, "texts": TEXTS})
    assert all(set(r) == {"index", "score", "kept", "bar_rule", "calibrated"} for r in plain)


def test_raw_scores_are_the_logits_of_the_probabilities(http: httpx.Client) -> None:
    expected = cohere_scores(http)
    raw = post(http, "/rerank", {"query": QUERY, "texts": TEXTS, "raw_scores": True})
    assert {r["index"]: r["score"] for r in raw} == pytest.approx(
        {i: math.log(p / (1 - p)) for i, p in expected.items()}, abs=1e-4)
    # Infinity's client sends raw_scores with documents, and reads each document as a string.
    infinity = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "top_n": 2,
                                         "documents": TEXTS, "raw_scores": True,
                                         "return_documents": True})
    assert infinity["object"] == "rerank" and len(infinity["results"]) == 2
    assert {r["index"]: r["relevance_score"] for r in infinity["results"]} == pytest.approx(
        {r["index"]: r["score"] for r in raw[:2]}, abs=1e-6)
    assert [r["document"] for r in infinity["results"]] == [
        TEXTS[r["index"]] for r in infinity["results"]]


def test_jina_gets_documents_only_when_it_asks(http: httpx.Client) -> None:
    body = {"model": "filter", "query": QUERY, "documents": [{"text": t} for t in TEXTS],
            "top_n": 2}
    plain = post(http, "/v1/rerank", body)["results"]
    assert len(plain) == 2 and all("document" not in r for r in plain)
    asked = post(http, "/v1/rerank", {**body, "return_documents": True})["results"]
    assert [r["document"] for r in asked] == [{"text": TEXTS[r["index"]]} for r in asked]


def test_voyage_gets_data_with_document_strings(http: httpx.Client) -> None:
    expected = cohere_scores(http)
    body = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "documents": TEXTS,
                                     "top_k": 2, "truncation": True,
                                     "return_documents": True})
    assert body["object"] == "list" and body["model"] == "filter" and "results" not in body
    assert body["usage"]["total_tokens"] > 0
    data = body["data"]
    best = sorted(expected, key=lambda i: -expected[i])[:2]
    assert [d["index"] for d in data] == best
    assert [d["document"] for d in data] == [TEXTS[i] for i in best]
    assert [d["relevance_score"] for d in data] == pytest.approx([expected[i] for i in best],
                                                                 abs=1e-6)


def test_vllm_truncation_fields_are_honoured(http: httpx.Client) -> None:
    body = {"model": "filter", "query": QUERY, "documents": [TEXTS[0], TOO_LONG]}
    windows = post(http, "/v1/rerank", body)  # read window by window
    cut = post(http, "/v1/rerank", {**body, "truncate_prompt_tokens": -1})  # one window
    assert sorted(r["index"] for r in cut["results"]) == [0, 1]
    assert cut["usage"]["total_tokens"] < windows["usage"]["total_tokens"]
    tight = post(http, "/v1/rerank", {**body, "truncate_prompt_tokens": 200,
                                      "truncation_side": "left"})
    assert tight["usage"]["total_tokens"] <= 2 * 200
    # The query cut to its first 3 tokens is another query: other scores.
    short_query = post(http, "/v1/rerank", {"model": "filter", "query": QUERY,
                                            "documents": TEXTS, "max_tokens_per_query": 3})
    assert {r["index"]: r["relevance_score"] for r in short_query["results"]} != \
        pytest.approx(cohere_scores(http), abs=1e-9)


def test_score_pairs_one_query_with_each_document(http: httpx.Client) -> None:
    expected = cohere_scores(http)
    for spelling in ({"text_1": QUERY, "text_2": TEXTS}, {"queries": QUERY, "documents": TEXTS},
                     {"text_1": [QUERY], "text_2": TEXTS}):
        body = post(http, "/v1/score", {"model": "filter", **spelling})
        assert body["object"] == "list" and body["model"] == "filter"
        assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
        assert all(d["object"] == "score" for d in body["data"])
        assert [d["score"] for d in body["data"]] == pytest.approx(
            [expected[i] for i in range(len(TEXTS))], abs=1e-6)
        assert body["usage"]["prompt_tokens"] > 0
    # Two lists of one length are scored pair by pair (each query its own round).
    pairs = post(http, "/score", {"model": "filter", "text_1": [QUERY, "What opened in 1901?"],
                                  "text_2": TEXTS[:2]})
    assert [d["index"] for d in pairs["data"]] == [0, 1]


# ----- the real clients -----

def test_voyages_client_reranks_with_the_filter(server: LocalServer,
                                               http: httpx.Client) -> None:
    voyageai = pytest.importorskip("voyageai")
    expected = cohere_scores(http)
    client = voyageai.Client(api_key="unused", base_url=server.base_url, max_retries=0)
    reply = client.rerank(QUERY, TEXTS, model="filter", top_k=3)
    assert [r.index for r in reply.results] == sorted(expected, key=lambda i: -expected[i])[:3]
    assert [r.relevance_score for r in reply.results] == pytest.approx(
        sorted(expected.values(), reverse=True)[:3], abs=1e-6)
    assert [r.document for r in reply.results] == [TEXTS[r.index] for r in reply.results]
    assert reply.total_tokens > 0


@pytest.mark.parametrize(("provider", "base"), [
    ("cohere", ""), ("jina_ai", ""), ("infinity", ""), ("hosted_vllm", ""),
    ("huggingface", ""), ("voyage", "/v1"),
])
def test_litellm_reranks_on_each_of_its_reranker_routes(
        server: LocalServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch,
        provider: str, base: str) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    litellm = pytest.importorskip("litellm")
    expected = cohere_scores(http)
    # LiteLLM's infinity route sends no raw_scores, so the server cannot tell it from Cohere's
    # and would send each document as {text}, which that route cannot read: it asks for none.
    documents = {"return_documents": False} if provider == "infinity" else {}
    reply = litellm.rerank(model=f"{provider}/filter", query=QUERY, documents=TEXTS, top_n=3,
                           api_base=root(server) + base, api_key="unused", **documents)
    best = sorted(expected, key=lambda i: -expected[i])[:3]
    assert [r["index"] for r in reply.results] == best
    assert [r["relevance_score"] for r in reply.results] == pytest.approx(
        [expected[i] for i in best], abs=1e-6)


# ----- abuse -----

@pytest.mark.parametrize(("body", "param", "says"), [
    ({"texts": TEXTS, "documents": TEXTS}, "texts", "both texts (TEI) and documents"),
    ({"documents": TEXTS, "top_k": 2, "top_n": 2}, "top_k", "both top_n and top_k"),
    ({"texts": TEXTS, "return_text": True, "return_documents": True}, "return_text",
     "two dialects' spellings of one setting"),
    ({"texts": TEXTS, "truncate": True, "truncate_prompt_tokens": 9},
     "truncate_prompt_tokens", "both truncate and truncate_prompt_tokens"),
    ({"texts": TEXTS, "top_k": 2}, "top_k", "top_k is not a TEI field"),
    ({"documents": TEXTS, "return_text": True}, "return_text", "TEI sends its documents as "
     "texts"),
    ({"documents": TEXTS, "top_k": 2, "truncation_side": "left"}, "truncation_side",
     "Voyage's top_k and vLLM's truncation_side"),
    ({}, "documents", "documents is missing"),
    ({"texts": []}, "texts", "texts is an empty list"),
    ({"texts": [1, 2]}, "texts", "texts must be a list of strings"),
    ({"documents": TEXTS, "truncation_direction": "Up"}, "truncation_direction", ""),
    ({"documents": TEXTS, "rank_fields": ["title"]}, "rank_fields", "text only"),
    ({"documents": TEXTS, "instruction": "Be kind."}, "instruction", "fixed by its card"),
    ({"documents": TEXTS, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", ""),
])
def test_mixed_and_malformed_dialect_fields_are_refused(http: httpx.Client,
                                                        body: dict[str, Any], param: str,
                                                        says: str) -> None:
    message = refused(http, "/v1/rerank", {"model": "filter", "query": QUERY, **body}, param)
    assert says in message


@pytest.mark.parametrize(("field", "extra"), [
    ("documents", {}), ("texts", {}), ("documents", {"top_k": 1}),
])
def test_101_documents_are_refused_in_every_dialect(http: httpx.Client, field: str,
                                                    extra: dict[str, Any]) -> None:
    body = {"model": "filter", "query": QUERY, field: ["A line."] * 101, **extra}
    message = refused(http, "/v1/rerank", body, field)
    assert "101 documents" in message and "at most 100" in message


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/rerank", {"documents": [TEXTS[0], TOO_LONG]}, "query"),
    ("/v2/rerank", {"documents": [TEXTS[0], TOO_LONG]}, "query"),
    ("/rerank", {"texts": [TEXTS[0], TOO_LONG], "truncate": True}, "query"),
    ("/v1/rerank", {"documents": [TEXTS[0], TOO_LONG], "top_k": 2}, "query"),
    ("/v1/score", {"text_2": [TEXTS[0], TOO_LONG]}, "text_1"),
])
def test_a_query_too_long_for_a_windows_prompt_is_refused_naming_it(
        http: httpx.Client, path: str, body: dict[str, Any], param: str) -> None:
    """A document of any length is read window by window: only the query can make a
    window's prompt overflow the context, and the refusal names it."""
    query = "Where was Liora Tamsin born? " * 200
    sent = {"model": "filter", **body}
    sent.update({"text_1": query} if path == "/v1/score" else {"query": query})
    message = refused(http, path, sent, param)
    assert message.startswith("the query is too long") and "shorten the query" in message


@pytest.mark.parametrize(("path", "body"), [
    ("/rerank", {"texts": [TEXTS[0], TOO_LONG], "truncate": True}),
    ("/rerank", {"texts": [TEXTS[0], TOO_LONG], "truncate": True,
                 "truncation_direction": "Left"}),
    ("/v1/rerank", {"documents": [TEXTS[0], TOO_LONG], "truncation": True}),
    ("/v1/rerank", {"documents": [TEXTS[0], TOO_LONG], "top_k": 2}),  # Voyage cuts by default
    ("/v1/rerank", {"documents": [TEXTS[0], TOO_LONG]}),  # read window by window
    ("/rerank", {"texts": [TEXTS[0], TOO_LONG]}),
    ("/v1/score", {"text_1": QUERY, "text_2": [TEXTS[0], TOO_LONG]}),
    ("/v1/score", {"text_1": QUERY, "text_2": [TEXTS[0], TOO_LONG],
                   "truncate_prompt_tokens": -1}),
])
def test_an_oversized_document_is_read_or_cut_where_the_dialect_asks(
        http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    post(http, path, {"model": "filter", "query": QUERY, **body})


@pytest.mark.parametrize(("body", "param"), [
    ({"text_1": QUERY}, "text_2"),
    ({"text_2": TEXTS}, "text_1"),
    ({"text_1": [QUERY, QUERY], "text_2": TEXTS}, "text_1"),
    ({"text_1": QUERY, "queries": QUERY, "text_2": TEXTS}, "queries"),
    ({"text_1": QUERY, "text_2": []}, "text_2"),
])
def test_malformed_score_requests_are_refused(http: httpx.Client, body: dict[str, Any],
                                              param: str) -> None:
    refused(http, "/v1/score", {"model": "filter", **body}, param)


@pytest.mark.parametrize(("names", "refusal"), [
    (["base"], "serves 0 adapters"), (["base", "a", "b"], "serves 2 adapters")])
def test_a_request_without_model_needs_a_server_with_one_adapter(names: list[str],
                                                                 refusal: str) -> None:
    context = SimpleNamespace(served=SimpleNamespace(names=names))
    with pytest.raises(APIError) as caught:
        ServingContext.model_of(context, None)  # type: ignore[arg-type]
    assert caught.value.param == "model" and refusal in caught.value.message
    one = SimpleNamespace(served=SimpleNamespace(names=["base", "f"]))
    assert ServingContext.model_of(one, None) == "f"  # type: ignore[arg-type]
