"""Gold marks survive an index: retrieved chunks are matched to the question's given passages
by text (and title), so over-index runs report read precision/recall and gold flags."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from repo_paths import TEST_DATA
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.composition.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
)
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import load_examples
from sieverag.inference.data.gold_match import PassageMatcher, mark_gold, read_passage_ids
from sieverag.inference.eval import runner
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index_folder import build_index

DATA = TEST_DATA
BRIDGE = ("The Calder Bridge over the river Tamsin was opened in 1901 by the mayor of "
          "Quorrin, who had paid for it himself.")
GOLD = Document(id="q/0", title="Calder Bridge", text=BRIDGE + " It was rebuilt in 1950.",
                is_gold=True)
OTHER = Document(id="q/1", title="Penguins", text="Penguins huddle together in winter to keep "
                 "warm, taking turns at the windy edge of the group.", is_gold=False)
EXAMPLE = Example(id="q", question="Who opened the Calder Bridge?", answers=("the mayor",),
                  documents=(GOLD, OTHER))


def chunk(doc_id: str, text: str, title: str = "") -> Document:
    return Document(id=doc_id, text=text, title=title)


def test_a_chunk_of_a_gold_passage_is_gold_and_a_stranger_is_not() -> None:
    retrieved = [chunk("c#0", BRIDGE, "Calder Bridge"),        # the passage's first chunk
                 chunk("c#1", "  it was REBUILT in 1950.  "),  # too short to match by part
                 chunk("p#0", OTHER.text.upper()),             # untitled, case differs
                 chunk("x#0", BRIDGE, "Tamsin River")]         # same words, other title
    marked = mark_gold(EXAMPLE, retrieved)
    assert [d.is_gold for d in marked] == [True, False, False, False]
    assert [d.id for d in marked] == ["c#0", "c#1", "p#0", "x#0"]  # ids stay the index's
    assert read_passage_ids(EXAMPLE, retrieved) == ["q/0", "c#1", "q/1", "x#0"]
    # A chunk that holds a whole passage comes from it; a given passage is its own source.
    assert PassageMatcher(EXAMPLE.documents).source(
        chunk("m#0", "Intro. " + GOLD.text)) is GOLD
    assert PassageMatcher(EXAMPLE.documents).source(GOLD) is GOLD


def test_marks_are_kept_and_unmarked_data_stays_unmarked() -> None:
    already = replace(chunk("c#0", BRIDGE), is_gold=False)
    assert mark_gold(EXAMPLE, [already])[0].is_gold is False
    unmarked = replace(EXAMPLE, documents=tuple(replace(d, is_gold=None)
                                                for d in EXAMPLE.documents))
    assert mark_gold(unmarked, [chunk("c#0", BRIDGE)])[0].is_gold is None
    no_passages = replace(EXAMPLE, documents=())
    assert mark_gold(no_passages, [chunk("c#0", BRIDGE)])[0].is_gold is None
    assert read_passage_ids(no_passages, [chunk("c#0", BRIDGE)]) == ["c#0"]


def test_an_over_index_run_reports_read_precision_recall_and_gold_flags(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    dataset = DATA / "hotpotqa_sample.jsonl"
    index = tmp_path / "index"
    build_index(dataset, index, IndexConfig(dense=None, corpus_format="hotpotqa"),
                show_progress=False)
    spec = BackendSpec(model=str(tiny_model_dir), batch_size=8)
    config = RunConfig(dataset=str(dataset), pipelines=("vanilla", "amber"),
                       retrieval=RetrievalConfig(index=str(index), mode="bm25", k=4),
                       models=ModelRoles(generator=spec, filter=spec),
                       trust=TrustConfig(enabled=False))
    config = replace(config, amber=replace(config.amber, filter="none", k=2,
                                           max_iterations=2))
    summaries = runner.run_evaluation(config, tmp_path / "run", progress=False)
    assert summaries["vanilla"]["read_graded_examples"] == 2
    assert 0.0 <= summaries["vanilla"]["read_all_gold"] <= 1.0
    examples = {e.id: e for e in load_examples(str(dataset))}
    for pipeline in ("vanilla", "amber"):
        records = [json.loads(line) for line in
                   (tmp_path / "run" / "results" / f"{pipeline}.jsonl").open()]
        assert len(records) == len(examples)
        for record in records:
            gold_titles = {d.title for d in examples[record["id"]].documents if d.is_gold}
            scores = record["read_scores"]
            assert scores is not None
            # Over BM25 top-4 of the sample's passages, a gold passage is among those read.
            assert scores["recall"] > 0, (pipeline, record["id"], gold_titles)
    amber = json.loads((tmp_path / "run" / "results" / "amber.jsonl").open().readline())
    scored = [d for r in amber["trace"]["rounds"] for d in r["scored"]]
    assert scored and all(d["is_gold"] in (True, False) for d in scored)
    assert any(d["is_gold"] for d in scored)
