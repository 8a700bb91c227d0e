"""`sieverag serve --proxy-to`: the embedded server's /v1/chat/completions as a filtering proxy
(tiny random model and a random LoRA adapter as the filter) in front of a scripted upstream,
over plain HTTP: both ways of marking documents rewritten to what in-process MCF keeps, the
`sieverag` field, unmarked requests forwarded byte for byte, streams relayed as they come,
the upstream's errors passed back, an upstream down or slow answered 502 or 504 in time, and
the proxy's own key."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer, Reply, chat_reply
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
from sieverag.serving.proxy.marked_documents import Passage, documents_block

KEY_ENV, KEY = "SIEVERAG_PROXY_TEST_KEY", "sk-proxy"
UPSTREAM_KEY_ENV, UPSTREAM_KEY = "SIEVERAG_PROXY_TEST_UPSTREAM_KEY", "sk-upstream"
QUESTION = "Where was Liora Tamsin born?"
DOCUMENTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
    "Her maps are kept in Ostmere.",
    {"text": "Penguins huddle together in winter.", "title": "Penguins"},
    "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    {"text": "Quorrin is a port town. Liora Tamsin grew up there."},
    "Tea is grown on terraced hills.",
]
AS_DOCUMENTS = [Document(id=str(i), text=d) if isinstance(d, str)
                else Document(id=str(i), text=d["text"], title=d.get("title", ""))
                for i, d in enumerate(DOCUMENTS)]
MAX_DOCUMENTS = 6


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@contextmanager
def proxy_server(model_dir: Path, adapter_dir: Path, proxy_to: str,
                 **options: object) -> Iterator[LocalServer]:
    config = LocalServerConfig(model=str(model_dir), adapters=(f"filter={adapter_dir}",),
                               port=0, access_log=False, proxy_to=proxy_to,
                               max_rerank_documents=MAX_DOCUMENTS, **options)
    with LocalServer(config) as running:
        yield running


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path,
           upstream: FakeOpenAIServer) -> Iterator[LocalServer]:
    """The proxy with a key of its own, sending the upstream another."""
    os.environ[KEY_ENV], os.environ[UPSTREAM_KEY_ENV] = KEY, UPSTREAM_KEY
    try:
        with proxy_server(tiny_model_dir, adapter_dir, upstream.base_url, proxy_timeout=5.0,
                          api_key_env=KEY_ENV, proxy_api_key_env=UPSTREAM_KEY_ENV) as running:
            yield running
    finally:
        del os.environ[KEY_ENV], os.environ[UPSTREAM_KEY_ENV]


@pytest.fixture()
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path, adapter_dir: Path) -> HFBackend:
    """The filter run in-process, as the proxy's MCF must run it."""
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(adapter_dir)))


def kept_by_mcf(backend: HFBackend, question: str, documents: list[Document],
                sentence_stage: bool = False) -> list[Document]:
    result = MultiGranularFilter(backend, MCFConfig(sentence_stage=sentence_stage)).select(
        question, documents)
    return [s.document for s in result.kept]


def passages(documents: list[Document], numbers: list[str] | None = None) -> list[Passage]:
    return [Passage(numbers[int(d.id)] if numbers else str(int(d.id) + 1), d)
            for d in documents]


def block_tokens(server: LocalServer, block: str) -> int:
    return len(server.engine.served.tokenizer(block, add_special_tokens=False)["input_ids"])


def chat(question: str = QUESTION, **fields: object) -> dict:
    return {"model": "generator", "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": question}], **fields}


def last_received(upstream: FakeOpenAIServer) -> dict:
    return upstream.requests[-1].json


# ----- marked documents -----

