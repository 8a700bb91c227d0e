"""What the filter kept, from /v1/rerank (`granularity: "sentence"` or `return_spans: true`):
each result's `pruned_text` is exactly what the filtering proxy forwards for that document,
on the repository's HotpotQA samples with the shipped filter on the embedded SmolLM2 (one
server is both); its `spans` locate every sentence in the document as sent (also one cut at
its start), mark the key ones, and the dialects carry them; malformed spans requests are
refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer
from repo_paths import TEST_DATA

from sieverag.inference.core.types import Document, RerankResult
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.retrieval.sentences import split_sentences
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
from sieverag.serving.proxy.marked_documents import Passage, documents_block

pytestmark = pytest.mark.integration

SAMPLES = TEST_DATA / "hotpotqa_heldout_sample.jsonl"
QUESTIONS = 2  # of the samples' questions
PASSAGES = 4  # each question's first passages


def samples() -> list[tuple[str, list[str]]]:
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines()[:QUESTIONS]]
    return [(row["question"], [p["text"] for p in row["passages"][:PASSAGES]]) for row in rows]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(embedded_model_dir: Path, upstream: FakeOpenAIServer) -> Iterator[LocalServer]:
    """The shipped filter on the embedded model: the rerank endpoint and the proxy."""
    config = LocalServerConfig(model=DEFAULT_MODEL, adapters=(f"filter={DEFAULT_FILTER_NAME}",),
                               port=0, access_log=False, proxy_to=upstream.base_url)
    with LocalServer(config) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def ranked(http: httpx.Client) -> list[tuple[str, list[str], list[RerankResult]]]:
    """Each sample question's passages ranked at sentence granularity, with their spans."""
    out = []
    for question, texts in samples():
        reply = http.post("/rerank", json={"model": "filter", "query": question,
                                           "documents": texts, "return_spans": True})
        assert reply.status_code == 200, reply.text
        results = [RerankResult.from_json(r) for r in reply.json()["results"]]
        out.append((question, texts, sorted(results, key=lambda r: r.index)))
    return out


def test_pruned_text_is_what_the_proxy_forwards(
        http: httpx.Client, upstream: FakeOpenAIServer,
        ranked: list[tuple[str, list[str], list[RerankResult]]]) -> None:
    narrowed = 0
    for question, texts, results in ranked:
        reply = http.post("/chat/completions", json={
            "model": "generator", "max_tokens": 4, "granularity": "sentence",
            "documents": texts, "messages": [{"role": "user", "content": question}]})
        assert reply.status_code == 200, reply.text
        info = reply.json()["sieverag"]
        assert set(info["kept"]) == {r.index for r in results if r.kept}
        pruned = {r.index: r.pruned_text for r in results}
        block = documents_block([Passage(str(i + 1), Document(id=str(i), text=pruned[i]))
                                 for i in info["kept"]])
        sent = upstream.requests[-1].json["messages"][-1]["content"]
        assert sent == f"{block}\n\n{question}"
        assert all(pruned[r.index] == "" and r.key_sentences == () for r in results
                   if not r.kept)
        narrowed += sum(r.kept and pruned[r.index] != texts[r.index] for r in results)
    assert narrowed > 0  # the filter cut some kept passage to its key sentences


def test_spans_locate_every_sentence_and_mark_the_key_ones(
        ranked: list[tuple[str, list[str], list[RerankResult]]]) -> None:
    for _, texts, results in ranked:
        for result in results:
            text = texts[result.index]
            assert result.spans is not None
            assert [text[s.start:s.end] for s in result.spans] == split_sentences(text)
            key = tuple(text[s.start:s.end] for s in result.spans if s.kept)
            assert key == result.key_sentences
            assert all(s.score is None for s in result.spans)  # a two-stage filter's
            if result.kept and result.pruned_text != text:  # narrowed: the key sentences
                assert result.pruned_text == " ".join(key)


