"""The chunk store (chunks on disk, read by position), the streaming build, DPR's passages
file, and converting a format-1 index folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_dense import FAKE_DENSE, fake_encoder

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.retrieval import corpus as corpus_module
from sieverag.inference.retrieval.chunk_store import (
    OFFSETS_FILE,
    ChunkStore,
    IndexedTexts,
    indexed_text,
)
from sieverag.inference.retrieval.chunking import ChunkingConfig, chunk_corpus
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.corpus import load_corpus, scan_corpora
from sieverag.inference.retrieval.index_folder import Index, build_index, convert_index
from sieverag.inference.retrieval.manifest import IndexFormatError

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()


def _corpus(path: Path, count: int) -> Path:
    records = [{"id": f"d{i}", "title": f"T{i} é",
                "text": " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(30 + i % 9))}
               for i in range(count)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def test_store_reads_every_chunk_by_position(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", 40)
    config = IndexConfig(chunking=ChunkingConfig("tokens", size=12, overlap=3), dense=None)
    index = build_index(corpus, tmp_path / "idx", config, show_progress=False)
    expected = chunk_corpus(load_corpus(corpus), config.chunking)
    store = Index.load(tmp_path / "idx").chunks
    assert isinstance(store, ChunkStore) and len(store) == len(expected) > 40
    assert list(store) == expected  # iteration, in corpus order
    assert store[7] == expected[7] and store[-1] == expected[-1]  # random access
    assert IndexedTexts(store)[3:6] == [indexed_text(c) for c in expected[3:6]]
    with pytest.raises(IndexError, match="out of range"):
        store[len(expected)]
    hit = index.search("gamma delta", 1, "bm25")[0]
    assert hit.document.title.endswith("é")  # non-ASCII text survives byte offsets


def test_build_reads_the_corpus_one_document_at_a_time(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The build never materialises the corpus: the readers it uses are generators."""
    corpus = _corpus(tmp_path / "c.jsonl", 30)
    monkeypatch.setattr(corpus_module, "load_corpora", None)  # a build must not call it
    monkeypatch.setattr(corpus_module, "load_corpus", None)
    config = IndexConfig(chunking=ChunkingConfig("none"), dense=FAKE_DENSE)
    index = build_index(corpus, tmp_path / "idx", config, dense_encoder=fake_encoder,
                        show_progress=False)
    assert index.size == 30 and index.manifest.source_count == 30
    assert index.search("alpha beta", 3, "hybrid")


def test_duplicate_ids_fail_before_anything_is_written(tmp_path: Path) -> None:
    first = _corpus(tmp_path / "a.jsonl", 5)
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": "d3", "text": "again"}) + "\n")
    with pytest.raises(DatasetError, match=r"'d3' is also in .*a\.jsonl"):
        build_index([first, tmp_path / "b.jsonl"], tmp_path / "idx", IndexConfig(dense=None))
    assert not (tmp_path / "idx").exists()
    (tmp_path / "c.jsonl").write_text("".join(
        json.dumps({"id": i, "text": "x y"}) + "\n" for i in (1, 2, 1)))
    with pytest.raises(DatasetError, match=r"c\.jsonl: duplicate document id '1'"):
        scan_corpora([tmp_path / "c.jsonl"])
    assert scan_corpora([first]) == (5, ["jsonl"])


def test_dpr_passages_tsv(tmp_path: Path) -> None:
    tsv = tmp_path / "psgs_w100.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"Aaron is a prophet, ""high priest"""\tAaron\n'
                   "2\tThe second passage\tBible\n", "utf-8")
    documents = load_corpus(tsv)
    assert [(d.id, d.title, d.text) for d in documents] == [
        ("1", "Aaron", 'Aaron is a prophet, "high priest"'), ("2", "Bible", "The second passage")]
    (tmp_path / "bad.tsv").write_text("passage\tid\n")
    with pytest.raises(DatasetError, match=r"bad\.tsv: the first line .* header id<TAB>text"):
        load_corpus(tmp_path / "bad.tsv")


def test_format_1_folder_names_the_convert_command_and_converts(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", 12)
    config = IndexConfig(chunking=ChunkingConfig("none"), dense=FAKE_DENSE)
    build_index(corpus, tmp_path / "idx", config, dense_encoder=fake_encoder,
                show_progress=False)
    before = Index.load(tmp_path / "idx", dense_encoder=fake_encoder, use_cache=False)
    expected = before.search("omega alpha", 5, "hybrid")
    # What sieverag wrote before the chunk store: no offsets file, format 1.
    manifest_path = tmp_path / "idx" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 1
    manifest["files"].remove(OFFSETS_FILE)
    manifest_path.write_text(json.dumps(manifest))
    (tmp_path / "idx" / OFFSETS_FILE).unlink()
    with pytest.raises(IndexFormatError, match=r"sieverag index convert .*idx"):
        Index.load(tmp_path / "idx")
    converted = convert_index(tmp_path / "idx")
    assert converted.format_version == 2 and OFFSETS_FILE in converted.files
    after = Index.load(tmp_path / "idx", dense_encoder=fake_encoder, use_cache=False)
    assert after.search("omega alpha", 5, "hybrid") == expected
    assert convert_index(tmp_path / "idx") == read_again(tmp_path / "idx")  # idempotent


def read_again(directory: Path):
    return Index.load(directory, use_cache=False).manifest


def test_damaged_store_is_one_clear_error(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", 4)
    build_index(corpus, tmp_path / "idx", IndexConfig(dense=None), show_progress=False)
    with (tmp_path / "idx" / "chunks.jsonl").open("a") as handle:
        handle.write("extra\n")
    with pytest.raises(IndexFormatError, match=r"damaged .*chunks\.offsets ends at byte"):
        Index.load(tmp_path / "idx")
