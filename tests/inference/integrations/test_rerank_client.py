"""RerankEndpoint, the framework adapters' client, on scripted replies: what it keeps from a
reply, a reranker without verdicts, and every reply it cannot read as one clear error; the
server's results and the client's are one model (`RerankResult`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import RerankResult
from sieverag.inference.integrations.rerank_client import RerankEndpoint, RerankEndpointError
from sieverag.serving.api.bodies import to_json
from sieverag.serving.api.rerank.dialects.cohere import rerank_response

URL = "http://127.0.0.1:9/v1"
TEXTS = ["a", "b", "c"]


def scripted(monkeypatch: pytest.MonkeyPatch, status: int, **reply: Any) -> list[dict]:
    """Answer the next POSTs with `reply` (json= or content=); the request bodies sent."""
    sent = []

    def post(url: str, *, json: dict, headers: dict, timeout: float) -> httpx.Response:
        sent.append({"url": url, "json": json, "headers": headers})
        return httpx.Response(status, request=httpx.Request("POST", url), **reply)

    monkeypatch.setattr(httpx, "post", post)
    return sent


SIEVERAG_REPLY = {"results": [
    {"index": 2, "relevance_score": 0.9, "kept": True},
    {"index": 0, "relevance_score": 0.7, "kept": False},
    {"index": 1, "relevance_score": 0.4, "kept": True}]}
# A Cohere/Jina-schema reranker without sieverag's verdicts (vLLM's own /v1/rerank).
PLAIN_REPLY = {"results": [{"index": 1, "relevance_score": 0.8},
                           {"index": 2, "relevance_score": 0.5},
                           {"index": 0, "relevance_score": 0.1}]}


def test_keep_selects_from_the_reply_and_the_request_asks_for_every_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent = scripted(monkeypatch, 200, json=SIEVERAG_REPLY)
    kept = RerankEndpoint(base_url=URL + "/", api_key="sk-x").select("q?", TEXTS)
    assert [(r.index, r.kept) for r in kept] == [(2, True), (1, True)]
    assert sent == [{"url": f"{URL}/rerank", "headers": {"Authorization": "Bearer sk-x"},
                     "json": {"model": "filter", "query": "q?", "documents": TEXTS,
                              "return_documents": False, "granularity": "chunk"}}]
    assert [r.index for r in RerankEndpoint(base_url=URL, top_n=1).select("q?", TEXTS)] == [2]
    top = RerankEndpoint(base_url=URL, keep="top_n", top_n=2).select("q?", TEXTS)
    assert [(r.index, r.relevance_score) for r in top] == [(2, 0.9), (0, 0.7)]
    assert sent[-1]["headers"] == {}


def test_a_reranker_without_verdicts_serves_keep_top_n_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, 200, json=PLAIN_REPLY)
    top = RerankEndpoint(base_url=URL, keep="top_n", top_n=2).select("q?", TEXTS)
    assert [(r.index, r.kept) for r in top] == [(1, None), (2, None)]
    assert top[0].metadata() == {"relevance_score": 0.8}
    with pytest.raises(RerankEndpointError, match="gives no `kept` verdicts.*keep='top_n'"):
        RerankEndpoint(base_url=URL).select("q?", TEXTS)


def test_key_sentences_replace_the_text_when_there_are_some() -> None:
    narrowed = RerankResult(0, 0.9, True, ("One.", "Three."))
    assert narrowed.text("One. Two. Three.") == "One. Three."
    assert narrowed.metadata() == {"relevance_score": 0.9, "kept": True,
                                   "key_sentences": ["One.", "Three."]}
    assert RerankResult(1, 0.2, False, ()).text("Full text.") == "Full text."
    assert RerankResult(1, 0.2, False, None).text("Full text.") == "Full text."


def test_the_servers_results_are_what_the_client_reads() -> None:
    ranked = [RerankResult(0, 0.2, False, ()), RerankResult(1, 0.9, True, ("One.",))]
    body = json.loads(to_json(rerank_response("filter", ranked, ["Zero.", "One. Two."],
                                              top_n=None, return_documents=True,
                                              total_tokens=7)))
    assert body["results"] == [
        {"index": 1, "relevance_score": 0.9, "kept": True, "key_sentences": ["One."],
         "document": {"text": "One. Two."}},
        {"index": 0, "relevance_score": 0.2, "kept": False, "key_sentences": [],
         "document": {"text": "Zero."}}]
    assert [RerankResult.from_json(r) for r in body["results"]] == [
        replace(ranked[1], document={"text": "One. Two."}),
        replace(ranked[0], document={"text": "Zero."})]
    short = json.loads(to_json(rerank_response("filter", ranked, ["Zero.", "One. Two."],
                                               top_n=1, return_documents=False,
                                               total_tokens=7)))["results"]
    assert short == [{"index": 1, "relevance_score": 0.9, "kept": True,
                      "key_sentences": ["One."]}]


@pytest.mark.parametrize(("reply", "problem"), [
    ({"content": b"<html>oops</html>"}, "not a rerank response"),
    ({"json": {"data": []}}, "not a rerank response"),
    ({"json": {"results": [{"index": 0}]}}, "not a rerank response"),
    ({"json": {"results": [{"index": "0", "relevance_score": 0.5}]}}, "not a rerank response"),
    ({"json": {"results": [{"index": 0, "relevance_score": 0.5, "kept": "yes"}]}},
     "not a rerank response"),
    ({"json": {"results": [{"index": 0, "relevance_score": 0.5, "kept": True,
                            "key_sentences": "One."}]}}, "not a rerank response"),
    ({"json": {"results": [{"index": 0, "relevance_score": 0.5, "kept": True},
                           {"index": 0, "relevance_score": 0.4, "kept": True}]}},
     r"indices \[0, 0\] for 3 documents"),
])
def test_a_reply_it_cannot_read_is_one_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                   reply: dict, problem: str) -> None:
    scripted(monkeypatch, 200, **reply)
    with pytest.raises(RerankEndpointError, match=f"the rerank endpoint {URL}/rerank sent a "
                       f"reply sieverag cannot read: .*{problem}"):
        RerankEndpoint(base_url=URL, keep="top_n").select("q?", TEXTS)


def test_sentence_granularity_needs_key_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, 200, json=SIEVERAG_REPLY)
    with pytest.raises(RerankEndpointError, match="no key_sentences at granularity"):
        RerankEndpoint(base_url=URL, granularity="sentence").select("q?", TEXTS)


def test_a_refusal_names_the_endpoint_and_the_servers_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, 400, json={"error": {"message": "document 1 does not fit"}})
    with pytest.raises(RerankEndpointError, match=f"{URL}/rerank refused the request with "
                       "HTTP 400: document 1 does not fit; check the documents"):
        RerankEndpoint(base_url=URL).select("q?", TEXTS)
    scripted(monkeypatch, 502, content=b"Bad Gateway")
    with pytest.raises(RerankEndpointError, match="HTTP 502: Bad Gateway; check the server log"):
        RerankEndpoint(base_url=URL).select("q?", TEXTS)


@pytest.mark.parametrize(("settings", "named"), [
    ({"base_url": "127.0.0.1:8000/v1"}, "base_url"), ({"model": ""}, "model"),
    ({"keep": "all"}, "keep"), ({"granularity": "word"}, "granularity"),
    ({"top_n": 0}, "top_n"), ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_settings_are_refused_by_name(settings: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RerankEndpoint(**settings)
