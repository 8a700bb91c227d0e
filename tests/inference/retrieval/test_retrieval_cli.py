"""The retrieval commands (`index build`, `index search`, `eval-retrieval`), run through the
`sieverag` command line: flags, a YAML `--config` under them, and the errors a user can cause."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from repo_paths import TEST_DATA

from sieverag.cli import main
from sieverag.inference.cli.index import DATA_DIR_ENV, EVAL_CORPORA
from sieverag.inference.retrieval.manifest import MANIFEST_FILE

SQUAD = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
    {"context": "Rockets burn fuel to reach orbit.",
     "qas": [{"id": "q1", "question": "What do rockets burn?", "answers": [{"text": "fuel"}]}]},
    {"context": "Bread rises because yeast ferments sugar.",
     "qas": [{"id": "q2", "question": "Why does bread rise?", "answers": [{"text": "yeast"}]},
             {"id": "q3", "question": "the of and", "answers": [{"text": "x"}]}]},
]}]}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "title": "Rockets", "text": "Rockets burn fuel to reach orbit. They are "
                                                "loud. Most are tall. Few come back."},
        {"id": "b", "text": "Bread rises because yeast ferments sugar."},
        {"id": "c", "text": "Figure 2.1"},
    ]))
    return path


@pytest.fixture
def squad(tmp_path: Path) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(SQUAD))
    return path


def failure(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error of a command that must fail with exit code 2."""
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    return error


def recorded_chunking(index: Path) -> dict:
    return json.loads((index / MANIFEST_FILE).read_text())["config"]["chunking"]


