"""Passage sets (`sieverag hard-negatives`): retrieved hard negatives, their gold marks, the
snippet shape, and the output read back as a dataset with its source kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.cli import main
from sieverag.data_gen.label_records import read_labels
from sieverag.data_gen.labelling import LabelRunConfig, run_labelling
from sieverag.data_gen.passages import (
    PassageSetConfig,
    as_snippets,
    mine_passages,
    with_borrowed_negatives,
)
from sieverag.data_gen.strinc import strinc
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import example_source, load_examples

# Eight NQ-style questions, one gold passage each; the passages of rivers, of bridges and of
# composers share words, so BM25 finds close negatives for each question among the others'.
ROWS = [
    ("how long is the river thames", "215 miles", "River Thames",
     "The River Thames flows through London. The river is 215 miles long."),
    ("how long is the river severn", "220 miles", "River Severn",
     "The River Severn is the longest river in Britain. The river is 220 miles long."),
    ("where does the river trent rise", "Biddulph Moor", "River Trent",
     "The River Trent rises on Biddulph Moor. The river flows into the Humber."),
    ("when was tower bridge opened", "1894", "Tower Bridge",
     "Tower Bridge is a bridge in London. The bridge opened in 1894."),
    ("who designed the forth bridge", "John Fowler", "Forth Bridge",
     "The Forth Bridge is a railway bridge in Scotland. The bridge was designed by John "
     "Fowler."),
    ("who built the clifton suspension bridge", "Isambard Kingdom Brunel", "Clifton Bridge",
     "The Clifton Suspension Bridge spans the Avon Gorge. The bridge was built by Isambard "
     "Kingdom Brunel."),
    ("who composed the planets", "Gustav Holst", "The Planets",
     "The Planets is an orchestral suite. The suite was composed by Gustav Holst."),
    ("who composed the enigma variations", "Edward Elgar", "Enigma Variations",
     "The Enigma Variations is an orchestral work. The work was composed by Edward Elgar."),
]


@pytest.fixture()
def nq_file(tmp_path: Path) -> Path:
    path = tmp_path / "nq-small.jsonl"
    path.write_text("".join(json.dumps(
        {"question": q, "answers": [a], "ctxs": [{"title": t, "text": x, "hasanswer": True,
                                                  "isgold": True}],
         "nq_annotated_gold": {"title": t}}) + "\n"
        for q, a, t, x in ROWS), encoding="utf-8")
    return path


@pytest.fixture()
def popqa_file(tmp_path: Path) -> Path:
    path = tmp_path / "popqa-small.jsonl"
    rows = [{"id": str(k), "question": q, "answers": json.dumps([a]), "s_wiki_title": t,
             "crag_refined_retrieved_knowledge": x,
             "crag_web_search_knowledge": f"{t} is well known. It is often discussed."}
            for k, (q, a, t, x) in enumerate(ROWS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_hard_negatives_are_other_passages_without_the_answer(nq_file: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "nq-hn.jsonl"
    summary = mine_passages(PassageSetConfig(dataset=str(nq_file), out=str(out), negatives=2))
    assert (summary.source, summary.questions, summary.gold) == ("nq", 8, 8)
    # BM25 returns only passages sharing a word with the question: each composer question
    # finds one other passage, so those two questions are short of negatives
    assert summary.negatives == 14 and summary.short_of_negatives == 2
    examples = load_examples(out)
    texts = {x for *_, x in ROWS}
    for example in examples:
        assert example_source(example) == "nq"  # the source survives the common format
        gold, *negatives = example.documents
        assert gold.is_gold is True and len(negatives) in (1, 2)
        for negative in negatives:
            assert negative.is_gold is False  # NQ marks gold, so a negative is marked not gold
            assert negative.text in texts and negative.text != gold.text
            assert not strinc(negative.as_context(), example.answers)
    # BM25's nearest passages: another river for a river question, not a composer
    thames = next(e for e in examples if "thames" in e.question)
    assert thames.documents[1].title.startswith("River ")
    assert [e.id for e in examples] == [f"nq-{k}" for k in range(1, 9)]  # ids kept


def test_unmarked_sources_stay_unmarked_unless_asked(popqa_file: Path, tmp_path: Path) -> None:
    train = tmp_path / "popqa.jsonl"
    mine_passages(PassageSetConfig(dataset=str(popqa_file), out=str(train), negatives=2))
    example = load_examples(train)[0]
    assert example_source(example) == "popqa"
    assert all(d.is_gold is None for d in example.documents)  # the label policy decides
    evaluation = tmp_path / "popqa-eval.jsonl"
    summary = mine_passages(PassageSetConfig(dataset=str(popqa_file), out=str(evaluation),
                                             negatives=2, unmarked_gold="strinc"))
    assert summary.unmarked == 0
    marked = load_examples(evaluation)[0]
    assert [d.is_gold for d in marked.documents] == [True, False, False, False]


def test_sample_is_seeded_and_spread(nq_file: Path, tmp_path: Path) -> None:
    def ids(seed: int) -> list[str]:
        out = tmp_path / f"s{seed}.jsonl"
        mine_passages(PassageSetConfig(dataset=str(nq_file), out=str(out), negatives=1,
                                       sample=4, seed=seed))
        return [e.id for e in load_examples(out)]

    assert ids(0) == ids(0) and len(ids(0)) == 4
    assert ids(0) != ids(1)


def test_snippets_are_untitled_query_biased_windows() -> None:
    gold = Document(id="q/0", title="River Thames", is_gold=True,
                    text="London is large. The Thames is a river. The river is 215 miles "
                         "long. Boats use it.")
    other = Document(id="q/1", title="River Severn", is_gold=False,
                     text="Severn is in Wales. The river Severn is long. How long is it? "
                          "Nobody asks.")
    example = Example("q", "how long is the river thames", ("215 miles",), (gold, other))
    snippets = as_snippets(example, 2).documents
    assert all(d.title == "" for d in snippets)
    assert snippets[0].text == "The Thames is a river. The river is 215 miles long."
    assert strinc(snippets[0].text, example.answers)  # a gold snippet holds the answer
    # the negative's window is the one sharing most with the question
    assert snippets[1].text == "The river Severn is long. How long is it?"


def test_borrowed_negatives_follow_the_same_marking_rule() -> None:
    marked = Example("a", "q?", ("x",), (Document("a/0", "text a", is_gold=True),))
    unmarked = Example("b", "q?", ("y",), (Document("b/0", "text b"),))
    first, second = with_borrowed_negatives([marked, unmarked], 1, seed=0)
    assert first.documents[-1].is_gold is False and first.documents[-1].text == "text b"
    assert second.documents[-1].is_gold is None


def test_labels_name_the_rows_source(nq_file: Path, tmp_path: Path) -> None:
    mined = tmp_path / "nq-hn.jsonl"
    mine_passages(PassageSetConfig(dataset=str(nq_file), out=str(mined), negatives=2))
    run_labelling(LabelRunConfig(dataset=str(mined), out=str(tmp_path / "labels"),
                                 scorer=None), progress=False)
    records = read_labels(tmp_path / "labels" / "labels.jsonl")
    assert {r.source for r in records} == {"nq"}
    assert [c.gold for c in records[0].chunks] == [True, False, False]


def test_cli_writes_the_set_and_refuses_bad_settings(nq_file: Path, tmp_path: Path,
                                                     capsys) -> None:
    out = tmp_path / "cli.jsonl"
    assert main(["hard-negatives", "--dataset", str(nq_file), "--out", str(out),
                 "--negatives", "1", "--shape", "snippet"]) == 0
    assert "nq: 8 questions, 16 passages (8 gold, 8 hard negatives" in capsys.readouterr().out
    assert all(d.title == "" for e in load_examples(out) for d in e.documents)
    assert main(["hard-negatives", "--dataset", str(nq_file), "--out", str(out),
                 "--negatives", "-1"]) == 2
    assert "negatives must be >= 0" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="sample must be >= 1"):
        PassageSetConfig(dataset="x", out="y", sample=0)


def test_dense_and_hybrid_retrievers_mine_valid_negatives(nq_file: Path, tmp_path: Path) -> None:
    for retriever in ("dense", "hybrid"):
        out = tmp_path / f"{retriever}.jsonl"
        summary = mine_passages(PassageSetConfig(dataset=str(nq_file), out=str(out),
                                                 negatives=3, retriever=retriever))
        # the dense ranking covers the whole corpus, so no question is short of negatives
        assert (summary.negatives, summary.short_of_negatives) == (24, 0)
        for example in load_examples(out):
            gold, *negatives = example.documents
            assert all(d.is_gold is False and d.text != gold.text
                       and not strinc(d.as_context(), example.answers) for d in negatives)
        thames = next(e for e in load_examples(out) if "thames" in e.question)
        assert thames.documents[1].title.startswith("River ")  # the nearest: another river
