"""`sieverag export`: a run folder's records as RAGAS-style jsonl rows (user_input,
retrieved_contexts, response, reference, pipeline, id), and the errors a user can cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend, serve_every_role

from sieverag.cli import main
from sieverag.inference.composition.config import RunConfig, TrustConfig
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.eval.export import export_row
from sieverag.inference.eval.result_records import build_record
from sieverag.inference.llm.backend_protocol import Usage
from sieverag.inference.pipelines.pipeline_registry import PipelineOutput


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished `direct,vanilla` run of 3 demo questions, answered by a scripted backend."""
    backend = ScriptedBackend(reply=lambda text: "Mara Quill")
    tmp = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as patch:
        serve_every_role(patch, backend)
        dataset = write_demo_dataset(tmp / "demo.jsonl")
        runner.run_evaluation(RunConfig(dataset=str(dataset), pipelines=("direct", "vanilla"),
                                        limit=3, trust=TrustConfig(enabled=False)),
                              tmp / "run", progress=False)
    return tmp / "run"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def failure(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error of a command that must fail with exit code 2."""
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    return error


def test_export_writes_a_ragas_row_per_pipeline_and_question(
        tmp_path: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ragas.jsonl"
    assert main(["export", "--run", str(run_dir), "--out", str(out)]) == 0
    assert "wrote 6 rows" in capsys.readouterr().out
    rows = lines(out)
    records = {name: lines(run_dir / "results" / f"{name}.jsonl")
               for name in ("direct", "vanilla")}
    assert [(r["pipeline"], r["id"]) for r in rows] == [
        (name, record["id"]) for name in ("direct", "vanilla") for record in records[name]]
    for row in rows:
        assert list(row) == ["user_input", "retrieved_contexts", "response", "reference",
                             "pipeline", "id"]
        record = next(r for r in records[row["pipeline"]] if r["id"] == row["id"])
        assert row["user_input"] == record["question"]
        assert row["response"] == record["prediction"] == "Mara Quill"
        assert row["reference"] == record["answers"][0]
        assert row["retrieved_contexts"] == record["contexts"]
        assert len(row["retrieved_contexts"]) == len(record["documents_read"])
    vanilla = [r for r in rows if r["pipeline"] == "vanilla"]
    assert all(r["retrieved_contexts"] and all(c.strip() for c in r["retrieved_contexts"])
               for r in vanilla)
    assert all(r["retrieved_contexts"] == [] for r in rows if r["pipeline"] == "direct")
    # --pipelines picks, in the order given.
    assert main(["export", "--run", str(run_dir), "--out", str(out),
                 "--pipelines", "vanilla"]) == 0
    assert {r["pipeline"] for r in lines(out)} == {"vanilla"}


def test_the_dataset_s_reference_answer_wins_over_the_first_alias() -> None:
    example = Example(id="q", question="Who?", answers=("Mara", "Mara Quill"),
                      metadata={"reference": "Mara Quill opened it in 1901."})
    document = Document(id="d", title="Bridge", text="Mara Quill opened it.")
    output = PipelineOutput(answer="Mara", raw_answer="Mara.", documents_read=(document,))
    record = build_record(example, output, {"generator": Usage(1, 5, 1)}, 0.1)
    assert export_row("vanilla", record) == {
        "user_input": "Who?", "retrieved_contexts": ["Bridge\nMara Quill opened it."],
        "response": "Mara", "reference": "Mara Quill opened it in 1901.", "pipeline": "vanilla",
        "id": "q"}
    plain = build_record(Example(id="q", question="Who?", answers=("Mara",)), output, {}, 0.1)
    assert export_row("vanilla", plain)["reference"] == "Mara"


def strip_contexts(results: Path) -> None:
    """Rewrite a results file as an older sieverag wrote it: no `contexts` key."""
    rows = lines(results)
    for row in rows:
        row.pop("contexts")
    results.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_an_old_record_without_contexts_is_refused_unless_it_read_nothing(
        tmp_path: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_run = tmp_path / "old-run"
    (old_run / "results").mkdir(parents=True)
    for name in ("direct", "vanilla"):
        (old_run / "results" / f"{name}.jsonl").write_bytes(
            (run_dir / "results" / f"{name}.jsonl").read_bytes())
        strip_contexts(old_run / "results" / f"{name}.jsonl")
    out = tmp_path / "ragas.jsonl"
    error = failure(capsys, ["export", "--run", str(old_run), "--out", str(out)])
    assert "vanilla.jsonl" in error and str(old_run) in error and "re-run" in error
    assert not out.exists()  # nothing half-written
    # `direct` read nothing: an empty list is the truth, not a guess.
    assert main(["export", "--run", str(old_run), "--out", str(out),
                 "--pipelines", "direct"]) == 0
    assert [r["retrieved_contexts"] for r in lines(out)] == [[], [], []]


def test_bad_input_is_one_clear_error(tmp_path: Path, run_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a folder" in failure(capsys, ["export", "--run", str(run_dir),
                                             "--out", str(tmp_path)])
    assert "has no results for amber" in failure(capsys, [
        "export", "--run", str(run_dir), "--out", str(tmp_path / "x.jsonl"),
        "--pipelines", "vanilla,amber"])
    assert "not found" in failure(capsys, ["export", "--run", str(tmp_path / "nowhere"),
                                           "--out", str(tmp_path / "x.jsonl")])
    assert "holds no results" in failure(capsys, ["export", "--run", str(tmp_path),
                                                  "--out", str(tmp_path / "x.jsonl")])
    (tmp_path / "file").write_text("")
    assert "cannot write" in failure(capsys, ["export", "--run", str(run_dir),
                                              "--out", str(tmp_path / "file" / "x.jsonl")])
    broken = tmp_path / "broken"
    (broken / "results").mkdir(parents=True)
    (broken / "results" / "vanilla.jsonl").write_text('{"id": "q1"}\n{"id": "q2"}\n')
    assert "line 1" in failure(capsys, ["export", "--run", str(broken),
                                        "--out", str(tmp_path / "x.jsonl")])
    assert not (tmp_path / "x.jsonl").exists()
