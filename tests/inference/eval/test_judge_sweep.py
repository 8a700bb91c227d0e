"""`sieverag judge-sweep` with a scripted backend: with the run's own n it keeps exactly the
run's documents in the run's order, other n move the bar as τq = mean(r) − n·σ(r) says, only
the generator is asked, it resumes, and bad input is one clear error."""

from __future__ import annotations

import json
import math
import zlib

import pytest
from fake_backend import ScriptedBackend, serve_every_role

from sieverag.cli import main
from sieverag.inference.cli.run import JudgeSweepCommand
from sieverag.inference.composition.config import RunConfig, TrustConfig
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.eval.judge_sweep import sweep_judge_bar, sweep_table
from sieverag.inference.filters.judge import JudgeConfig, judge_bar


def scripted() -> ScriptedBackend:
    """Answers "Mara Quill"; judge scores differ per document (a checksum of the prompt)."""
    return ScriptedBackend(reply=lambda text: "Mara Quill", labels=lambda text: {
        "Yes": -(zlib.crc32(text.encode()) % 100) / 10, "No": -5.0})


@pytest.fixture
def backend(monkeypatch) -> ScriptedBackend:
    """Every role of a run or a sweep is one scripted backend (no model loads)."""
    scripted_backend = scripted()
    serve_every_role(monkeypatch, scripted_backend)
    return scripted_backend


def run_main_rag(tmp_path, judge: JudgeConfig, pipelines=("main-rag",)):
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    out = tmp_path / "run"
    runner.run_evaluation(RunConfig(dataset=str(dataset), pipelines=pipelines, limit=4,
                                    judge=judge, trust=TrustConfig(enabled=False)),
                          out, progress=False)
    return out


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


@pytest.mark.parametrize("order", ["descending", "ascending", "random"])
def test_the_runs_own_n_reproduces_its_kept_documents_exactly(tmp_path, backend, order):
    run = run_main_rag(tmp_path, JudgeConfig(bar_n=0.5, order=order))
    backend.calls.clear()
    sweep = sweep_judge_bar(run, [0.5, 0.0, 1.5, -1.0], progress=False)
    # The judge is not asked again: Agent-3 alone, once per question and n.
    assert [agent for agent, _ in backend.calls] == ["generator"] * 16
    original = lines(run / "results" / "main-rag.jsonl")
    swept = {n: lines(run / "judge-sweep-main-rag" / "results" / f"n={n}.jsonl")
             for n in ("0.5", "0", "1.5", "-1")}
    for before, again in zip(original, swept["0.5"], strict=True):
        assert again["id"] == before["id"]
        assert again["documents_read"] == before["documents_read"]  # same set, same order
        assert again["filter"] == before["filter"]
        assert again["prediction"] == before["prediction"]
    # Other n: the bar over the stored scores, and what it keeps.
    for n, records in (("0", swept["0"]), ("1.5", swept["1.5"]), ("-1", swept["-1"])):
        for before, again in zip(original, records, strict=True):
            scores = [s["score"] for s in before["filter"]["scores"]]
            bar = judge_bar(scores, float(n))
            assert again["filter"]["threshold"] == bar
            kept = {s["id"] for s in before["filter"]["scores"] if s["score"] >= bar}
            assert set(again["documents_read"]) == kept
            assert set(again["usage"]) == {"generator"}
    bars = sweep["bars"]
    assert list(bars) == ["n=0.5", "n=0", "n=1.5", "n=-1"]
    kept = [bars[label]["documents_read_per_question"] for label in ("n=-1", "n=0", "n=1.5")]
    assert kept == sorted(kept) and kept[0] < kept[-1]  # a larger n lowers the bar
    assert bars["n=0.5"]["em"] == json.loads((run / "summary.json").read_text())[
        "pipelines"]["main-rag"]["em"]
    saved = json.loads((run / "judge-sweep-main-rag" / "summary.json").read_text())
    assert saved["bars"] == bars and saved["run_bar_n"] == 0.5 and saved["judge_order"] == order
    table = sweep_table(sweep)
    assert "| n=0.5 (the run's) | 4 |" in table and "Kept docs" in table and "Read R" in table


