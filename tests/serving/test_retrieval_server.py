"""`sieverag index serve`: rankings through the server equal the in-process index's in every
mode (ids, texts and scores), Search-R1's `/retrieve` answers in Search-R1's shape, bad input
and a missing API key are refused as `sieverag serve` refuses them, and `eval` reads its
documents through `--retrieval.endpoint` as it reads them from the folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_backend import ScriptedBackend, serve_every_role
from fake_dense import FAKE_DENSE, fake_encoder
from repo_paths import REPO, TEST_DATA

from sieverag.cli import main
from sieverag.inference.composition.config import RetrievalConfig, RunConfig, TrustConfig
from sieverag.inference.core.errors import BackendUnavailableError, ConfigError
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.eval import runner
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.retrieval.chooser import open_backend
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.index_folder import SEARCH_MODES, Index, build_index
from sieverag.inference.retrieval.remote import RemoteIndex
from sieverag.inference.retrieval.search_backend import SearchBackend
from sieverag.serving.retrieval.config import RetrievalServerConfig
from sieverag.serving.retrieval.server import RetrievalServer

QUERIES = ["What does vitamin C do in the body?", "How do genetics and lifestyle affect "
           "health?", "Why is dietary fiber important?", "what is a calorie", "protein digestion",
           "   "]
KEY_ENV = "SIEVERAG_TEST_INDEX_KEY"
# Generous: the tests share 2 cores with other jobs, and a first request loads the encoder.
TIMEOUT_S = 120


def post(url: str, **kwargs: object) -> httpx.Response:
    return httpx.post(url, timeout=TIMEOUT_S, **kwargs)


def get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BM25 and (fake-encoder) dense over the nutrition pages, in 60-word chunks."""
    out = tmp_path_factory.mktemp("served") / "index"
    build_index(TEST_DATA / "nutrition_pages_sample.jsonl", out,
                IndexConfig(chunking=ChunkingConfig("tokens", 60, 10), dense=FAKE_DENSE),
                dense_encoder=fake_encoder, show_progress=False)
    return out


def load(index_dir: Path, **search: float) -> Index:
    return Index.load(index_dir, search_config=SearchConfig(**search), use_cache=False,
                      dense_encoder=fake_encoder)


@pytest.fixture(scope="module")
def server(index_dir: Path) -> Iterator[RetrievalServer]:
    config = RetrievalServerConfig(index=str(index_dir), port=0, max_queries=8, max_k=50,
                                   max_request_bytes=4096, cache=False, access_log=False)
    with RetrievalServer(load(index_dir), config) as running:
        yield running


def test_the_local_index_and_the_client_are_search_backends(index_dir: Path,
                                                            server: RetrievalServer) -> None:
    assert isinstance(load(index_dir), SearchBackend)
    assert isinstance(RemoteIndex(server.url), SearchBackend)


@pytest.mark.parametrize("mode", SEARCH_MODES)
def test_rankings_through_the_server_equal_the_in_process_ones(
        index_dir: Path, server: RetrievalServer, mode: str) -> None:
    local = load(index_dir).search_many(QUERIES, 10, mode)
    client = RemoteIndex(server.url)
    # 6 queries at 4 a request: the client's batches too give the same rankings.
    client.max_queries = 4
    remote = client.search_many(QUERIES, 10, mode)
    assert [len(r) for r in local] == [len(r) for r in remote]
    assert len(local[0]) == 10 and local[-1] == []  # a blank query finds nothing
    for mine, theirs in zip(local, remote, strict=True):
        assert [(h.document, h.source_id) for h in mine] == [(h.document, h.source_id)
                                                           for h in theirs]
        assert all(abs(a.score - b.score) <= 1e-6 for a, b in zip(mine, theirs, strict=True))
    assert client.manifest.fingerprint == load(index_dir).manifest.fingerprint
    assert client.modes == SEARCH_MODES


def test_search_r1_retrieve_answers_in_its_shape(index_dir: Path,
                                                 server: RetrievalServer) -> None:
    local = load(index_dir).search_many(QUERIES[:2], 5, "hybrid")
    body = post(f"{server.url}/retrieve",
                      json={"queries": QUERIES[:2], "topk": 5, "return_scores": True}).json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    for hits, ranking in zip(local, body["result"], strict=True):
        assert [item["document"]["id"] for item in ranking] == [h.document.id for h in hits]
        first = ranking[0]
        assert set(first) == {"document", "score"} and set(first["document"]) == {"id",
                                                                                 "contents"}
        assert first["document"]["contents"] == (f'"{hits[0].document.title}"\n'
                                                 f"{hits[0].document.text}")
        assert abs(first["score"] - hits[0].score) <= 1e-6
    # No scores asked: the documents alone; no topk: Search-R1's 3.
    plain = post(f"{server.url}/retrieve", json={"queries": QUERIES[:1]}).json()
    assert [doc["id"] for doc in plain["result"][0]] == [h.document.id for h in local[0][:3]]


