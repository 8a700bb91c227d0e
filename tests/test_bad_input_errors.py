"""Inputs past Python's limits or of the wrong kind end in one line naming the file (and the
line where there is one), exit code 2, never a traceback: JSON with a 5,000-digit integer or
nested 100,000 deep, files that are not UTF-8, YAML nested past the recursion limit or not
YAML at all (line and column, without PyYAML's caret picture), a corrupt label_config.json, a
run's results read by `trace`, an adapter's JSON files and safetensors header read by `filter
install`, and an --out that names a file. Each fails before any model loads, so no loading
output reaches stderr either. (`filter package` and eval-filter's cache: test_filter_adapters
and training/test_filter_eval.)"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from sieverag.cli import main

QUESTION = {"id": "q1", "question": "who wrote it?", "answers": ["Ann"],
            "ctxs": [{"title": "Book", "text": "Ann wrote it.", "is_gold": True}]}
GOOD_LINE = json.dumps(QUESTION) + "\n"
# json.loads raises ValueError (not JSONDecodeError) past Python's 4,300-digit integer limit.
BIG_NUMBER_LINE = '{"id": "q2", "question": "how many?", "answers": [' + "7" * 5000 + "]}\n"
# ... and RecursionError for nesting past its recursion limit.
DEEP_LINE = '{"id": "q2", "question": "what?", "answers": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
DEEP_YAML = "limit: " + "[" * 100_000 + "]" * 100_000 + "\n"
NOT_UTF8 = b"q1\n\xff\xfe\x80 not text\n"
BROKEN_YAML = "pipelines: [direct\n"


def failure(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error of a command that must fail with exit code 2."""
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    return error


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def eval_argv(tmp_path: Path, *flags: str, dataset: Path | None = None,
              out: Path | None = None) -> list[str]:
    dataset = dataset or write(tmp_path / "qa.jsonl", GOOD_LINE)
    return ["eval", "--pipelines", "direct", "--quiet", "--dataset", str(dataset),
            "--out", str(out or tmp_path / "run"), *flags]


def label_argv(tmp_path: Path, dataset: Path | None = None, out: Path | None = None
               ) -> list[str]:
    dataset = dataset or write(tmp_path / "qa.jsonl", GOOD_LINE)
    return ["label", "--scorer", "none", "--quiet", "--dataset", str(dataset),
            "--out", str(out or tmp_path / "labels")]


# A case makes its files under tmp_path and returns the command's argv.
Case = Callable[[Path], list[str]]


def trace_argv(tmp_path: Path) -> list[str]:
    return ["trace", str(tmp_path / "run"), "q1"]


def safetensors(header: str) -> bytes:
    """A safetensors file: its header's length, the header, then 4 bytes of tensor data."""
    return struct.pack("<Q", len(header)) + header.encode() + bytes(4)


ONE_TENSOR = safetensors('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')


def install_argv(config: str = "{}", weights: bytes = ONE_TENSOR,
                 card: str | bytes | None = None) -> Case:
    """`filter install` of an adapter folder holding these files."""
    def case(tmp_path: Path) -> list[str]:
        folder = tmp_path / "adapter"
        write(folder / "adapter_config.json", config)
        write(folder / "adapter_model.safetensors", weights)
        if card is not None:
            write(folder / "sieverag_adapter.json", card)
        return ["filter", "install", str(folder), "--name", "mine"]

    return case


def with_file(name: str, content: str | bytes, argv: Case) -> Case:
    """The case of `argv` run after writing `content` to tmp_path/`name`."""
    def case(tmp_path: Path) -> list[str]:
        write(tmp_path / name, content)
        return argv(tmp_path)

    return case