def test_documents_field_is_filtered_to_what_mcf_keeps(server: LocalServer, http: httpx.Client,
                                                       upstream: FakeOpenAIServer,
                                                       in_process: HFBackend) -> None:
    reply = http.post("/chat/completions", json=chat(documents=DOCUMENTS, seed=3))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    kept = kept_by_mcf(in_process, QUESTION, AS_DOCUMENTS)
    kept_indices = [int(d.id) for d in kept]
    assert len(kept) == 2  # MCF's default bar: the round's 2 best
    block = documents_block(passages(kept))
    saved = (block_tokens(server, documents_block(passages(AS_DOCUMENTS)))
             - block_tokens(server, block))
    assert body["sieverag"] == {
        "kept": kept_indices, "dropped": sorted(set(range(5)) - set(kept_indices)),
        "documents_in": 5, "documents_kept": 2, "granularity": "chunk",
        "bar_rule": "top_k: the 2 best kept: the card holds no fitted combination, so no "
                    "calibrated bar",
        "calibrated": False, "prompt_tokens_saved": saved}
    assert saved > 0
    assert json.loads(reply.headers["x-sieverag"]) == body["sieverag"]
    # The upstream's answer, with the field added.
    assert body["choices"][0]["message"]["content"].startswith("echo: <documents>")
    # Forwarded: the proxy's fields gone, the kept passages as a block before the question.
    sent = last_received(upstream)
    assert sent == {**chat(seed=3), "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"{block}\n\n{QUESTION}"}]}
    # The upstream gets its own key, never the proxy's.
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_documents_block_is_rewritten_in_place(http: httpx.Client, upstream: FakeOpenAIServer,
                                               in_process: HFBackend) -> None:
    texts = [d if isinstance(d, str) else d["text"] for d in DOCUMENTS]
    numbers = ["1", "2", "3", "4", "7"]  # a passage keeps the number it is written with
    lines = "\n".join(f"[{n}] {text}" for n, text in zip(numbers, texts, strict=True))
    before, after = "Use the documents.\n", f"\nQuestion: {QUESTION}"
    message = f"{before}<documents>\n{lines}\n</documents>{after}"
    reply = http.post("/chat/completions", json=chat(message))
    assert reply.status_code == 200, reply.text
    documents = [Document(id=str(i), text=t) for i, t in enumerate(texts)]
    # The filter's question: the message's text outside the block.
    kept = kept_by_mcf(in_process, f"Use the documents. Question: {QUESTION}", documents)
    assert reply.json()["sieverag"]["kept"] == [int(d.id) for d in kept]
    sent = last_received(upstream)["messages"][-1]["content"]
    assert sent == before + documents_block(passages(kept, numbers)) + after


def test_a_long_passage_is_judged_and_forwarded_by_its_best_window(
        http: httpx.Client, upstream: FakeOpenAIServer, in_process: HFBackend) -> None:
    """A passage longer than the filter's window is read window by window (as /v1/rerank and
    in-process MCF read it): what is forwarded of it is its best window; a blank one is
    dropped."""
    long = " ".join([f"Filler sentence number {i} says very little of use." for i in range(40)]
                    + ["Liora Tamsin was born in Quorrin, a port town."]
                    + [f"More filler, number {i}, about nothing." for i in range(20)])
    texts = [long, "Penguins huddle together in winter.", " ", "Tea is grown on hills."]
    reply = http.post("/chat/completions", json=chat(documents=texts))
    assert reply.status_code == 200, reply.text
    kept = kept_by_mcf(in_process, QUESTION, [Document(id=str(i), text=t)
                                              for i, t in enumerate(texts)])
    assert reply.json()["sieverag"]["kept"] == [int(d.id) for d in kept]
    assert 2 in reply.json()["sieverag"]["dropped"]
    (window,) = [d.text for d in kept if d.id == "0"]
    assert window in long and len(window) < len(long) / 2  # the random filter's best window
    sent = last_received(upstream)["messages"][-1]["content"]
    assert sent == f"{documents_block(passages(kept))}\n\n{QUESTION}"


def test_sentence_granularity_forwards_key_sentences(http: httpx.Client,
                                                     upstream: FakeOpenAIServer,
                                                     in_process: HFBackend) -> None:
    reply = http.post("/chat/completions", json=chat(documents=DOCUMENTS,
                                                     granularity="sentence"))
    assert reply.status_code == 200, reply.text
    kept = kept_by_mcf(in_process, QUESTION, AS_DOCUMENTS, sentence_stage=True)
    info = reply.json()["sieverag"]
    assert info["granularity"] == "sentence"
    assert info["kept"] == [int(d.id) for d in kept]
    sent = last_received(upstream)
    assert "granularity" not in sent and "documents" not in sent
    assert sent["messages"][-1]["content"] == f"{documents_block(passages(kept))}\n\n{QUESTION}"


def test_marked_stream_carries_the_verdict_in_a_header(http: httpx.Client,
                                                       upstream: FakeOpenAIServer) -> None:
    chunks = (b'data: {"choices": [{"delta": {"content": "Quorrin"}}]}\n\n', b"data: [DONE]\n\n")
    upstream.script(Reply(chunks=chunks))
    with http.stream("POST", "/chat/completions",
                     json=chat(documents=DOCUMENTS, stream=True)) as reply:
        assert reply.status_code == 200
        assert b"".join(reply.iter_raw()) == b"".join(chunks)
        info = json.loads(reply.headers["x-sieverag"])
    assert info["documents_in"] == 5 and info["documents_kept"] == 2
    sent = last_received(upstream)
    assert sent["stream"] is True and "documents" not in sent
    assert sent["messages"][-1]["content"].startswith("<documents>\n[")


def test_no_documents_is_no_work(http: httpx.Client, upstream: FakeOpenAIServer) -> None:
    reply = http.post("/chat/completions", json=chat(documents=[]))
    assert reply.status_code == 200, reply.text
    assert reply.json()["sieverag"] == {"kept": [], "dropped": [], "documents_in": 0,
                                        "documents_kept": 0, "granularity": "chunk",
                                        "bar_rule": None, "calibrated": None,
                                        "prompt_tokens_saved": 0}
    sent = last_received(upstream)["messages"][-1]["content"]
    assert sent == f"<documents>\n</documents>\n\n{QUESTION}"


# ----- passed through -----

def test_unmarked_request_is_forwarded_byte_for_byte(http: httpx.Client,
                                                     upstream: FakeOpenAIServer) -> None:
    # Odd spacing, key order, an unknown field and a closing tag alone: sent on as they are.
    raw = (b'{ "messages":[{"role":"user","content":"hi </documents> \\u00e9"}],'
           b'  "model" : "anything", "vendor_option": {"x": [1, 2.50]} }')
    upstream.script(Reply(body=b'{"id": "up",  "choices": []}',
                          headers={"x-upstream": "yes"}))
    reply = http.post("/chat/completions", content=raw,
                      headers={"Content-Type": "application/json"})
    assert reply.status_code == 200
    assert reply.content == b'{"id": "up",  "choices": []}'  # the upstream's bytes
    assert reply.headers["x-upstream"] == "yes" and "x-sieverag" not in reply.headers
    assert upstream.requests[-1].raw == raw
    # A body that is not JSON is the upstream's to refuse.
    upstream.script(Reply(status=400, body={"error": {"message": "bad json"}}))
    broken = http.post("/chat/completions", content=b"{not json",
                       headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["message"] == "bad json"
    assert upstream.requests[-1].raw == b"{not json"


def test_stream_is_relayed_chunk_by_chunk(http: httpx.Client,
                                          upstream: FakeOpenAIServer) -> None:
    """The first chunk reaches the client while the upstream still holds the rest (released
    by the client once it has it): the proxy does not wait for the whole stream."""
    gate = threading.Event()
    chunks = tuple(f'data: {{"n": {i}}}\n\n'.encode() for i in range(5)) + (b"data: [DONE]\n\n",)
    upstream.script(Reply(chunks=chunks, gate=gate))
    received = []
    start = time.monotonic()
    with http.stream("POST", "/chat/completions", json=chat(stream=True)) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for chunk in reply.iter_raw():
            if not received:
                first_after = time.monotonic() - start
                gate.set()
            received.append(chunk)
    assert b"".join(received) == b"".join(chunks)  # every chunk, in order
    assert first_after < 5  # before the upstream's 10 s gate gave up waiting


# ----- the upstream's failures -----

def test_upstream_error_passes_back_as_sent(http: httpx.Client,
                                            upstream: FakeOpenAIServer) -> None:
    error = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error",
                       "param": "max_tokens", "code": None}}
    for body in (chat(), chat(documents=DOCUMENTS)):
        upstream.script(Reply(status=400, body=error))
        reply = http.post("/chat/completions", json=body)
        assert reply.status_code == 400 and reply.json() == error
    assert "x-sieverag" in reply.headers  # the marked one: what was filtered before it failed
    upstream.script(Reply(status=503, body="overloaded", headers={"Retry-After": "3"}))
    reply = http.post("/chat/completions", json=chat())
    assert (reply.status_code, reply.text, reply.headers["retry-after"]) == (503, "overloaded",
                                                                              "3")
    # A 200 whose body the proxy cannot add its field to is the upstream's failure.
    upstream.script(Reply(body="<html>gateway</html>"))
    reply = http.post("/chat/completions", json=chat(documents=DOCUMENTS))
    assert reply.status_code == 502
    assert reply.json()["error"]["code"] == "upstream_bad_response"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_upstream_down_is_502(tiny_model_dir: Path, adapter_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with proxy_server(tiny_model_dir, adapter_dir, dead, proxy_timeout=5.0) as running:
        for body in (chat(), chat(documents=DOCUMENTS), chat(stream=True)):
            reply = httpx.post(f"{running.base_url}/chat/completions", json=body, timeout=60)
            assert reply.status_code == 502, reply.text
            error = reply.json()["error"]
            assert error["code"] == "upstream_unreachable"
            assert f"{dead}/chat/completions" in error["message"]


def test_slow_upstream_is_504_within_the_timeout(tiny_model_dir: Path, adapter_dir: Path,
                                                 upstream: FakeOpenAIServer) -> None:
    with proxy_server(tiny_model_dir, adapter_dir, upstream.base_url,
                      proxy_timeout=0.5) as running:
        url = f"{running.base_url}/chat/completions"
        for body in (chat(), chat(stream=True)):
            upstream.script(Reply(body=chat_reply("late"), delay_s=3.0))
            start = time.monotonic()
            reply = httpx.post(url, json=body, timeout=60)
            assert time.monotonic() - start < 2.5
            assert reply.status_code == 504, reply.text
            assert reply.json()["error"]["code"] == "upstream_timeout"
            assert "0.5 s" in reply.json()["error"]["message"]
        # A stream that stalls once under way ends with an error event, in time.
        gate = threading.Event()
        upstream.script(Reply(chunks=(b'data: {"n": 0}\n\n', b"data: [DONE]\n\n"), gate=gate,
                              gate_timeout_s=5.0))
        start = time.monotonic()
        with httpx.stream("POST", url, json=chat(stream=True), timeout=60) as reply:
            body = b"".join(reply.iter_raw())
        gate.set()
        assert time.monotonic() - start < 2.5
        assert body.startswith(b'data: {"n": 0}\n\n')
        event = json.loads(body.split(b"\n\n")[1].removeprefix(b"data: "))
        assert event["error"]["code"] == "upstream_timeout"


# ----- the proxy's own rules -----

def test_proxy_model_and_the_clients_key(tiny_model_dir: Path, adapter_dir: Path,
                                         upstream: FakeOpenAIServer) -> None:
    """Under --proxy-model every request names the upstream's model; a proxy without a key
    of its own forwards the client's Authorization header."""
    with proxy_server(tiny_model_dir, adapter_dir, upstream.base_url,
                      proxy_model="upstream-model") as running:
        url = f"{running.base_url}/chat/completions"
        headers = {"Authorization": "Bearer sk-for-the-upstream"}
        for body in (chat(), chat(documents=DOCUMENTS)):
            assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
            received = upstream.requests[-1]
            assert received.json["model"] == "upstream-model"
            assert received.headers["authorization"] == "Bearer sk-for-the-upstream"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}])