@pytest.mark.parametrize(("route", "body", "status", "words"), [
    ("/v1/search", {"queries": "vitamin"}, 400, "queries"),
    ("/v1/search", {"queries": ["vitamin"], "k": 0}, 400, "k: Input should be greater"),
    ("/v1/search", {"queries": ["vitamin"], "k": 51}, 400, "at most 50 hits a query (--max-k)"),
    ("/v1/search", {"queries": ["vitamin"], "mode": "splade"}, 400, "mode"),
    ("/v1/search", {"queries": ["q"] * 9}, 400, "at most 8 a request (--max-queries)"),
    ("/v1/search", {"queries": ["\ud800"]}, 400, "UTF-8 cannot encode"),
    ("/v1/search", {"queries": ["x" * 5000]}, 413, "(--max-request-bytes): send fewer or "
                                                   "shorter queries"),
    ("/retrieve", {"topk": 3}, 400, "queries"),
    ("/retrieve", {"queries": ["vitamin"], "topk": 0}, 400, "topk"),
    ("/v1/nothing", {}, 404, "no route POST /v1/nothing"),
])
def test_bad_input_gets_one_clear_refusal_and_the_server_keeps_serving(
        server: RetrievalServer, route: str, body: dict, status: int, words: str) -> None:
    content = json.dumps(body, ensure_ascii=True).encode()
    response = post(f"{server.url}{route}", content=content,
                          headers={"content-type": "application/json"})
    assert response.status_code == status
    assert words in response.json()["error"]["message"]
    assert post(f"{server.url}/v1/search", json={"queries": ["fiber"]}).status_code == 200


def test_unknown_fields_are_accepted_and_named(server: RetrievalServer) -> None:
    response = post(f"{server.url}/retrieve", json={"queries": ["fiber"], "topn": 2})
    assert response.status_code == 200 and response.headers["x-sieverag-ignored"] == "topn"
    assert len(response.json()["result"][0]) == 3


def test_an_index_without_a_mode_refuses_it_at_the_server_and_the_client(
        tmp_path: Path) -> None:
    build_index(TEST_DATA / "nutrition_pages_sample.jsonl", tmp_path / "bm25",
                IndexConfig(dense=None), show_progress=False)
    config = RetrievalServerConfig(index=str(tmp_path / "bm25"), port=0, access_log=False)
    with RetrievalServer(Index.load(tmp_path / "bm25"), config) as running:
        refused = post(f"{running.url}/v1/search",
                             json={"queries": ["fiber"], "mode": "dense"})
        assert refused.status_code == 400
        assert "this index supports bm25" in refused.json()["error"]["message"]
        # /retrieve searches the one mode the index has.
        assert running.app.state.searcher.mode == "bm25"
        with pytest.raises(ConfigError, match="cannot search in mode 'hybrid'; it supports: "
                                              "bm25"):
            RemoteIndex(running.url).search("fiber", 3, "hybrid")
    with pytest.raises(ConfigError, match="--mode dense: the index supports bm25"):
        RetrievalServer(Index.load(tmp_path / "bm25"),
                        RetrievalServerConfig(index=str(tmp_path / "bm25"), mode="dense"))


def test_the_api_key_guards_every_route_but_health(
        index_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "s3cret")
    config = RetrievalServerConfig(index=str(index_dir), port=0, api_key_env=KEY_ENV,
                                   access_log=False)
    with RetrievalServer(load(index_dir), config) as running:
        assert get(f"{running.url}/health").json() == {"status": "ok"}
        for route in ("/retrieve", "/v1/search"):
            refused = post(f"{running.url}{route}", json={"queries": ["fiber"]})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(BackendUnavailableError, match=r"refused the request \(401\)"):
            RemoteIndex(running.url)
        hits = RemoteIndex(running.url, api_key="s3cret").search("fiber", 3, "bm25")
        assert [h.document.id for h in hits] == [
            h.document.id for h in load(index_dir).search("fiber", 3, "bm25")]
        # Through the chooser, the key is read from the variable named.
        source = RetrievalConfig(endpoint=running.url, api_key_env=KEY_ENV)
        assert open_backend(source, source.search).modes == SEARCH_MODES


