"""The test helper `standard_exports` writes the benchmarks' hub schemas from the project's
layouts; a sample file exported that way loads through the hub schema's adapter into the
same questions, answers and gold passages as the sample itself."""

from __future__ import annotations

import pytest
from repo_paths import TEST_DATA
from standard_exports import EXPORTS, read_jsonl, write_jsonl

from sieverag.inference.data import detect_format, load_examples

DATA = TEST_DATA


@pytest.mark.parametrize(("name", "sample", "hub_format"), [
    ("hotpotqa", "hotpotqa_heldout_sample.jsonl", "hotpotqa-original"),
    ("nq-open", "nq_sample.jsonl", "nq-open"),
    ("triviaqa", "triviaqa_sample.jsonl", "triviaqa-original"),
    ("popqa", "popqa_sample.jsonl", "popqa"),
    ("arc-challenge", "arc_sample.jsonl", "arc"),
])
def test_an_export_reads_back_as_its_source(tmp_path, name, sample, hub_format):
    questions, passages = EXPORTS[name](read_jsonl(DATA / sample))
    path = write_jsonl(tmp_path / f"{name}.jsonl", questions)
    assert detect_format(path) == hub_format
    # Question-only exports are loaded as a run over an index loads them.
    exported = load_examples(path, require_documents=False)
    original = load_examples(DATA / sample)
    assert [(e.question, set(e.answers)) for e in exported] == [
        (e.question, set(e.answers)) for e in original]
    if name == "hotpotqa":  # the passages and their gold marks survive the hub's columns
        for ours, theirs in zip(exported, original, strict=True):
            assert [(d.title, d.is_gold) for d in ours.documents] == [
                (d.title, d.is_gold) for d in theirs.documents]
            assert [d.text.split() for d in ours.documents] == [
                d.text.split() for d in theirs.documents]
    else:  # question-only exports; the passages the rows carried become a corpus
        assert all(not e.documents for e in exported) or name == "arc-challenge"
        texts = {p["text"] for p in passages}
        assert {d.text for e in original for d in e.documents} <= texts
