"""Bring your own index: a FAISS index built elsewhere (here, in the test) and its corpus in
FlashRAG's jsonl or DPR's tsv, searched without re-embedding anything."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest
from fake_dense import fake_encoder

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.dense import DenseConfig
from sieverag.inference.retrieval.index_folder import Index
from sieverag.inference.retrieval.prebuilt import import_index, prebuilt_source

PASSAGES = [("Rockets", "Rockets burn fuel to reach orbit around the Earth."),
            ("Bread", "Bread rises because yeast ferments sugar in the dough."),
            ("Vitamin C", "Vitamin C supports the immune system; oranges are rich in it."),
            ("Cats", "Cats sleep most of the day and hunt at night."),
            ("Ocean", "The ocean covers most of the Earth and holds salty water.")]


def _prebuilt(tmp_path: Path, spec: str = "Flat") -> Path:
    """What another project ships: a FAISS file of its passages' vectors (as FlashRAG
    embeds them: title and text)."""
    vectors = fake_encoder([f"{title}\n{text}" for title, text in PASSAGES])
    index = faiss.index_factory(vectors.shape[1], spec, faiss.METRIC_INNER_PRODUCT)
    index.add(np.ascontiguousarray(vectors))
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    return tmp_path / "e5_Flat.index"


def test_flashrag_jsonl_and_dpr_tsv_import_without_embedding(tmp_path: Path) -> None:
    index_file = _prebuilt(tmp_path)
    flashrag = tmp_path / "wiki18.jsonl"
    flashrag.write_text("".join(json.dumps({"id": str(n), "contents": f'"{t}"\n{x}'}) + "\n"
                                for n, (t, x) in enumerate(PASSAGES)))
    dpr = tmp_path / "psgs_w100.tsv"
    dpr.write_text("id\ttext\ttitle\n" + "".join(f"{n + 1}\t{x}\t{t}\n"
                                                 for n, (t, x) in enumerate(PASSAGES)))
    dense = DenseConfig(model="fake", query_prefix="")
    for corpus, name in ((flashrag, "flashrag"), (dpr, "dpr")):
        imported = import_index(index_file, corpus, tmp_path / name, dense,
                                bm25=BM25Config(), show_progress=False)
        assert imported.modes == ("bm25", "dense", "hybrid", "rrf")
        assert prebuilt_source(tmp_path / name) == index_file.resolve()
        assert not (tmp_path / name / "dense" / "dense.faiss").exists()  # pointed at, not copied
        loaded = Index.load(tmp_path / name, dense_encoder=fake_encoder, use_cache=False)
        hit = loaded.search("Vitamin C oranges immune system", 1, "dense")[0]
        assert hit.document.title == "Vitamin C" and hit.score == pytest.approx(
            float(fake_encoder(["Vitamin C oranges immune system"])[0]
                  @ fake_encoder(["Vitamin C\n" + PASSAGES[2][1]])[0]), abs=1e-5)
        assert loaded.search("yeast dough", 1, "hybrid")[0].document.title == "Bread"


def test_import_refuses_mismatches(tmp_path: Path) -> None:
    index_file = _prebuilt(tmp_path)
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"id": "0", "contents": "one passage"}) + "\n")
    with pytest.raises(DatasetError, match="holds 1 records but the FAISS index .* holds 5"):
        import_index(index_file, short, tmp_path / "x", DenseConfig(model="fake"))
    assert not (tmp_path / "x").exists()
    with pytest.raises(DatasetError, match="not found"):
        import_index(tmp_path / "none.index", short, tmp_path / "x", DenseConfig(model="fake"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(n), "text": x}) + "\n"
                              for n, (_, x) in enumerate(PASSAGES)))
    import_index(index_file, corpus, tmp_path / "ok", DenseConfig(model="fake"))
    wrong_width = Index.load(tmp_path / "ok", use_cache=False,
                             dense_encoder=lambda texts: np.ones((len(texts), 8), np.float32))
    with pytest.raises(ConfigError, match="gives 8-dimension vectors, the index holds 64"):
        wrong_width.search("anything", 3, "dense")
    index_file.unlink()
    with pytest.raises(DatasetError, match="prebuilt FAISS index it points at"):
        Index.load(tmp_path / "ok")