def test_cli_prints_one_table_and_resumes(tmp_path, backend, capsys):
    run = run_main_rag(tmp_path, JudgeConfig())
    out = tmp_path / "sweep"
    args = ["judge-sweep", "--run", str(run), "--bar-n", "0,1", "--out", str(out), "--quiet"]
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert "| n=0 (the run's) | 4 |" in shown and "| n=1 | 4 |" in shown
    assert sorted(p.name for p in (out / "results").iterdir()) == ["n=0.jsonl", "n=1.jsonl"]
    # Rerunning resumes: nothing is answered again, one more n adds its own file.
    backend.calls.clear()
    assert main([*args[:3], "--bar-n", "0,1,2", *args[5:]]) == 0
    assert len(backend.calls) == 4 and len(lines(out / "results" / "n=1.jsonl")) == 4


@pytest.mark.parametrize(("args", "message"), [
    (["--run", "{tmp}/nowhere", "--bar-n", "0"], "--run {tmp}/nowhere: no such folder"),
    (["--run", "{run}", "--bar-n", "0", "--pipeline", "vanilla"],
     "--pipeline vanilla: its records hold no judge scores"),
    (["--run", "{run}", "--bar-n", "0", "--pipeline", "main-rag-naive"],
     "--pipeline main-rag-naive: its records hold no judge scores"),
    (["--run", "{run}", "--bar-n", "0,abc"], "bar_n.1:"),
    (["--run", "{run}", "--bar-n", "0,nan"], 'value for field "bar_n"'),
])
def test_bad_input_is_one_clear_error(tmp_path, backend, capsys, args, message):
    run = run_main_rag(tmp_path, JudgeConfig(), pipelines=("vanilla", "main-rag-naive"))
    places = {"tmp": tmp_path, "run": run}
    code = main(["judge-sweep", *(a.format(**places) for a in args)])
    err = capsys.readouterr().err
    assert code == 2 and message.format(**places) in err and len(err.strip().splitlines()) == 1


def test_a_run_without_main_rag_results_is_named(tmp_path, backend, capsys):
    run = run_main_rag(tmp_path, JudgeConfig(), pipelines=("vanilla",))
    assert main(["judge-sweep", "--run", str(run), "--bar-n", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{run}/results/main-rag.jsonl not found" in err and "(it has: vanilla)" in err
    assert not (run / "judge-sweep-main-rag").exists()


def test_a_folder_holding_another_runs_sweep_is_refused(tmp_path, backend, capsys):
    first = run_main_rag(tmp_path / "a", JudgeConfig())
    second = run_main_rag(tmp_path / "b", JudgeConfig())
    out = tmp_path / "sweep"
    assert main(["judge-sweep", "--run", str(first), "--bar-n", "0", "--out", str(out)]) == 0
    assert main(["judge-sweep", "--run", str(second), "--bar-n", "0", "--out", str(out)]) == 2
    assert "holds a sweep of another run" in capsys.readouterr().err


def test_n_values_must_be_finite_and_given():
    with pytest.raises(ConfigError, match="--bar-n: every value must be a finite number"):
        JudgeSweepCommand(run="r", bar_n=(0.0, math.inf))
    with pytest.raises(ConfigError, match="--bar-n: give at least one value"):
        JudgeSweepCommand(run="r", bar_n=())


def test_another_reading_order_from_the_same_scores(tmp_path, backend, capsys):
    """The ordering ablation without a judge pass: the run's kept sets, read ascending."""
    run = run_main_rag(tmp_path, JudgeConfig(bar_n=0.0, order="descending"))
    backend.calls.clear()
    assert main(["judge-sweep", "--run", str(run), "--bar-n", "0", "--order", "ascending",
                 "--quiet"]) == 0
    assert [agent for agent, _ in backend.calls] == ["generator"] * 4
    folder = run / "judge-sweep-main-rag-ascending"
    for before, again in zip(lines(run / "results" / "main-rag.jsonl"),
                             lines(folder / "results" / "n=0.jsonl"), strict=True):
        kept = [s for s in before["filter"]["scores"] if s["kept"]]  # retrieved order
        assert again["documents_read"] == [s["id"] for s in sorted(kept, key=lambda s: s["score"])]
        assert set(again["documents_read"]) == set(before["documents_read"])
    assert json.loads((folder / "summary.json").read_text())["judge_order"] == "ascending"
    assert "judge-sweep-main-rag-ascending" in capsys.readouterr().out