# Each case, and what its error must say (naming the file).
CASES: dict[str, tuple[Case, str]] = {
    "eval dataset, 5,000-digit integer": (
        lambda t: eval_argv(t, dataset=write(t / "big.jsonl", GOOD_LINE + BIG_NUMBER_LINE)),
        "big.jsonl, line 2: holds a number longer than"),
    "eval dataset, nested 100,000 deep": (
        lambda t: eval_argv(t, dataset=write(t / "deep.jsonl", GOOD_LINE + DEEP_LINE)),
        "deep.jsonl, line 2: is JSON nested too deeply"),
    "eval JSON document dataset, 5,000-digit integer": (
        lambda t: eval_argv(t, "--dataset-format", "squad",
                            dataset=write(t / "squad.json", '{"data": [' + "7" * 5000 + "]}")),
        "squad.json: holds a number longer than"),
    "eval --question-ids not UTF-8": (
        lambda t: eval_argv(t, "--question-ids", str(write(t / "ids.txt", NOT_UTF8))),
        "ids.txt, line 2: is not UTF-8 text"),
    "eval --config not UTF-8": (
        lambda t: eval_argv(t, "--config", str(write(t / "mine.yaml", NOT_UTF8))),
        "mine.yaml, line 2: is not UTF-8 text"),
    "eval --config nested 100,000 deep": (
        lambda t: eval_argv(t, "--config", str(write(t / "mine.yaml", DEEP_YAML))),
        "mine.yaml is nested too deeply"),
    "eval run folder's config.yaml not UTF-8": (
        with_file("run/config.yaml", NOT_UTF8, eval_argv),
        "config.yaml, line 2: is not UTF-8 text"),
    "eval run folder's config.yaml nested 100,000 deep": (
        with_file("run/config.yaml", DEEP_YAML, eval_argv),
        "config.yaml is nested too deeply"),
    "eval resumed results, 5,000-digit integer": (
        with_file("run/results/direct.jsonl", BIG_NUMBER_LINE + "\n", eval_argv),
        "direct.jsonl, line 1: holds a number longer than"),
    "eval --out is a file": (
        lambda t: eval_argv(t, out=write(t / "out.txt", "mine")),
        "out.txt is a file"),
    "eval --out is below a file": (
        lambda t: eval_argv(t, out=write(t / "out.txt", "mine") / "run"),
        "out.txt is a file"),
    "label dataset, 5,000-digit integer": (
        lambda t: label_argv(t, dataset=write(t / "big.jsonl", GOOD_LINE + BIG_NUMBER_LINE)),
        "big.jsonl, line 2: holds a number longer than"),
    "label dataset, nested 100,000 deep": (
        lambda t: label_argv(t, dataset=write(t / "deep.jsonl", GOOD_LINE + DEEP_LINE)),
        "deep.jsonl, line 2: is JSON nested too deeply"),
    "label --out is a file": (
        lambda t: label_argv(t, out=write(t / "out.txt", "mine")),
        "out.txt is a file"),
    "label label_config.json not JSON": (
        with_file("labels/label_config.json", "{half", label_argv),
        "label_config.json: not valid JSON"),
    "label label_config.json nested 100,000 deep": (
        with_file("labels/label_config.json", DEEP_LINE, label_argv),
        "label_config.json: is JSON nested too deeply"),
    "label label_config.json not an object": (
        with_file("labels/label_config.json", "[1, 2]", label_argv),
        "label_config.json: is not a JSON object"),
    "label resumed labels.jsonl, 5,000-digit integer": (
        with_file("labels/labels.jsonl", BIG_NUMBER_LINE, label_argv),
        "labels.jsonl, line 1: holds a number longer than"),
    "label resumed labels.jsonl not UTF-8": (
        with_file("labels/labels.jsonl", b'{"question_id": "\xff\xfe"}\n', label_argv),
        "labels.jsonl, line 1: is not UTF-8 text"),
    "build-dataset label folder's labels.jsonl nested 100,000 deep": (
        lambda t: ["build-dataset", "--quiet", "--out", str(t / "dataset"), "--labels",
                   str(write(t / "labels" / "labels.jsonl", DEEP_LINE).parent)],
        "labels.jsonl, line 1: is JSON nested too deeply"),
    "build-dataset --out is a file": (
        lambda t: ["build-dataset", "--quiet", "--labels", str(t / "labels"),
                   "--out", str(write(t / "out.txt", "mine"))],
        "out.txt is a file"),
    "eval-filter --out is a file": (
        lambda t: ["eval-filter", "--quiet", "--allow-training-questions",
                   "--dataset", str(write(t / "qa.jsonl", GOOD_LINE)),
                   "--out", str(write(t / "out.txt", "mine"))],
        "out.txt is a file"),
    "eval --config not YAML": (
        lambda t: eval_argv(t, "--config", str(write(t / "mine.yaml", BROKEN_YAML))),
        "mine.yaml, line 2, column 1: not valid YAML (expected ',' or ']', but got "
        "'<stream end>')"),
    "eval --config holding a control character": (
        lambda t: eval_argv(t, "--config", str(write(t / "mine.yaml", "quiet: true\nk: \x07\n"))),
        "mine.yaml, line 2, column 4: not valid YAML (unacceptable character #x0007"),
    "trace results not UTF-8": (
        with_file("run/results/amber.jsonl", b'{"id": "\xff\xfe"}\n', trace_argv),
        "amber.jsonl, line 1: is not UTF-8 text"),
    "trace results, 5,000-digit integer": (
        with_file("run/results/amber.jsonl", BIG_NUMBER_LINE, trace_argv),
        "amber.jsonl, line 1: holds a number longer than"),
    "trace results, nested 100,000 deep": (
        with_file("run/results/amber.jsonl", DEEP_LINE, trace_argv),
        "amber.jsonl, line 1: is JSON nested too deeply"),
    "filter install adapter_config.json, 5,000-digit integer": (
        install_argv(config='{"r": ' + "7" * 5000 + "}"),
        "adapter_config.json: holds a number longer than"),
    "filter install adapter_config.json nested 100,000 deep": (
        install_argv(config=DEEP_LINE), "adapter_config.json: is JSON nested too deeply"),
    "filter install card not UTF-8": (
        install_argv(card='{"name": "\xff"}'.encode("latin-1")),
        "sieverag_adapter.json, line 1: is not UTF-8 text"),
    "filter install card nested 100,000 deep": (
        install_argv(card=DEEP_LINE), "sieverag_adapter.json: is JSON nested too deeply"),
    "filter install safetensors header nested 100,000 deep": (
        install_argv(weights=safetensors("[" * 100_000 + "]" * 100_000)),
        "adapter_model.safetensors is not a readable safetensors file"),
}


