"""Retrieval without an embedding model: sentences, chunking, corpora, BM25, fusion, hygiene,
the index facade (with a fake encoder), the cache and the evaluation arithmetic."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fake_dense import FAKE_DENSE, fake_encoder
from repo_paths import SHARED_DATA

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.types import Document
from sieverag.inference.metrics.retrieval import (
    ranked_sources,
    recall_at_k,
    reciprocal_rank,
    spread_subset,
)
from sieverag.inference.retrieval.bm25 import BM25Config, BM25Index
from sieverag.inference.retrieval.chunking import (
    ChunkingConfig,
    chunk_corpus,
    chunk_document,
    source_id_of,
    split_token_windows,
)
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.corpus import detect_corpus_format, load_corpus, load_squad
from sieverag.inference.retrieval.hybrid import (
    min_max_normalise,
    reciprocal_rank_fusion,
    weighted_fusion,
)
from sieverag.inference.retrieval.hygiene import apply_hygiene, removal_reason
from sieverag.inference.retrieval.index_folder import Index, build_index
from sieverag.inference.retrieval.manifest import IndexFormatError
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.inference.retrieval.sentences import sentence_spans, split_sentences

SHARED = SHARED_DATA

CORPUS = [
    {"id": "rocket", "title": "Rockets", "text": "Rockets burn fuel to reach orbit around the "
     "Earth. Engines push exhaust backwards."},
    {"id": "bread", "title": "Baking", "text": "Bread rises because yeast ferments sugar and "
     "releases carbon dioxide in the dough."},
    {"id": "vitamin", "text": "Vitamin C supports the immune system and is found in citrus "
     "fruit such as oranges."},
    {"id": "cats", "text": "Cats sleep for most of the day and hunt small animals at night."},
    {"id": "ocean", "text": "The ocean covers most of the Earth and holds salty water."},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path




@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", CORPUS)


@pytest.fixture
def built(tmp_path: Path, corpus_file: Path) -> Path:
    config = IndexConfig(chunking=ChunkingConfig("none"), dense=FAKE_DENSE)
    build_index(corpus_file, tmp_path / "idx", config, dense_encoder=fake_encoder,
                show_progress=False)
    return tmp_path / "idx"


# --- sentences ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("Dr. Smith arrived. He sat down.", ["Dr. Smith arrived.", "He sat down."]),
    ("The U.S. economy grew 2.5 percent. Prices rose.",
     ["The U.S. economy grew 2.5 percent.", "Prices rose."]),
    ("Pi is 3.14 roughly. Yes.", ["Pi is 3.14 roughly.", "Yes."]),
    ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("J. K. Rowling wrote it. She is British.", ["J. K. Rowling wrote it.", "She is British."]),
    ("Fruit (e.g. oranges) helps. See Fig. 2 for more.",
     ["Fruit (e.g. oranges) helps.", "See Fig. 2 for more."]),
    ("First part\n\nsecond part", ["First part", "second part"]),
    ("no final stop", ["no final stop"]),
    ("   ", []),
])
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected
    # Each sentence is where its span says, in order, stripped.
    spans = sentence_spans(text)
    assert [text[start:end] for start, end in spans] == expected
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_sentence_spans_are_offsets_into_the_text() -> None:
    text = "  First one.  Second?\n\n\tThird (J. Doe) here.  \n \n"
    assert sentence_spans(text) == [(2, 12), (14, 21), (24, 44)]
    assert sentence_spans("") == [] and sentence_spans(" \n\n ") == []


# --- chunking -------------------------------------------------------------------------------

def test_token_windows_overlap_and_keep_spacing() -> None:
    text = "w0 w1  w2 w3 w4 w5 w6 w7 w8 w9"
    assert split_token_windows(text, 4, 1) == ["w0 w1  w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert split_token_windows("a b", 4, 1) == ["a b"]


def test_sentence_chunks_and_stable_ids() -> None:
    doc = Document(id="d7", text="One. Two. Three. Four. Five.", title="T")
    chunks = chunk_document(doc, ChunkingConfig("sentences", size=2, overlap=1))
    assert [c.text for c in chunks] == ["One. Two.", "Two. Three.", "Three. Four.",
                                        "Four. Five."]
    assert [c.id for c in chunks] == ["d7#0", "d7#1", "d7#2", "d7#3"]
    assert all(c.title == "T" and source_id_of(c.id) == "d7" for c in chunks)
    again = chunk_document(doc, ChunkingConfig("sentences", size=2, overlap=1))
    assert again == chunks
    assert source_id_of("hotpotqa:A#B#3") == "hotpotqa:A#B"


def test_chunking_defaults_and_validation() -> None:
    assert (ChunkingConfig().size, ChunkingConfig().overlap) == (200, 40)
    assert (ChunkingConfig("sentences").size, ChunkingConfig("sentences").overlap) == (5, 1)
    assert ChunkingConfig("tokens", size=1).overlap == 0
    with pytest.raises(ConfigError, match="overlap"):
        ChunkingConfig("tokens", size=10, overlap=10)
    with pytest.raises(ConfigError, match="strategy"):
        ChunkingConfig("paragraphs")  # type: ignore[arg-type]
    docs = [Document(id="a", text="x " * 10), Document(id="b", text="y")]
    assert [c.id for c in chunk_corpus(docs, ChunkingConfig("tokens", 4, 0))] == [
        "a#0", "a#1", "a#2", "b#0"]


# --- corpus readers ---------------------------------------------------------------------------

def test_jsonl_corpus_and_bad_lines(tmp_path: Path) -> None:
    docs = load_corpus(write_jsonl(tmp_path / "c.jsonl", [{"text": "alpha"},
                                                          {"id": 9, "title": "T", "text": "b"}]))
    assert [(d.id, d.title) for d in docs] == [("1", ""), ("9", "T")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "title": "no text"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: record has no text"):
        load_corpus(bad)
    (tmp_path / "broken.jsonl").write_text('{"id": "a", "text": "ok"}\n{oops\n')
    with pytest.raises(DatasetError, match=r"broken\.jsonl, line 2: not valid JSON"):
        load_corpus(tmp_path / "broken.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="empty"):
        load_corpus(tmp_path / "empty.jsonl")
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
    with pytest.raises(DatasetError, match="duplicate document id 'x'"):
        load_corpus(dup)
    with pytest.raises(DatasetError, match="not found"):
        load_corpus(tmp_path / "missing.jsonl")


def test_contents_corpus_splits_title_and_text(tmp_path: Path) -> None:
    """Pyserini / FlashRAG `{id, contents}`: first line the title (quotes stripped), the rest
    the text; a one-line `contents` is all text."""
    path = write_jsonl(tmp_path / "wiki18.jsonl", [
        {"id": "0", "contents": '"Aaron"\nAaron is a prophet.'},
        {"id": "1", "contents": "Moses\nMoses led the people.\nHe was old."},
        {"id": "2", "contents": "Just a passage."},
    ])
    assert detect_corpus_format(path) == "jsonl"
    docs = load_corpus(path)
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("0", "Aaron", "Aaron is a prophet."),
        ("1", "Moses", "Moses led the people.\nHe was old."),
        ("2", "", "Just a passage."),
    ]
    title_only = write_jsonl(tmp_path / "title_only.jsonl", [{"id": "0", "contents": "T\n "}])
    assert [(d.title, d.text) for d in load_corpus(title_only)] == [("", "T\n ")]
    empty = write_jsonl(tmp_path / "empty_contents.jsonl", [{"id": "0", "contents": " "}])
    with pytest.raises(DatasetError, match=r"empty_contents\.jsonl:1: record has no text"):
        load_corpus(empty)


def test_nutrition_squad_hotpotqa_readers(tmp_path: Path) -> None:
    pages = write_jsonl(tmp_path / "pages.jsonl", [{"page_number": 3, "text": "Protein."}])
    assert detect_corpus_format(pages) == "nutrition"
    assert load_corpus(pages)[0].id == "page-3"

    squad = {"version": "1.1", "data": [{"title": "Super_Bowl", "paragraphs": [
        {"context": "The game was in Santa Clara.", "qas": [
            {"id": "q1", "question": "Where?", "answers": [{"text": "Santa Clara"},
                                                            {"text": "Santa Clara"}]}]}]}]}
    archive = tmp_path / "squad.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("dev.json", json.dumps(squad))
    docs, examples = load_squad(archive)
    assert (docs[0].id, docs[0].title) == ("squad-p0", "Super Bowl")
    assert examples[0].answers[0] == "Santa Clara"
    assert examples[0].metadata["gold_doc_id"] == "squad-p0"
    assert detect_corpus_format(archive) == "squad"

    hotpot = write_jsonl(tmp_path / "hotpot.jsonl", [
        {"question": "q", "passages": [{"title": "A", "text": "first A"},
                                       {"title": "B", "text": "b", "sentences": ["b"]}]},
        {"question": "q2", "passages": [{"title": "A", "text": "second A"}]},
    ])
    docs = load_corpus(hotpot)
    assert [(d.id, d.text) for d in docs] == [("hotpotqa:A", "first A"), ("hotpotqa:B", "b")]
    assert docs[1].sentences == ("b",)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data folder absent")
def test_shared_corpora_load() -> None:
    assert len(load_corpus(SHARED / "human_nutrition_2020_pages.jsonl")) == 1179
    docs, examples = load_squad(SHARED / "squad_dev_v1.1.json.zip")
    assert (len(docs), len(examples)) == (2067, 10570)
    assert len(load_corpus(SHARED / "hotpotqa_distractor.jsonl")) == 3904


# --- BM25 -----------------------------------------------------------------------------------

def test_bm25_round_trip_identical_tokens_and_scores(tmp_path: Path) -> None:
    texts = [f"{r.get('title', '')} {r['text']}" for r in CORPUS]
    index = BM25Index.build(texts, show_progress=False)
    index.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25")
    queries = ["rockets reaching orbits", "Why does bread rise?", "oranges and vitamins",
               "unknownword earth"]
    assert loaded.tokenize_queries(queries) == index.tokenize_queries(queries)
    for query in queries:
        assert np.array_equal(loaded.scores(query), index.scores(query))
    assert loaded.search(queries, 3) == index.search(queries, 3)
    # Stemming: "rockets"/"orbits" match "Rockets"/"orbit"; the rocket text ranks first.
    assert index.search(["rockets orbits"], 1)[0][0][0] == 0


def test_bm25_empty_query_and_k_cap() -> None:
    index = BM25Index.build([r["text"] for r in CORPUS], show_progress=False)
    assert index.search(["the and of", "", "zzzz"], 5) == [[], [], []]
    assert not index.scores("the and of").any()
    hits = index.search(["earth"], 100)[0]
    assert sorted(p for p, _ in hits) == [0, 4]  # every text holding the word, no more
    # Same ranking as bm25s's own retrieve.
    ids = index.tokenize_queries(["bread yeast sugar oranges"])
    positions, scores = index.retriever.retrieve(ids, k=2, show_progress=False)
    ours = index.search_tokens(ids, 2)[0]
    assert [p for p, _ in ours] == positions[0].tolist()
    assert [s for _, s in ours] == pytest.approx(scores[0].tolist())


def test_bm25_config_validation() -> None:
    with pytest.raises(ConfigError, match="BM25Config: method: Input should be"):
        BM25Config(method="okapi")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="stemmer"):
        BM25Config(stemmer="klingon")


# --- fusion ---------------------------------------------------------------------------------

def test_min_max_and_weighted_fusion_by_hand() -> None:
    bm25 = [(0, 10.0), (1, 6.0), (2, 2.0)]     # normalised: 1.0, 0.5, 0.0
    dense = [(1, 0.9), (3, 0.7), (0, 0.5)]     # normalised: 1.0, 0.5, 0.0
    assert min_max_normalise(bm25) == {0: 1.0, 1: 0.5, 2: 0.0}
    assert min_max_normalise([(4, 3.0), (5, 3.0)]) == {4: 1.0, 5: 1.0}
    fused = weighted_fusion(bm25, dense, alpha=0.25)
    # 0: .75·1 + .25·0 = .75;  1: .75·.5 + .25·1 = .625;  3: .25·.5 = .125;  2: 0
    assert [p for p, _ in fused] == [0, 1, 3, 2]
    assert [s for _, s in fused] == pytest.approx([0.75, 0.625, 0.125, 0.0])
    assert [p for p, _ in weighted_fusion(bm25, dense, alpha=1.0)][:2] == [1, 3]
    assert weighted_fusion([], dense, 0.5)[0] == (1, 0.5)
    with pytest.raises(ValueError):
        weighted_fusion(bm25, dense, alpha=1.5)


def test_reciprocal_rank_fusion_by_hand() -> None:
    fused = reciprocal_rank_fusion([[(0, 9.0), (1, 8.0)], [(1, 0.9), (2, 0.8)]], k=60)
    # 1: 1/62 + 1/61;  0: 1/61;  2: 1/62
    assert [p for p, _ in fused] == [1, 0, 2]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1][1] == pytest.approx(1 / 61)
    assert reciprocal_rank_fusion([[(5, 1.0)], [(4, 1.0)]])[0][0] == 4  # tie → lower position


# --- hygiene --------------------------------------------------------------------------------

GOOD = "Vitamin C supports the immune system and helps the body absorb iron from plant foods."
SHORT_SENTENCE = "Iron helps red blood cells carry oxygen."


@pytest.mark.parametrize(("text", "loose", "strict"), [
    (GOOD, None, None),
    (SHORT_SENTENCE, None, "too short (7 words)"),
    ("Figure 3.1 The food pyramid", "caption", "too short (5 words)"),
    ("Figure 3.1 The food pyramid shows grains at the base, then fruit and vegetables, "
     "then dairy and protein foods.", "caption", "caption"),
    ("12.5 | 33.1 | 40.2 | 18.7 | 99.9 | 10.0", "mostly non-alphabetic (0% letters)",
     "too short (11 words)"),
    ("Carbohydrates and Blood Glucose Regulation", "heading", "too short (5 words)"),
    ("References\nSmith J. (2019). Protein needs. Journal of Nutrition 12: 1-9.", "reference list",
     "too short (11 words)"),
    ("Smith et al. studied sodium in adults in many places across the world. "
     "Jones (2018) found less. Lee et al. agreed in a later large cohort study of adults.",
     "reference list", "reference list"),
])
def test_hygiene_presets(text: str, loose: str | None, strict: str | None) -> None:
    assert removal_reason(text, "off") is None
    assert removal_reason(text, "loose") == loose
    assert removal_reason(text, "strict") == strict


def test_hygiene_reports_removed_with_reasons() -> None:
    docs = [Document(id="a", text=GOOD), Document(id="b", text="Table 2"),
            Document(id="c", text=SHORT_SENTENCE)]
    assert apply_hygiene(docs).kept == docs
    loose = apply_hygiene(docs, "loose")
    assert [d.id for d in loose.kept] == ["a", "c"]
    assert [(r.item.id, r.reason) for r in loose.removed] == [("b", "too short (2 words)")]
    strict = apply_hygiene(docs, "strict")
    assert [d.id for d in strict.kept] == ["a"]
    with pytest.raises(ConfigError, match="hygiene preset"):
        removal_reason(GOOD, "medium")  # type: ignore[arg-type]


# --- index facade ---------------------------------------------------------------------------

def test_build_writes_manifest_and_searches_every_mode(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert manifest["chunk_count"] == 5 and manifest["corpus_format"] == "jsonl"
    assert {"chunks.jsonl", "chunks.offsets"} <= set(manifest["files"])
    assert "chunks.jsonl" in manifest["files"] and "dense/dense.faiss" in manifest["files"]
    assert "bm25/vocab.tokenizer.json" in manifest["files"]
    assert manifest["config"]["chunking"]["strategy"] == "none"
    assert not (built / "dense" / "shards").exists()

    index = Index.load(built, dense_encoder=fake_encoder)
    for mode in ("bm25", "dense", "hybrid", "rrf"):
        hits = index.search("Why does bread rise with yeast?", k=2, mode=mode)
        assert isinstance(hits[0], RetrievedDocument) and isinstance(hits[0].document, Document)
        assert hits[0].document.id == "bread#0" and hits[0].source_id == "bread"
        assert hits[0].document.title == "Baking"
        assert len(hits) <= 2 and hits[0].score >= hits[-1].score
    assert len(index.search("earth", k=50, mode="dense")) == 5  # k > corpus → all chunks
    assert index.search("the of and", k=3, mode="bm25") == []
    assert index.search("   ", k=3, mode="hybrid") == []
    assert index.search("the of and", k=3, mode="hybrid")  # dense side still answers
    with pytest.raises(ConfigError, match="k must be >= 1"):
        index.search("bread", k=0)
    with pytest.raises(ConfigError, match="search mode"):
        index.search("bread", mode="fuzzy")  # type: ignore[arg-type]


def test_index_errors_name_the_folder_and_file(built: Path, tmp_path: Path,
                                               corpus_file: Path) -> None:
    with pytest.raises(ConfigError, match="already holds an index"):
        build_index(corpus_file, built, IndexConfig(dense=None), show_progress=False)
    (built / "bm25" / "vocab.tokenizer.json").unlink()
    with pytest.raises(IndexFormatError, match=r"missing file bm25/vocab\.tokenizer\.json"):
        Index.load(built)
    manifest = json.loads((built / "manifest.json").read_text())
    manifest["format_version"] = 99
    (built / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match=rf"{built}.*version 99"):
        Index.load(built)
    (built / "manifest.json").unlink()
    with pytest.raises(IndexFormatError, match="manifest.json is missing"):
        Index.load(built)
    with pytest.raises(IndexFormatError, match="not found"):
        Index.load(tmp_path / "nowhere")


def test_bm25_only_index_refuses_dense_modes(tmp_path: Path, corpus_file: Path) -> None:
    index = build_index(corpus_file, tmp_path / "b", IndexConfig(dense=None),
                        show_progress=False)
    assert index.modes == ("bm25",)
    with pytest.raises(ConfigError, match="without dense"):
        index.search("bread", mode="hybrid")
    with pytest.raises(ConfigError, match="at least one retriever"):
        IndexConfig(bm25=None, dense=None)


def test_bad_corpora_fail_before_writing(tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "ok"}, {"id": "b"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2"):
        build_index(bad, tmp_path / "i", IndexConfig(dense=None), show_progress=False)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match="empty"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "i", IndexConfig(dense=None))
    assert not (tmp_path / "i" / "manifest.json").exists()


def test_interrupted_dense_build_resumes_after_last_shard(tmp_path: Path,
                                                          corpus_file: Path) -> None:
    encoded: list[str] = []

    def counting_encoder(texts):
        encoded.extend(texts)
        return fake_encoder(texts)

    def stop_after_first(number: int, total: int) -> None:
        assert total == 3  # 5 chunks, 2 per shard
        raise KeyboardInterrupt

    config = IndexConfig(chunking=ChunkingConfig("none"), bm25=None, dense=FAKE_DENSE)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus_file, tmp_path / "idx", config, dense_encoder=counting_encoder,
                    on_shard=stop_after_first, show_progress=False)
    assert len(encoded) == 2
    assert not (tmp_path / "idx" / "manifest.json").exists()
    assert (tmp_path / "idx" / "dense" / "shards" / "shard-00000.npy").is_file()

    encoded.clear()
    index = build_index(corpus_file, tmp_path / "idx", config, dense_encoder=counting_encoder,
                        show_progress=False)
    assert len(encoded) == 3  # only shards 1 and 2
    assert index.dense is not None and index.dense.size == 5
    fresh = build_index(corpus_file, tmp_path / "fresh", config, dense_encoder=fake_encoder,
                        show_progress=False)
    assert index.search("bread yeast", 5, "dense") == fresh.search("bread yeast", 5, "dense")


def test_retrieval_cache_skips_retrieval(built: Path) -> None:
    index = Index.load(built, dense_encoder=fake_encoder)
    first = index.search("rockets and orbit", k=3, mode="hybrid")

    def broken_encoder(texts):
        raise AssertionError("should have come from the cache")

    reloaded = Index.load(built, dense_encoder=broken_encoder)
    assert reloaded.search("rockets and orbit", k=3, mode="hybrid") == first
    assert len(reloaded.cache or []) == 1
    other = Index.load(built, dense_encoder=fake_encoder,
                       search_config=SearchConfig(alpha=0.9))
    other.search("rockets and orbit", k=3, mode="hybrid")  # other settings → new entry
    assert len(Index.load(built).cache or []) == 2


def test_reranker_hook_reorders(built: Path) -> None:
    class Reverse:
        def rerank(self, query, hits):
            return list(reversed(hits))

    index = Index.load(built, use_cache=False)
    plain = index.search("earth ocean orbit", k=2, mode="bm25")
    reranked = index.search("earth ocean orbit", k=2, mode="bm25", reranker=Reverse())
    assert [h.source_id for h in plain] == ["ocean", "rocket"]
    assert [h.source_id for h in reranked] == ["rocket", "ocean"]


# --- evaluation -----------------------------------------------------------------------------

def test_recall_mrr_and_subset() -> None:
    hits = [RetrievedDocument(Document(id=f"{s}#0", text="t"), 1.0, s) for s in "abac"]
    sources = ranked_sources(hits)
    assert sources == ["a", "b", "c"]
    assert (recall_at_k(sources, "c", 2), recall_at_k(sources, "c", 3)) == (0.0, 1.0)
    assert reciprocal_rank(sources, "b") == 0.5 and reciprocal_rank(sources, "z") == 0.0
    assert spread_subset(list(range(10)), 3) == [0, 3, 6]
    assert spread_subset([1, 2], None) == [1, 2]


def test_shards_of_another_corpus_are_discarded(tmp_path: Path) -> None:
    from sieverag.inference.retrieval.dense import corpus_fingerprint, write_embedding_shards

    encoded: list[str] = []

    def counting_encoder(texts):
        encoded.extend(texts)
        return fake_encoder(texts)

    shard_dir = tmp_path / "shards"
    old = ["a b", "c d", "e f"]
    write_embedding_shards(old, shard_dir, counting_encoder, 2,
                           corpus_fingerprint(old, "m", 2), show_progress=False)
    assert len(encoded) == 3
    encoded.clear()
    write_embedding_shards(old, shard_dir, counting_encoder, 2,
                           corpus_fingerprint(old, "m", 2), show_progress=False)
    assert encoded == []  # everything finished already
    new = ["a b", "x y", "e f"]
    paths = write_embedding_shards(new, shard_dir, counting_encoder, 2,
                                   corpus_fingerprint(new, "m", 2), show_progress=False)
    assert encoded == new and len(paths) == 2


def test_failed_rebuild_keeps_the_old_index(built: Path, tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1"):
        build_index(bad, built, IndexConfig(dense=None), overwrite=True, show_progress=False)
    assert Index.load(built).size == 5
