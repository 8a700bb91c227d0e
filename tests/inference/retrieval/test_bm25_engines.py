"""bm25s and tantivy rank alike: same tokenisation (word pattern, stop words, Snowball
stemmer), same k1 and b; `--bm25.engine` picks one, `auto` by corpus size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_paths import TEST_DATA as TESTS_DATA

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.retrieval.bm25 import BM25Config, BM25Index
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.corpus import load_corpus
from sieverag.inference.retrieval.index_folder import Index, build_index
from sieverag.inference.retrieval.lexical import TANTIVY_FROM_DOCUMENTS, choose_engine
from sieverag.inference.retrieval.tantivy_bm25 import TANTIVY_B, TANTIVY_K1, TantivyBM25Index

SAME = BM25Config(k1=TANTIVY_K1, b=TANTIVY_B)
FILES = ("hotpotqa_sample.jsonl", "hotpotqa_heldout_sample.jsonl", "squad_sample.json",
         "nutrition_pages_sample.jsonl")


def _questions() -> list[str]:
    questions = []
    for name in FILES[:2]:
        for line in (TESTS_DATA / name).read_text().splitlines():
            record = json.loads(line)
            questions.append(record["question"])
            questions += [p["title"] for p in record["passages"]]  # short entity queries
    squad = json.loads((TESTS_DATA / "squad_sample.json").read_text())
    questions += [qa["question"] for article in squad["data"] for paragraph in
                  article["paragraphs"] for qa in paragraph["qas"]]
    return questions


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [d.as_context() for name in FILES for d in load_corpus(TESTS_DATA / name)]


def test_engines_agree_on_top_10(texts: list[str], tmp_path: Path) -> None:
    questions = _questions()
    assert len(texts) > 90 and len(questions) > 60
    bm25s_index = BM25Index.build(texts, SAME, show_progress=False)
    tantivy_index = TantivyBM25Index.build(texts, tmp_path / "t", SAME, heap_mb=64,
                                           show_progress=False)
    overlaps, top1 = [], 0
    for ours, theirs in zip(bm25s_index.search(questions, 10),
                            tantivy_index.search(questions, 10), strict=True):
        assert ours and theirs
        overlaps.append(len({p for p, _ in ours} & {p for p, _ in theirs}) / len(ours))
        top1 += ours[0][0] == theirs[0][0]
    print(f"bm25s vs tantivy over {len(questions)} queries: mean top-10 overlap "
          f"{sum(overlaps) / len(overlaps):.3f}, same top-1 {top1 / len(questions):.3f}")
    # Measured: mean overlap 0.99+; the differences come from tantivy's one-byte length norms.
    assert sum(overlaps) / len(overlaps) >= 0.9
    assert top1 / len(questions) >= 0.9
    # Same tokenisation: a stop-word-only query matches nothing on either engine.
    assert bm25s_index.search(["the of and"], 5) == [[]]
    assert tantivy_index.search(["the of and"], 5) == [[]]
    # 'were' is not in bm25s's 33-word English list, so both engines keep it.
    assert tantivy_index.query_terms("The Rockets were running") == ["rocket", "were", "run"]


def test_engine_choice_and_what_tantivy_refuses() -> None:
    assert choose_engine(BM25Config(), 10) == "bm25s"
    assert choose_engine(SAME, TANTIVY_FROM_DOCUMENTS) == "tantivy"
    with pytest.raises(ConfigError, match=r"k1=1.2, b=0.75 .*--bm25.k1 1.2.*--bm25.engine bm25s"):
        choose_engine(BM25Config(), TANTIVY_FROM_DOCUMENTS)  # bm25s's default k1 is 1.5
    with pytest.raises(ConfigError, match="bm25.method 'robertson'"):
        choose_engine(BM25Config(k1=1.2, method="robertson", engine="tantivy"), 3)


def test_index_built_with_tantivy_loads_and_searches(tmp_path: Path) -> None:
    config = IndexConfig(chunking=ChunkingConfig("none"), dense=None,
                         bm25=BM25Config(k1=1.2, engine="tantivy"))
    corpus = TESTS_DATA / "nutrition_pages_sample.jsonl"
    built = build_index(corpus, tmp_path / "idx", config, show_progress=False)
    small = build_index(corpus, tmp_path / "small", IndexConfig(
        chunking=ChunkingConfig("none"), dense=None, bm25=BM25Config(k1=1.2, engine="bm25s")),
        show_progress=False)
    assert "bm25/tantivy/meta.json" in built.manifest.files
    loaded = Index.load(tmp_path / "idx", use_cache=False)
    assert isinstance(loaded.bm25, TantivyBM25Index)
    query = "How much vitamin C do adults need?"
    hits = loaded.search(query, 5, "bm25")
    assert [h.document.id for h in hits][:3] == [
        h.document.id for h in small.search(query, 5, "bm25")][:3]
    assert hits[0].score >= hits[-1].score