@pytest.mark.parametrize(("case", "named"), CASES.values(), ids=CASES.keys())
def test_a_bad_input_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 case: Case, named: str) -> None:
    error = failure(capsys, case(tmp_path))
    assert error.startswith("sieverag: error: ")
    assert named in error


def test_eval_filter_names_a_question_ids_file_that_is_not_utf8(tmp_path: Path) -> None:
    """Read directly: the command resolves (and may convert) the filter's model first."""
    from sieverag.inference.core.errors import DatasetError
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
    from sieverag.training.evaluation.held_out_questions import TrainingQuestions, select_examples

    config = FilterEvalConfig(dataset=str(write(tmp_path / "qa.jsonl", GOOD_LINE)),
                              out=str(tmp_path / "report"),
                              question_ids_file=str(write(tmp_path / "ids.txt", NOT_UTF8)))
    with pytest.raises(DatasetError, match=r"ids\.txt, line 2: is not UTF-8 text"):
        select_examples(config, TrainingQuestions(frozenset(), ()))


def test_a_file_named_as_out_is_left_as_it_was(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """build-dataset replaces an output folder; a file given as --out is refused, not moved."""
    out = write(tmp_path / "notes.txt", "mine")
    failure(capsys, ["build-dataset", "--quiet", "--labels", str(tmp_path / "labels"),
                     "--out", str(out)])
    assert out.read_text(encoding="utf-8") == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
