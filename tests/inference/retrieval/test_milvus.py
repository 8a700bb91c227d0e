"""The Milvus backend, run for real on Milvus Lite (a file under tmp_path): a corpus loaded by
`sieverag index build --backend milvus` is searched in Milvus in every mode, dense agreeing
with the in-process Flat index, hybrid and rrf fused by Milvus; `eval` reads its documents
from it through `--retrieval.backend milvus`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fake_backend import ScriptedBackend, serve_every_role
from repo_paths import TEST_DATA

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from sieverag.cli import main  # noqa: E402
from sieverag.inference.composition.config import (  # noqa: E402
    RetrievalConfig,
    RunConfig,
    TrustConfig,
)
from sieverag.inference.core.errors import ConfigError, DatasetError  # noqa: E402
from sieverag.inference.core.io_utils import JsonlLog  # noqa: E402
from sieverag.inference.eval import runner  # noqa: E402
from sieverag.inference.eval.result_records import EvalRecord  # noqa: E402
from sieverag.inference.retrieval.chooser import open_backend  # noqa: E402
from sieverag.inference.retrieval.chunking import ChunkingConfig  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.dense import DenseConfig, make_encoder  # noqa: E402
from sieverag.inference.retrieval.index_folder import Index, build_index  # noqa: E402
from sieverag.inference.retrieval.milvus import MilvusIndex, build_collection  # noqa: E402
from sieverag.inference.retrieval.search_backend import SearchBackend  # noqa: E402

CORPUS = TEST_DATA / "nutrition_pages_sample.jsonl"
CHUNKING = ChunkingConfig("tokens", 100, 20)
QUERIES = ["What does vitamin C do in the body?", "How do genetics and lifestyle affect health?",
           "Why is dietary fiber important?", "what is a calorie", "how is protein digested",
           "sources of calcium for bones", "what causes obesity", "water balance in the body",
           "carbohydrates and blood sugar", "the role of fat in the diet"]


def overlap(a: list, b: list) -> float:
    return len({h.document.id for h in a} & {h.document.id for h in b}) / max(len(a), 1)


@pytest.fixture(scope="module")
def encoder():
    """The embedded MiniLM, the dense model of both sides, each text embedded once (both
    builds read the same vectors)."""
    encode = make_encoder(DenseConfig())
    memo: dict[str, np.ndarray] = {}

    def embed(texts):
        todo = [t for t in dict.fromkeys(texts) if t not in memo]
        if todo:
            memo.update(zip(todo, encode(todo), strict=True))
        return np.stack([memo[t] for t in texts])

    return embed


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, encoder) -> tuple[Index, MilvusIndex, Path]:
    """The nutrition pages in an in-process index (Flat) and in Milvus Lite, same chunks."""
    folder = tmp_path_factory.mktemp("milvus")
    config = IndexConfig(chunking=CHUNKING)
    local = build_index(CORPUS, folder / "index", config, dense_encoder=encoder,
                        show_progress=False)
    uri = str(folder / "milvus.db")
    build_collection([str(CORPUS)], uri, config, encoder=encoder, batch_size=64,
                     show_progress=False)
    return local, MilvusIndex.connect(uri, encoder=encoder), folder


def test_the_collection_is_a_search_backend_describing_its_chunks(built) -> None:
    local, milvus, _ = built
    assert isinstance(milvus, SearchBackend) and milvus.modes == ("bm25", "dense", "hybrid",
                                                                  "rrf")
    assert milvus.manifest.chunk_count == local.manifest.chunk_count
    assert milvus.manifest.source_count == local.manifest.source_count == 40
    assert milvus.manifest.model == "all-minilm-l6-v2"


def test_dense_top10_agrees_with_the_in_process_flat_index(built) -> None:
    local, milvus, _ = built
    mine, theirs = local.search_many(QUERIES, 10, "dense"), milvus.search_many(QUERIES, 10,
                                                                              "dense")
    mean = sum(overlap(a, b) for a, b in zip(mine, theirs, strict=True)) / len(QUERIES)
    assert mean >= 0.9
    # Same chunks, same vectors: the best hit's text and cosine agree.
    for a, b in zip(mine, theirs, strict=True):
        assert a[0].document == b[0].document and a[0].source_id == b[0].source_id
        assert abs(a[0].score - b[0].score) < 1e-4


def test_bm25_runs_in_milvus_and_finds_what_the_local_bm25_finds(built) -> None:
    local, milvus, _ = built
    mine, theirs = local.search_many(QUERIES, 10, "bm25"), milvus.search_many(QUERIES, 10,
                                                                             "bm25")
    assert all(len(r) == 10 for r in theirs)
    assert all(r[i].score >= r[i + 1].score for r in theirs for i in range(9))
    # Two BM25 implementations (bm25s with PyStemmer; Milvus's analyzer): mostly one ranking.
    mean = sum(overlap(a, b) for a, b in zip(mine, theirs, strict=True)) / len(QUERIES)
    assert mean >= 0.6, mean


def test_rrf_is_fused_in_milvus_from_its_own_rankings(built) -> None:
    _, milvus, _ = built
    depth = milvus.search_config.candidates
    for query in QUERIES[:3]:
        bm25 = [h.document.id for h in milvus.search(query, depth, "bm25")]
        dense = [h.document.id for h in milvus.search(query, depth, "dense")]
        expected: dict[str, float] = {}
        for ranking in (bm25, dense):
            for rank, chunk in enumerate(ranking, start=1):
                expected[chunk] = expected.get(chunk, 0.0) + 1 / (60 + rank)
        fused = milvus.search(query, 5, "rrf")
        assert [round(h.score, 6) for h in fused] == [
            round(s, 6) for s in sorted(expected.values(), reverse=True)[:5]]
        assert all(abs(expected[h.document.id] - h.score) < 1e-6 for h in fused)
        hybrid = milvus.search(query, 5, "hybrid")
        assert len(hybrid) == 5 and {h.document.id for h in hybrid} <= set(bm25) | set(dense)


def test_blank_queries_and_bad_searches(built) -> None:
    _, milvus, _ = built
    assert milvus.search_many(["  ", "fiber"], 3, "hybrid")[0] == []
    with pytest.raises(ConfigError, match="search mode must be one of"):
        milvus.search("fiber", 3, "splade")
    with pytest.raises(ConfigError, match="k must be >= 1"):
        milvus.search("fiber", 0, "bm25")


def test_building_again_and_opening_what_is_not_there_are_clear_errors(built, encoder) -> None:
    _, _, folder = built
    uri = str(folder / "milvus.db")
    with pytest.raises(ConfigError, match="already holds this index; pass --overwrite"):
        build_collection([str(CORPUS)], uri, IndexConfig(chunking=CHUNKING), encoder=encoder,
                         show_progress=False)
    with pytest.raises(ConfigError, match="already holds another index"):
        build_collection([str(CORPUS)], uri, IndexConfig(chunking=ChunkingConfig("none")),
                         encoder=encoder, show_progress=False)
    with pytest.raises(DatasetError, match="'other' .* does not exist: build it with "
                                           "`sieverag index build"):
        MilvusIndex.connect(uri, "other", encoder=encoder)
    with pytest.raises(ConfigError, match="neither a Milvus server URL"):
        MilvusIndex.connect(str(folder / "milvus.sqlite"), encoder=encoder)
    with pytest.raises(ConfigError, match="retrieval.backend milvus needs retrieval.uri"):
        RetrievalConfig(backend="milvus")
    with pytest.raises(ConfigError, match="--retrieval.backend milvus"):
        RetrievalConfig(uri=uri)


def test_eval_reads_its_documents_from_milvus(built, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _, milvus, folder = built
    serve_every_role(monkeypatch, ScriptedBackend(reply=lambda text: "fiber"))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": ["x"]})
                                 + "\n" for i, q in enumerate(QUERIES[:3])), encoding="utf-8")
    retrieval = RetrievalConfig(backend="milvus", uri=str(folder / "milvus.db"), mode="hybrid",
                                k=3)
    assert isinstance(open_backend(retrieval, retrieval.search), MilvusIndex)
    config = RunConfig(dataset=str(questions), dataset_format="triviaqa",
                       pipelines=("vanilla",), retrieval=retrieval,
                       trust=TrustConfig(enabled=False))
    runner.run_evaluation(config, tmp_path / "run", progress=False)
    records = JsonlLog(tmp_path / "run" / "results" / "vanilla.jsonl").read_records(EvalRecord)
    assert [r.documents_read for r in records] == [
        [h.document.id for h in hits] for hits in milvus.search_many(QUERIES[:3], 3, "hybrid")]


def ranked(printed: str) -> list[tuple[str, float]]:
    """(chunk id, score) of each hit `sieverag index search` printed, best first."""
    return [(line.split()[2], float(line.split()[1])) for line in printed.splitlines()
            if re.match(r"\s*\d+\. ", line)]


def test_index_search_and_ask_read_milvus_from_the_command_line(
        built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    local, milvus, folder = built
    uri = str(folder / "milvus.db")
    query = QUERIES[2]
    # Dense: the same chunks and vectors, so the best hit and its cosine agree (as above).
    assert main(["index", "search", str(folder / "index"), query, "--mode", "dense", "-k", "5",
                 "--no-cache"]) == 0
    here = ranked(capsys.readouterr().out)
    assert main(["index", "search", uri, query, "--backend", "milvus", "--mode", "dense",
                 "-k", "5"]) == 0
    there = ranked(capsys.readouterr().out)
    assert len(here) == len(there) == 5 and here[0][0] == there[0][0]
    assert abs(here[0][1] - there[0][1]) <= 2e-4  # printed to 4 places
    # Any mode: the command prints Milvus's own ranking.
    assert main(["index", "search", uri, query, "--backend", "milvus", "--mode", "bm25",
                 "-k", "5"]) == 0
    assert [hit for hit, _ in ranked(capsys.readouterr().out)] == [
        h.document.id for h in milvus.search(query, 5, "bm25")]
    serve_every_role(monkeypatch, ScriptedBackend(reply=lambda text: "fiber"))
    assert main(["ask", query, "--pipeline", "vanilla", "--mode", "hybrid", "-k", "3",
                 "--retrieval.backend", "milvus", "--retrieval.uri", uri]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Answer: fiber") and "Evidence read (3):" in shown
    assert [line for line in shown.splitlines() if line.startswith("[")] == [
        f"[{n}] {h.document.title or h.document.id}: {h.document.text}"
        for n, h in enumerate(milvus.search(query, 3, "hybrid"), start=1)]


def test_index_build_backend_milvus_from_the_command_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"page {i} about {topic}"})
                              + "\n" for i, topic in enumerate(["iron", "zinc", "fiber"])),
                      encoding="utf-8")
    uri = str(tmp_path / "cli.db")
    assert main(["index", "build", "--corpus", str(corpus), "--backend", "milvus", "--uri", uri,
                 "--collection", "pages"]) == 0
    assert "into Milvus collection 'pages'" in capsys.readouterr().out
    assert main(["index", "build", "--corpus", str(corpus), "--backend", "milvus",
                 "--out", str(tmp_path / "idx")]) == 2
    assert "give --uri" in capsys.readouterr().err
    hits = MilvusIndex.connect(uri, "pages").search("zinc", 1, "bm25")
    assert [h.document.id for h in hits] == ["d1#0"]