@pytest.mark.parametrize(("command", "flag"), [
    (["index", "build"], "--chunking.strategy"),
    (["index", "search"], "--search.alpha"),
    (["eval-retrieval"], "--modes"),
])
def test_every_command_has_help_with_its_sections(command, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert flag in capsys.readouterr().out


def test_index_build_and_search(tmp_path: Path, corpus: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idx"
    assert main(["index", "build", "--corpus", str(corpus), "--out", str(out),
                 "--retrievers", "bm25", "--chunking.strategy", "tokens",
                 "--chunking.size", "50", "--chunking.overlap", "5"]) == 0
    assert "indexed 3 documents as 3 chunks (jsonl)" in capsys.readouterr().out
    assert recorded_chunking(out) == {"strategy": "tokens", "size": 50, "overlap": 5}
    assert main(["index", "search", str(out), "why does bread rise", "--mode", "bm25",
                 "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].strip().startswith("1.") and "b#0" in printed
    assert main(["index", "search", str(out), "the and of", "--mode", "bm25",
                 "--no-cache"]) == 0
    assert "no results" in capsys.readouterr().out
    assert main(["index", "search", str(out), "figure", "--mode", "bm25",
                 "--hygiene", "loose"]) == 0
    assert "c#0: too short (2 words)" in capsys.readouterr().out
    assert "without dense" in failure(capsys, ["index", "search", str(out), "bread",
                                               "--mode", "dense"])
    assert "search.alpha must be in [0, 1]" in failure(
        capsys, ["index", "search", str(out), "bread", "--search.alpha", "2"])
    assert "k must be >= 1" in failure(capsys, ["index", "search", str(out), "bread", "-k", "0"])
    assert "already holds an index" in failure(
        capsys, ["index", "build", "--corpus", str(corpus), "--out", str(out)])
    assert "chunking.overlap" in failure(
        capsys, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "x"),
                 "--retrievers", "bm25", "--chunking.size", "5", "--chunking.overlap", "5"])
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("argv", "words"), [
    # ask: --index, or the served / Milvus index of retrieval.*, exactly one
    (["ask", "q?"], "retrieval needs one index: an index folder (--index) or"),
    (["ask", "q?", "--index", "idx", "--retrieval.endpoint", "http://127.0.0.1:9"],
     "not both and not neither"),
    (["ask", "q?", "--retrieval.endpoint", "127.0.0.1:9"], "must be an http:// or https://"),
    (["ask", "q?", "--retrieval.uri", "m.db"], "add --retrieval.backend milvus"),
    (["ask", "q?", "--retrieval.backend", "milvus"], "milvus needs retrieval.uri"),
    (["ask", "q?", "--index", "idx", "--retrieval.backend", "milvus", "--retrieval.uri",
      "m.db"], "searches retrieval.uri only: drop --index and retrieval.endpoint"),
    (["ask", "q?", "--index", str(Path("no") / "such")], "index folder no"),
    (["ask", "q?", "--retrieval.endpoint", "http://127.0.0.1:9", "--retrieval.collection", "c"],
     "retrieval.collection does not apply to index server http://127.0.0.1:9: drop it"),
    # index search: an option INDEX cannot use is refused, naming it
    (["index", "search", "http://127.0.0.1:9", "q", "--no-cache"],
     "--cache/--no-cache does not apply to index server http://127.0.0.1:9"),
    (["index", "search", "m.db", "q", "--backend", "milvus", "--cache"],
     "--cache/--no-cache does not apply to Milvus collection 'sieverag' at m.db"),
    (["index", "search", "idx", "q", "--timeout", "5"], "--timeout does not apply to index idx"),
    (["index", "search", "idx", "q", "--api-key-env", "KEY"], "--api-key-env does not apply"),
    (["index", "search", "http://127.0.0.1:9", "q", "--collection", "c"],
     "--collection does not apply to index server"),
    (["index", "search", "http://127.0.0.1:9", "q", "--timeout", "0"], "--timeout must be > 0"),
])
def test_ask_and_index_search_refuse_an_index_named_wrongly(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert words in failure(capsys, argv)


def test_a_yaml_config_gives_defaults_and_flags_override_it(tmp_path: Path, corpus: Path,
                                                             capsys) -> None:
    config = tmp_path / "index.yaml"
    config.write_text("retrievers: [bm25]\nchunking:\n  strategy: sentences\n  size: 3\n"
                      "bm25:\n  k1: 1.2\n")
    out = tmp_path / "idx"
    assert main(["index", "build", "--config", str(config), "--corpus", str(corpus),
                 "--out", str(out), "--chunking.size", "2"]) == 0
    assert "modes: bm25" in capsys.readouterr().out
    # strategy from the file, size from the flag, overlap the sentences default (1).
    assert recorded_chunking(out) == {"strategy": "sentences", "size": 2, "overlap": 1}
    recorded = json.loads((out / MANIFEST_FILE).read_text())["config"]
    assert recorded["bm25"]["k1"] == 1.2 and recorded["dense"] is None


def test_an_unknown_yaml_key_or_flag_is_refused_by_name(tmp_path: Path, corpus: Path,
                                                         capsys) -> None:
    config = tmp_path / "index.yaml"
    config.write_text("chunking:\n  stratgy: sentences\n")
    error = failure(capsys, ["index", "build", "--config", str(config), "--corpus", str(corpus),
                             "--out", str(tmp_path / "idx")])
    assert "chunking.stratgy: unknown setting" in error and str(config) in error
    with pytest.raises(SystemExit) as exit_info:
        main(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"),
              "--chunk", "sentences"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --chunk sentences" in capsys.readouterr().err
    error = failure(capsys, ["index", "build", "--corpus", str(corpus),
                             "--out", str(tmp_path / "idx"), "--retrievers", "bm25,splade"])
    assert "retrievers.1: Input should be 'bm25' or 'dense'" in error
    assert not (tmp_path / "idx").exists()


def test_eval_retrieval_on_a_tiny_squad(tmp_path: Path, squad: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    assert main(["eval-retrieval", "--data", str(squad), "--modes", "bm25", "--index-dir",
                 str(tmp_path / "idx"), "--out", str(out), "--ks", "5,1"]) == 0
    assert "R@1" in capsys.readouterr().out
    result = json.loads(out.read_text())
    row = result["results"][0]
    assert result["questions"] == 3 and row["mode"] == "bm25"
    assert row["recall@1"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["mrr"] == pytest.approx(2 / 3, abs=1e-4)
    # A benchmark is not chunked unless asked; a partial chunking section keeps that default.
    assert result["config"]["chunking"]["strategy"] == "none"
    assert result["config"]["dense"] is None and result["alpha"] == 0.5
    error = failure(capsys, ["eval-retrieval", "--data", str(squad), "--modes", "bm25,magic"])
    assert "modes.1: Input should be 'bm25', 'dense', 'hybrid' or 'rrf'" in error
    assert "ks must be positive" in failure(capsys, ["eval-retrieval", "--data", str(squad),
                                                     "--ks", "0,5"])
    assert "pass --data" in failure(capsys, ["eval-retrieval", "--data",
                                             str(tmp_path / "none.json"), "--modes", "bm25"])


def test_eval_retrieval_needs_data_or_the_data_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    error = failure(capsys, ["eval-retrieval", "--modes", "bm25"])
    assert "--data" in error and f"${DATA_DIR_ENV}" in error
    file_name = EVAL_CORPORA["squad"][0]
    with zipfile.ZipFile(tmp_path / file_name, "w") as archive:
        archive.writestr("dev-v1.1.json", json.dumps(SQUAD))
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    out = tmp_path / "result.json"
    assert main(["eval-retrieval", "--modes", "bm25", "--index-dir", str(tmp_path / "idx"),
                 "--out", str(out), "--chunking.size", "50"]) == 0
    result = json.loads(out.read_text())
    assert result["data"] == str(tmp_path / file_name) and result["questions"] == 3
    assert result["config"]["chunking"] == {"strategy": "none", "size": 50, "overlap": 0}


def test_several_corpus_files_make_one_index(tmp_path: Path, corpus: Path, squad: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = TEST_DATA
    hotpot, pages = data / "hotpotqa_sample.jsonl", data / "nutrition_pages_sample.jsonl"
    out = tmp_path / "open"
    assert main(["index", "build", "--corpus", f"{hotpot},{squad},{pages}", "--out", str(out),
                 "--retrievers", "bm25"]) == 0
    assert "(hotpotqa,squad,nutrition)" in capsys.readouterr().out
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["corpus"] == ",".join(str(p.resolve()) for p in (hotpot, squad, pages))
    chunk_ids = [json.loads(line)["id"] for line in (out / "chunks.jsonl").open()]
    assert any(i.startswith("hotpotqa:") for i in chunk_ids)
    assert any(i.startswith("squad-p") for i in chunk_ids)
    assert any(i.startswith("page-") for i in chunk_ids)
    assert main(["index", "search", str(out), "why does bread rise", "--mode", "bm25",
                 "-k", "1"]) == 0
    assert "squad-p1#0" in capsys.readouterr().out
    # The same id in two files is one error naming both.
    twin = tmp_path / "twin.jsonl"
    twin.write_text(json.dumps({"id": "a", "text": "Another text."}) + "\n")
    error = failure(capsys, ["index", "build", "--corpus", f"{corpus},{twin}",
                             "--out", str(tmp_path / "dup"), "--retrievers", "bm25"])
    assert f"corpus {twin}: document id 'a' is also in {corpus}" in error
