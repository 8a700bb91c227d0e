"""The retrieval subcommands, registered on a fresh argparse parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sieverag.inference.errors import ConfigError, DatasetError, SieveragError
from sieverag.inference.retrieval.cli import register


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sieverag")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def run(argv: list[str]) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "title": "Rockets", "text": "Rockets burn fuel to reach orbit."},
        {"id": "b", "text": "Bread rises because yeast ferments sugar."},
        {"id": "c", "text": "Figure 2.1"},
    ]))
    return path


def test_every_subcommand_has_help() -> None:
    parser = make_parser()
    for argv in (["index", "build"], ["index", "search"], ["eval-retrieval"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([*argv, "--help"])
        assert exit_info.value.code == 0


def test_index_build_and_search(tmp_path: Path, corpus: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idx"
    assert run(["index", "build", "--corpus", str(corpus), "--out", str(out), "--bm25",
                "--chunk", "tokens", "--chunk-size", "50", "--chunk-overlap", "5"]) == 0
    assert "indexed 3 documents as 3 chunks (jsonl)" in capsys.readouterr().out
    assert run(["index", "search", str(out), "why does bread rise", "--mode", "bm25",
                "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].strip().startswith("1.") and "b#0" in printed
    assert run(["index", "search", str(out), "the and of", "--mode", "bm25"]) == 0
    assert "no results" in capsys.readouterr().out
    run(["index", "search", str(out), "figure", "--mode", "bm25", "--hygiene", "loose"])
    assert "c#0: too short (2 words)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="without dense"):
        run(["index", "search", str(out), "bread", "--mode", "dense"])
    with pytest.raises(ConfigError, match="already holds an index"):
        run(["index", "build", "--corpus", str(corpus), "--out", str(out), "--bm25"])
    with pytest.raises(SieveragError, match="chunking.overlap"):
        run(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "x"),
             "--bm25", "--chunk-size", "5", "--chunk-overlap", "5"])


def test_eval_retrieval_on_a_tiny_squad(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    squad = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "Rockets burn fuel to reach orbit.",
         "qas": [{"id": "q1", "question": "What do rockets burn?", "answers": [{"text": "fuel"}]}]},
        {"context": "Bread rises because yeast ferments sugar.",
         "qas": [{"id": "q2", "question": "Why does bread rise?", "answers": [{"text": "yeast"}]},
                 {"id": "q3", "question": "the of and", "answers": [{"text": "x"}]}]},
    ]}]}
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(squad))
    out = tmp_path / "result.json"
    assert run(["eval-retrieval", "--data", str(data), "--mode", "bm25", "--index-dir",
                str(tmp_path / "idx"), "--out", str(out), "--k", "1,5"]) == 0
    assert "R@1" in capsys.readouterr().out
    result = json.loads(out.read_text())
    row = result["results"][0]
    assert result["questions"] == 3 and row["mode"] == "bm25"
    assert row["recall@1"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["mrr"] == pytest.approx(2 / 3, abs=1e-4)
    with pytest.raises(ConfigError, match="--mode"):
        run(["eval-retrieval", "--data", str(data), "--mode", "bm25,magic"])
    with pytest.raises(DatasetError, match="pass --data"):
        run(["eval-retrieval", "--data", str(tmp_path / "none.json"), "--mode", "bm25"])
