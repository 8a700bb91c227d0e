"""Dense indexes of any FAISS type: trained on a sample, filled shard by shard, exact
re-ranking from the full vectors on disk, search settings, embedding on several devices."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from fake_dense import fake_encoder

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.dense import (
    VECTORS_FILE,
    DenseConfig,
    DenseIndex,
    embedding_devices,
    make_encoder,
    read_index_mapped,
    training_sample,
)
from sieverag.inference.retrieval.index_folder import Index, build_index

WORDS = [f"w{n}" for n in range(300)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": " ".join(rng.choices(WORDS, k=12))})
                            + "\n" for i in range(700)))
    return path


def _build(corpus: Path, out: Path, spec: str, **dense: object) -> Index:
    config = IndexConfig(chunking=ChunkingConfig("none"), bm25=None,
                         dense=DenseConfig(model="fake", index=spec, shard_size=128,
                                           train_size=500, **dense))  # type: ignore[arg-type]
    return build_index(corpus, out, config, dense_encoder=fake_encoder, show_progress=False)


def _queries(corpus: Path) -> list[str]:
    lines = corpus.read_text().splitlines()
    return [" ".join(json.loads(lines[i])["text"].split()[:6]) for i in range(0, 700, 14)]


def _overlap(a: list, b: list) -> float:
    return float(np.mean([len({h.document.id for h in x} & {h.document.id for h in y}) / len(x)
                          for x, y in zip(a, b, strict=True)]))


def test_compressed_index_reranks_exactly_from_disk(corpus: Path, tmp_path: Path) -> None:
    flat = _build(corpus, tmp_path / "flat", "Flat")
    assert flat.dense is not None and flat.dense.vectors is None  # exact already
    ivfpq = _build(corpus, tmp_path / "ivfpq", "IVF8,PQ8x4")
    assert "dense/vectors.npy" in ivfpq.manifest.files
    queries = _queries(corpus)
    truth = flat.search_many(queries, 10, "dense")

    loaded = Index.load(tmp_path / "ivfpq", dense_encoder=fake_encoder, use_cache=False,
                        search_config=SearchConfig(nprobe=8, rerank_factor=30))
    assert isinstance(loaded.dense.vectors, np.memmap)  # type: ignore[union-attr]
    reranked = loaded.search_many(queries, 10, "dense")
    codes_only = Index.load(tmp_path / "ivfpq", dense_encoder=fake_encoder, use_cache=False,
                            search_config=SearchConfig(nprobe=8, rerank_factor=1)
                            ).search_many(queries, 10, "dense")
    # Below 1 only through ties: hashed bag-of-words vectors give many equal cosines at rank 10.
    assert _overlap(reranked, truth) >= 0.85
    assert _overlap(reranked, truth) > _overlap(codes_only, truth)
    # Re-ranked scores are the exact cosines Flat gives the same chunks.
    exact = {h.document.id: h.score for h in truth[0]}
    assert all(h.score == pytest.approx(exact[h.document.id], abs=1e-5)
               for h in reranked[0] if h.document.id in exact)
    assert reranked[0][0].score == pytest.approx(truth[0][0].score, abs=1e-5)
    # nprobe is a search setting: one list searched finds less than all eight.
    narrow = Index.load(tmp_path / "ivfpq", dense_encoder=fake_encoder, use_cache=False,
                        search_config=SearchConfig(nprobe=1)).search_many(queries, 10, "dense")
    assert _overlap(narrow, truth) < _overlap(reranked, truth)


def test_hnsw_keeps_no_extra_vectors_and_finds_flat_neighbours(corpus: Path,
                                                             tmp_path: Path) -> None:
    flat = _build(corpus, tmp_path / "flat", "Flat")
    hnsw = _build(corpus, tmp_path / "hnsw", "HNSW16")
    assert not (tmp_path / "hnsw" / "dense" / VECTORS_FILE).exists()
    queries = _queries(corpus)
    assert _overlap(hnsw.search_many(queries, 10, "dense"),
                    flat.search_many(queries, 10, "dense")) >= 0.85
    forced = _build(corpus, tmp_path / "forced", "HNSW16", keep_vectors=True)
    assert forced.dense is not None and forced.dense.vectors is not None


def test_bad_index_strings_fail_naming_the_field(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dense.index 'IVF,Bogus' is not a FAISS"):
        DenseConfig(index="IVF,Bogus")
    with pytest.raises(ConfigError, match=r"dense.index 'IVF1024,Flat' cannot be built over 700"):
        _build(corpus, tmp_path / "big", "IVF1024,Flat")


def test_training_sample_and_mapped_loading(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for n, rows in enumerate((5, 7, 3)):
        paths.append(tmp_path / f"s{n}.npy")
        np.save(paths[-1], rng.random((rows, 4), dtype=np.float32))
    everything = np.concatenate([np.load(p) for p in paths])
    sample = training_sample(paths, 6)
    assert sample.shape == (6, 4)
    assert all(any(np.array_equal(row, e) for e in everything) for row in sample)
    assert training_sample(paths, 100).shape == (15, 4)  # capped at what there is
    index = DenseIndex.build(["a b", "b c", "c d"], tmp_path / "d", DenseConfig(model="fake"),
                             encoder=fake_encoder, show_progress=False)
    mapped = read_index_mapped(tmp_path / "d" / "dense.faiss")
    query = fake_encoder(["b c"])
    assert mapped.search(query, 3)[1].tolist() == index.index.search(query, 3)[1].tolist()


def test_corpus_embedding_in_one_process_per_device(tmp_path: Path) -> None:
    """The multi-device path (sentence-transformers' process pool), here on two CPU
    processes with the real MiniLM, embeds as the one-process path does."""
    assert embedding_devices(DenseConfig()) == []  # no GPUs: this process
    texts = ["Rockets burn fuel.", "Bread rises with yeast.", "Cats sleep all day.",
             "Oranges hold vitamin C.", "The ocean is salty."]
    single = DenseIndex.build(texts, tmp_path / "one", DenseConfig(shard_size=2),
                              show_progress=False)
    pooled = DenseIndex.build(texts, tmp_path / "two",
                              DenseConfig(shard_size=2, devices=("cpu", "cpu")),
                              show_progress=False)
    reference = make_encoder(DenseConfig())(texts)
    for index in (single, pooled):
        stored = np.vstack([index.index.reconstruct(i) for i in range(len(texts))])
        assert np.allclose(stored, reference, atol=1e-5)
