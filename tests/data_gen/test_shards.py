"""`label --shard I/N` and `build-dataset --labels A,B,...`: two shards merged give the dataset
one unsharded run gives, record for record; overlapping shards and shards of other settings
are refused with one line naming the folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.cli import main
from sieverag.data_gen.shards import in_shard, parse_shard, shard_index
from sieverag.inference.core.errors import ConfigError

QUESTIONS = 16


def write_dataset(path: Path) -> Path:
    """Questions whose first chunk holds the answer, the others not."""
    with path.open("w") as handle:
        for q in range(QUESTIONS):
            ctxs = [{"title": f"T{q}-{c}",
                     "text": (f"The answer is city{q}. It is old." if c == 0
                              else f"Fact {c} about topic {q}. More text here.")}
                    for c in range(3)]
            handle.write(json.dumps({"id": f"q{q}", "question": f"Where is topic {q}?",
                                     "answers": [f"city{q}"], "ctxs": ctxs}) + "\n")
    return path


def label(dataset: Path, out: Path, *flags: str) -> None:
    assert main(["label", "--dataset", str(dataset), "--out", str(out), "--scorer", "none",
                 "--borrowed-negatives", "2", "--quiet", *flags]) == 0


def build(labels: list[Path], out: Path, tokenizer: Path) -> dict[str, list[dict]]:
    assert main(["build-dataset", "--labels", ",".join(map(str, labels)), "--out", str(out),
                 "--tokenizer", str(tokenizer), "--quiet"]) == 0
    return {split: [json.loads(line) for line in
                    (out / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "validation")}


def question_ids(folder: Path) -> list[str]:
    return [json.loads(line)["question_id"]
            for line in (folder / "labels.jsonl").read_text().splitlines()]


def test_the_shard_of_a_question_is_a_stable_hash_of_its_id() -> None:
    # sha256 of the id, not hash(): the same in every process and on every machine.
    assert [shard_index(f"q{q}", 4) for q in range(8)] == [4, 3, 4, 4, 4, 2, 2, 4]
    assert all(sum(in_shard(f"q{q}", f"{i}/3") for i in (1, 2, 3)) == 1 for q in range(50))
    assert in_shard("anything", None)
    assert parse_shard(" 2/5 ") == (2, 5)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ConfigError, match="shard must be I/N"):
            parse_shard(bad)


def test_two_shards_merged_equal_one_unsharded_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    label(dataset, tmp_path / "whole")
    label(dataset, tmp_path / "a", "--shard", "1/2")
    label(dataset, tmp_path / "b", "--shard", "2/2")
    first, second = question_ids(tmp_path / "a"), question_ids(tmp_path / "b")
    assert first and second and not set(first) & set(second)
    assert sorted(first + second) == sorted(question_ids(tmp_path / "whole"))
    settings = json.loads((tmp_path / "a" / "label_config.json").read_text())
    assert settings["shard"] == "1/2"
    whole = build([tmp_path / "whole"], tmp_path / "d-whole", tiny_model_dir)
    # Given in either order, the shards merge back into the dataset's order.
    merged = build([tmp_path / "b", tmp_path / "a"], tmp_path / "d-merged", tiny_model_dir)
    assert whole["train"] and whole == merged


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line `sieverag ARGV` ends with (exit code 2)."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_overlapping_or_mismatched_shards_are_refused(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    label(dataset, tmp_path / "a", "--shard", "1/2")
    label(dataset, tmp_path / "a-again", "--shard", "1/2")
    label(dataset, tmp_path / "third", "--shard", "1/3")
    assert main(["label", "--dataset", str(dataset), "--out", str(tmp_path / "other"),
                 "--scorer", "none", "--quiet", "--shard", "2/2"]) == 0  # no borrowed negatives
    out = tmp_path / "d"
    for folders, words in ((["a", "a-again"], "are both shard 1/2 (they overlap)"),
                           (["a", "third"], "split the dataset differently and overlap"),
                           (["a", "other"], "borrowed_negatives differ")):
        paths = [str(tmp_path / f) for f in folders]
        line = refusal(["build-dataset", "--labels", ",".join(paths), "--out", str(out),
                        "--tokenizer", str(tiny_model_dir), "--quiet"], capsys)
        assert words in line and all(p in line for p in paths), line
    assert not out.exists()


def test_a_folder_is_resumed_only_as_the_same_shard(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    label(dataset, tmp_path / "a", "--shard", "1/2")
    base = ["label", "--dataset", str(dataset), "--scorer", "none", "--quiet",
            "--borrowed-negatives", "2"]
    assert "shard differ" in refusal([*base, "--out", str(tmp_path / "a"), "--shard", "2/2"],
                                     capsys)
    assert "shard must be I/N" in refusal([*base, "--out", str(tmp_path / "b"), "--shard",
                                           "3/2"], capsys)