def test_the_proxy_needs_its_own_key(server: LocalServer, upstream: FakeOpenAIServer,
                                     headers: dict[str, str]) -> None:
    before = len(upstream.requests)
    reply = httpx.post(f"{server.base_url}/chat/completions", json=chat(documents=DOCUMENTS),
                       headers=headers, timeout=60)
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    assert len(upstream.requests) == before


def test_malformed_marks_are_refused_before_anything_is_forwarded(
        http: httpx.Client, upstream: FakeOpenAIServer) -> None:
    before = len(upstream.requests)
    cases = [
        (chat(documents=["fine", {"txt": "typo"}]), "documents", "list of strings"),
        (chat(documents=["a"] * (MAX_DOCUMENTS + 1)), "documents", f"at most {MAX_DOCUMENTS}"),
        (chat("<documents>\n[1] a\n</documents>", documents=["b"]), "documents", "twice"),
        (chat("Q? <documents>\n[1] a"), "messages", "never closes"),
        (chat("Q? <documents>\nfirst\n[1] a\n</documents>"), "messages", "before its first"),
        (chat("<documents>\n[1] a\n</documents>"), "messages", "no text besides"),
        (chat(granularity="sentence"), "granularity", "marks none"),
        (chat(documents=DOCUMENTS, granularity="word"), "granularity", "chunk"),
    ]
    for body, param, words in cases:
        reply = http.post("/chat/completions", json=body)
        assert reply.status_code == 400, (body, reply.text)
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error
    assert len(upstream.requests) == before


def test_proxy_settings_are_checked(tiny_model_dir: Path, adapter_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--proxy-model needs --proxy-to"):
        LocalServerConfig(model=str(tiny_model_dir), proxy_model="m")
    with pytest.raises(ConfigError, match="--proxy-timeout needs --proxy-to"):
        LocalServerConfig(model=str(tiny_model_dir), proxy_timeout=5.0)
    with pytest.raises(ConfigError, match="http:// or https://"):
        LocalServerConfig(model=str(tiny_model_dir), proxy_to="127.0.0.1:8001/v1")
    # Checked before the model loads: the filter must be a served adapter.
    with pytest.raises(ConfigError, match="--proxy-filter 'nope' is not served"):
        LocalServer(LocalServerConfig(model=str(tiny_model_dir), port=0,
                                      adapters=(f"filter={adapter_dir}",),
                                      proxy_to="http://127.0.0.1:9/v1", proxy_filter="nope"))
    with pytest.raises(ConfigError, match="name the one that filters with --proxy-filter"):
        LocalServer(LocalServerConfig(model=str(tiny_model_dir), port=0,
                                      adapters=(f"a={adapter_dir}", f"b={adapter_dir}"),
                                      proxy_to="http://127.0.0.1:9/v1"))
