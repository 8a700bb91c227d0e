"""Dense retrieval with the real embedded all-MiniLM-L6-v2 on a few documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.inference.core.errors import ModelNotFoundError
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.dense import DenseConfig, DenseIndex, resolve_embedding_model
from sieverag.inference.retrieval.index_folder import Index, build_index
from sieverag.inference.retrieval.rerank import CrossEncoderReranker

TEXTS = [
    "Rockets burn fuel to reach orbit around the Earth.",
    "Bread rises because yeast ferments sugar in the dough.",
    "Vitamin C supports the immune system; oranges are rich in it.",
    "Cats sleep most of the day and hunt at night.",
]


def test_model_names_resolve() -> None:
    path = resolve_embedding_model("all-MiniLM-L6-v2")
    assert (path / "config.json").is_file()
    assert resolve_embedding_model(str(path)) == path  # any local folder
    with pytest.raises(ModelNotFoundError, match="'bert-huge'.*all-minilm-l6-v2"):
        resolve_embedding_model("bert-huge")


def test_dense_index_finds_the_right_text(tmp_path: Path) -> None:
    index = DenseIndex.build(TEXTS, tmp_path / "dense", DenseConfig(shard_size=3),
                             show_progress=False)
    results = index.search(["How do spacecraft get into space?", "what makes dough rise"], 4)
    assert [r[0][0] for r in results] == [0, 1]
    assert all(-1.0 <= s <= 1.0001 for r in results for _, s in r)
    assert len(results[0]) == 4
    loaded = DenseIndex.load(tmp_path / "dense")
    assert loaded.size == 4
    again = loaded.search(["what makes dough rise"], 2)[0]
    assert [p for p, _ in again] == [p for p, _ in results[1][:2]]
    assert [s for _, s in again] == pytest.approx([s for _, s in results[1][:2]], abs=1e-5)


def test_hybrid_index_and_reranker_with_real_model(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n"
                              for i, t in enumerate(TEXTS)))
    build_index(corpus, tmp_path / "idx", IndexConfig(chunking=ChunkingConfig("none")),
                show_progress=False)
    index = Index.load(tmp_path / "idx")
    for mode in ("dense", "hybrid", "rrf"):
        assert index.search("which fruit has vitamin C", 1, mode)[0].source_id == "t2"
    model_dir = resolve_embedding_model("all-minilm-l6-v2")
    # A cross-encoder head on MiniLM is untrained: only the hook's mechanics are checked.
    reranker = CrossEncoderReranker(model_dir)
    hits = index.search("which fruit has vitamin C", 3, "hybrid", reranker=reranker)
    assert len(hits) == 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    with pytest.raises(ModelNotFoundError):
        CrossEncoderReranker(tmp_path / "no-model")