def test_the_client_refuses_other_fusion_settings_and_a_server_that_is_not_there(
        server: RetrievalServer) -> None:
    with pytest.raises(ConfigError, match=r"fuses with alpha 0.5 \(here 0.7\)"):
        RemoteIndex(server.url, search_config=SearchConfig(alpha=0.7))
    # A reranker's depth is the client's own: it fetches deeper, then cuts to k.
    assert RemoteIndex(server.url, search_config=SearchConfig(rerank_depth=40)).modes
    with pytest.raises(BackendUnavailableError, match="cannot be reached .* `sieverag index "
                                                      "serve INDEX --port P`"):
        RemoteIndex("http://127.0.0.1:9", timeout=2)


@pytest.mark.parametrize(("fields", "words"), [
    ({}, "retrieval needs one index"),
    ({"index": "idx", "endpoint": "http://127.0.0.1:8000"}, "not both"),
    ({"endpoint": "127.0.0.1:8000"}, "must be an http:// or https:// URL"),
    ({"index": "idx", "api_key_env": ""}, "retrieval.api_key_env must name"),
])
def test_the_retrieval_source_is_checked_at_start(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RetrievalConfig(**fields)


def test_eval_reads_the_same_documents_through_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve_every_role(monkeypatch, ScriptedBackend(reply=lambda text: "fiber"))
    build_index(TEST_DATA / "nutrition_pages_sample.jsonl", tmp_path / "bm25",
                IndexConfig(dense=None), show_progress=False)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": ["x"]})
                                 + "\n" for i, q in enumerate(QUERIES[:3])), encoding="utf-8")

    def documents_read(retrieval: RetrievalConfig, out: Path) -> dict[str, list[list[str]]]:
        config = RunConfig(dataset=str(questions), dataset_format="triviaqa",
                           pipelines=("vanilla", "iter-retgen"), retrieval=retrieval,
                           trust=TrustConfig(enabled=False))
        runner.run_evaluation(config, out, progress=False)
        return {name: [r.documents_read for r in
                       JsonlLog(out / "results" / f"{name}.jsonl").read_records(EvalRecord)]
                for name in ("vanilla", "iter-retgen")}

    local = documents_read(RetrievalConfig(index=str(tmp_path / "bm25"), mode="bm25", k=3),
                           tmp_path / "local")
    config = RetrievalServerConfig(index=str(tmp_path / "bm25"), port=0, access_log=False)
    with RetrievalServer(Index.load(tmp_path / "bm25"), config) as running:
        served = documents_read(RetrievalConfig(endpoint=running.url, mode="bm25", k=3),
                                tmp_path / "served")
    assert served == local and all(len(docs) == 3 for docs in local["vanilla"])


def printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """What a `sieverag` command that must succeed printed."""
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_index_search_and_ask_read_the_served_index_as_the_folder(
        index_dir: Path, server: RetrievalServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # bm25: the command's own folder search loads no encoder (the fixture's dense is a fake).
    for query in QUERIES[:3]:
        options = [query, "--mode", "bm25", "-k", "5", "--hygiene", "loose"]
        here = printed(capsys, ["index", "search", str(index_dir), *options, "--no-cache"])
        assert here.startswith("  1. ") and "  5. " in here
        assert printed(capsys, ["index", "search", server.url, *options]) == here
    assert main(["index", "search", server.url, "fiber", "--search.alpha", "0.7"]) == 2
    assert "fuses with alpha 0.5 (here 0.7)" in capsys.readouterr().err
    serve_every_role(monkeypatch, ScriptedBackend(reply=lambda text: "fiber"))
    ask = [QUERIES[2], "--pipeline", "vanilla", "--mode", "bm25", "-k", "3"]
    here = printed(capsys, ["ask", *ask, "--index", str(index_dir)])
    assert here.startswith("Answer: fiber") and "Evidence read (3):" in here
    assert printed(capsys, ["ask", *ask, "--retrieval.endpoint", server.url]) == here


def test_sieverag_index_serve_serves_until_sigterm(tmp_path: Path) -> None:
    build_index(TEST_DATA / "nutrition_pages_sample.jsonl", tmp_path / "bm25",
                IndexConfig(dense=None), show_progress=False)
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    process = subprocess.Popen(
        [sys.executable, "-m", "sieverag", "index", "serve", str(tmp_path / "bm25"),
         "--port", "0", "--no-access-log"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env)
    url = None
    try:
        # Generous: the command imports torch, on 2 cores other jobs share.
        deadline = time.monotonic() + 600
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if " at http://" in line:
                url = line.split(" at ", 1)[1].split(" ", 1)[0]
        assert url is not None, "the server never said where it serves"
        hits = RemoteIndex(url, timeout=TIMEOUT_S).search("dietary fiber", 3, "bm25")
        assert [h.document.id for h in hits] == [
            h.document.id for h in Index.load(tmp_path / "bm25").search("dietary fiber", 3,
                                                                        "bm25")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