def test_each_dialect_carries_the_spans(server: LocalServer, http: httpx.Client,
                                        ranked: list[tuple[str, list[str], list[RerankResult]]]
                                        ) -> None:
    question, texts, results = ranked[0]
    expected = {r.index: (r.to_json()["pruned_text"], r.to_json()["spans"]) for r in results}
    v2 = server.base_url.removesuffix("/v1") + "/v2/rerank"
    bodies = {"/rerank": [{"query": question, "texts": texts},  # TEI
                          {"model": "filter", "query": question, "documents": texts,
                           "top_k": 10},  # Voyage
                          {"model": "filter", "query": question, "documents": texts,
                           "raw_scores": False}],  # Infinity
              v2: [{"model": "filter", "query": question, "documents": texts}]}
    for path, dialects in bodies.items():
        for body in dialects:
            reply = http.post(path, json={**body, "return_spans": True})
            assert reply.status_code == 200, (body, reply.text)
            answer = reply.json()
            entries = (answer if isinstance(answer, list) else
                       answer.get("data") or answer["results"])
            assert {e["index"]: (e["pruned_text"], e["spans"]) for e in entries} == expected


def test_spans_of_a_document_cut_at_its_start_count_from_the_text_as_sent(
        http: httpx.Client) -> None:
    """vLLM's truncate_prompt_tokens with truncation_side left cuts a document's start until
    its filter prompts fit: its spans are offsets into the whole text sent."""
    question, texts = samples()[0]
    long = " ".join(texts)
    reply = http.post("/rerank", json={"model": "filter", "query": question,
                                       "documents": [long, texts[0]], "return_spans": True,
                                       "truncate_prompt_tokens": 160, "truncation_side": "left"})
    assert reply.status_code == 200, reply.text
    spans = next(r for r in reply.json()["results"] if r["index"] == 0)["spans"]
    assert spans[0]["start"] > 0 and spans[-1]["end"] == len(long)
    # Each span after the first (which the cut may start mid-sentence) is a sentence as sent.
    assert all(long[s["start"]:s["end"]] in split_sentences(long) for s in spans[1:])


def test_return_spans_false_leaves_the_spans_out(http: httpx.Client) -> None:
    question, texts = samples()[0]
    reply = http.post("/rerank", json={"model": "filter", "query": question,
                                       "documents": texts[:2], "granularity": "sentence",
                                       "return_spans": False})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert all("spans" not in r and "pruned_text" in r and "key_sentences" in r
               for r in results)
    chunk = http.post("/rerank", json={"model": "filter", "query": question,
                                       "documents": texts[:2], "granularity": "chunk"})
    assert all(set(r) == {"index", "relevance_score", "kept", "bar_rule", "calibrated"}
               for r in chunk.json()["results"])


MALFORMED = [({"return_spans": True, "granularity": "chunk"}, "return_spans"),
             ({"return_spans": "yes"}, "return_spans"),
             ({"return_spans": 1}, "return_spans"),
             ({"return_spans": [True]}, "return_spans"),
             ({"return_spans": True, "granularity": "word"}, "granularity")]


@pytest.mark.parametrize(("path", "fields", "param"), [
    *[("/v1/rerank", *case) for case in MALFORMED],
    *[("/v2/rerank", *case) for case in MALFORMED],
    ("/v2/rerank", {"relevant_spans": {"mode": "enabled"}}, "relevant_spans")])
def test_malformed_spans_requests_are_refused(server: LocalServer, path: str, fields: dict,
                                              param: str) -> None:
    url = server.base_url.removesuffix("/v1") + path
    reply = httpx.post(url, json={"model": "filter", "query": "q?", "documents": ["a."],
                                  **fields}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error


def test_tei_spans_with_chunk_granularity_are_refused(http: httpx.Client) -> None:
    reply = http.post("/rerank", json={"query": "q?", "texts": ["a."], "return_spans": True,
                                       "granularity": "chunk"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "return_spans"
