"""The evaluation runner and the `sieverag eval` CLI on a tiny model: files, resume, errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from sieverag.cli import main
from sieverag.inference.composition.compose import plan_run
from sieverag.inference.composition.config import ModelRoles, RunConfig
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.filters.judge import JudgeConfig
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.backend_registry import BackendSpec


@pytest.fixture
def demo_file(tmp_path):
    return write_demo_dataset(tmp_path / "demo.jsonl")


def tiny_config(dataset, model_dir, **changes) -> RunConfig:
    values = {"dataset": str(dataset), "pipelines": ("direct", "vanilla", "main-rag"),
              "limit": 4,
              "models": ModelRoles(generator=BackendSpec(model=str(model_dir), batch_size=4)),
              # The random tiny model never stops early: short replies keep the tests quick.
              "generation": GenerationSettings(max_new_tokens=4),
              "judge": JudgeConfig(predictor_max_new_tokens=4)}
    values.update(changes)
    return RunConfig(**values)


def test_run_writes_config_results_summary_and_report(tmp_path, demo_file, tiny_model_dir):
    out = tmp_path / "run"
    summaries = runner.run_evaluation(tiny_config(demo_file, tiny_model_dir), out, progress=False)
    assert set(summaries) == {"direct", "vanilla", "main-rag"}
    for name in summaries:
        records = [json.loads(line) for line in (out / "results" / f"{name}.jsonl").open()]
        assert [r["id"] for r in records] == [f"demo-0-{i}" for i in range(4)]
    direct, vanilla, main_rag = (summaries[n] for n in ("direct", "vanilla", "main-rag"))
    assert direct["llm_calls_per_question"] == 1 and direct["documents_read_per_question"] == 0
    assert vanilla["documents_read_per_question"] == 5 and vanilla["read_recall"] == 1.0
    assert vanilla["read_all_gold"] == 1.0
    # main-rag: 5 predictor + 5 judge + 1 final call per question.
    assert main_rag["llm_calls_per_question"] == 11
    record = json.loads((out / "results" / "main-rag.jsonl").open().readline())
    assert len(record["filter"]["scores"]) == 5 and record["filter"]["threshold"] is not None
    assert {"em", "f1", "accuracy"} <= set(record["metrics"])
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["provenance"]["dataset_sha256"] and saved["provenance"]["prompt_sha256"]
    assert json.loads((out / "summary.json").read_text())["pipelines"]["vanilla"]["examples"] == 4
    report = (out / "report.md").read_text()
    assert "| main-rag | 4 |" in report and "judge_scores_main-rag.png" in report
    assert (out / "judge_scores_main-rag.png").stat().st_size > 0
    page = (out / "report.html").read_text()  # every question, its data embedded
    assert all(f'"id":"demo-0-{i}"' in page for i in range(4))


def test_interrupted_run_resumes_without_redoing_finished_examples(
        tmp_path, demo_file, tiny_model_dir, monkeypatch):
    out = tmp_path / "run"
    config = tiny_config(demo_file, tiny_model_dir, pipelines=("vanilla",))
    real_build_record = runner.build_record
    calls = {"n": 0}

    def dies_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_build_record(*args, **kwargs)

    monkeypatch.setattr(runner, "build_record", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        runner.run_evaluation(config, out, progress=False)
    results = out / "results" / "vanilla.jsonl"
    first_two = results.read_text()
    assert len(first_two.splitlines()) == 2

    monkeypatch.setattr(runner, "build_record", real_build_record)
    seen = []
    monkeypatch.setattr(runner, "build_record",
                        lambda example, *a, **k: seen.append(example.id) or
                        real_build_record(example, *a, **k))
    runner.run_evaluation(config, out, progress=False)
    assert seen == ["demo-0-2", "demo-0-3"]
    assert results.read_text().startswith(first_two)
    assert len(results.read_text().splitlines()) == 4


def test_a_different_config_is_refused_in_the_same_folder(tmp_path, demo_file, tiny_model_dir):
    out = tmp_path / "run"
    runner.run_evaluation(tiny_config(demo_file, tiny_model_dir, pipelines=("direct",), limit=1),
                          out, progress=False)
    with pytest.raises(ConfigError, match="different configuration"):
        runner.run_evaluation(
            tiny_config(demo_file, tiny_model_dir, pipelines=("direct",), limit=2), out,
            progress=False)


def test_cli_eval_and_repeat_from_config(tmp_path, demo_file, tiny_model_dir, capsys):
    out = tmp_path / "cli-run"
    code = main(["eval", "--pipelines", "direct,vanilla", "--dataset", str(demo_file),
                 "--limit", "2", "--models.generator.model", str(tiny_model_dir),
                 "--out", str(out), "--quiet", "--generation.max-new-tokens", "4"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| direct | 2 |" in printed and "| vanilla | 2 |" in printed
    again = tmp_path / "again"
    assert main(["eval", "--config", str(out / "config.yaml"), "--out", str(again),
                 "--quiet"]) == 0
    first = json.loads((out / "summary.json").read_text())["pipelines"]
    second = json.loads((again / "summary.json").read_text())["pipelines"]
    assert [first[p]["f1"] for p in first] == [second[p]["f1"] for p in second]


def test_cli_flags_override_a_config_file(tmp_path, demo_file, tiny_model_dir):
    """`--config RUN/config.yaml --limit 1 --amber.k 3` reruns with limit 1 and k 3: flags
    override the file, nested ones too, and the rest of the file is kept."""
    out = tmp_path / "first"
    assert main(["eval", "--pipelines", "direct", "--dataset", str(demo_file), "--limit", "2",
                 "--models.generator.model", str(tiny_model_dir), "--out", str(out),
                 "--quiet", "--generation.max-new-tokens", "3"]) == 0
    rerun = tmp_path / "rerun"
    assert main(["eval", "--config", str(out / "config.yaml"), "--limit", "1",
                 "--amber.k", "3", "--out", str(rerun), "--quiet"]) == 0
    saved = yaml.safe_load((rerun / "config.yaml").read_text())
    assert saved["limit"] == 1 and saved["amber"]["k"] == 3
    assert saved["generation"]["max_new_tokens"] == 3 and saved["pipelines"] == ["direct"]
    assert len((rerun / "results" / "direct.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(("make_args", "message"), [
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(t / "missing.jsonl")],
     "no such dataset file"),
    (lambda d, m, t: ["--pipelines", "nonsense", "--dataset", str(d)], "unknown pipeline"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d),
                      "--models.generator.model", "no-such-model"],
     "unknown model 'no-such-model'"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d), "--models.filter.endpoint",
                      "http://127.0.0.1:9/v1", "--models.filter.adapter", "x"],
     "needs its name there"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d), "--models.filter.endpoint",
                      "http://127.0.0.1:9/v1", "--models.filter.model", "f",
                      "--models.filter.adapter", "x"],
     "adapter 'x' is for an in-process model"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d), "--limit", "two"],
     "limit: Input should be a valid integer"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d), "--amber.answer-from",
                      "notes"], "amber.answer_from: Input should be"),
    (lambda d, m, t: ["--pipelines", "vanilla", "--dataset", str(d), "--amber.k", "many"],
     "amber.k: Input should be a valid integer"),
])
def test_cli_bad_input_is_one_clear_error(tmp_path, demo_file, tiny_model_dir, capsys,
                                          make_args, message):
    args = make_args(demo_file, tiny_model_dir, tmp_path)
    code = main(["eval", *args, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_cli_malformed_line_names_the_line_and_keeps_finished_results(
        tmp_path, demo_file, tiny_model_dir, capsys):
    out = tmp_path / "o"
    assert main(["eval", "--pipelines", "direct", "--dataset", str(demo_file), "--limit", "1",
                 "--models.generator.model", str(tiny_model_dir), "--out", str(out),
                 "--quiet"]) == 0
    kept = (out / "results" / "direct.jsonl").read_text()
    demo_file.write_text(demo_file.read_text() + "{not json\n")
    code = main(["eval", "--pipelines", "direct", "--dataset", str(demo_file),
                 "--models.generator.model", str(tiny_model_dir), "--out", str(tmp_path / "o2"),
                 "--quiet"])
    assert code == 2 and "line 37" in capsys.readouterr().err
    assert (out / "results" / "direct.jsonl").read_text() == kept


def test_cli_server_down_is_one_clear_error(tmp_path, demo_file, capsys):
    code = main(["eval", "--pipelines", "direct", "--dataset", str(demo_file), "--limit", "1",
                 "--models.generator.endpoint", "http://127.0.0.1:9/v1",
                 "--models.generator.model", "m", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "127.0.0.1:9" in err and "Traceback" not in err


def test_a_served_filter_without_a_card_fails_before_the_run_writes_anything(
        tmp_path, demo_file, tiny_model_dir, capsys, monkeypatch):
    """No card named, none shown by its server, no filter of its served name: one clear
    message naming both remedies, before config.yaml is written, so the command it gives
    runs in the same folder."""
    monkeypatch.setattr("sieverag.inference.filters.role_card.served_card",
                        lambda spec: None)
    out = tmp_path / "o"
    args = ["eval", "--pipelines", "amber-mcf", "--dataset", str(demo_file), "--limit", "1",
            "--models.generator.model", str(tiny_model_dir),
            "--models.filter.endpoint", "http://127.0.0.1:9/v1", "--models.filter.model",
            "filter", "--out", str(out), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "as 'filter' has no filter card" in err and "Traceback" not in err
    assert "--models.filter-card NAME_OR_FOLDER" in err
    assert "--models.filter-card retrieval-only" in err
    assert not (out / "config.yaml").exists()
    # Asked for by name, the run goes on in that folder: BM25 + dense rank, so no chunk is
    # sent to the filter (down here), and the run says so at start.
    assert main([*args, "--models.filter-card", "retrieval-only"]) == 0
    err = capsys.readouterr().err
    assert "no chunk is sent to the filter" in err and "different configuration" not in err
    assert (out / "results" / "amber-mcf.jsonl").exists()
    assert yaml.safe_load((out / "config.yaml").read_text())["models"]["filter_card"] == (
        "retrieval-only")

def test_question_ids_select_examples_in_dataset_order_before_the_limit(tmp_path, demo_file,
                                                                        tiny_model_dir):
    ids = tmp_path / "held_out.txt"
    ids.write_text("demo-5-0\n\ndemo-2-0\ndemo-3-1\n", encoding="utf-8")
    config = tiny_config(demo_file, tiny_model_dir, question_ids=str(ids), limit=2)
    assert [e.id for e in runner.selected_examples(plan_run(config))] == ["demo-2-0", "demo-3-1"]
    out = tmp_path / "run"
    runner.run_evaluation(replace(config, pipelines=("direct",)), out, progress=False)
    records = [json.loads(line) for line in (out / "results" / "direct.jsonl").open()]
    assert [r["id"] for r in records] == ["demo-2-0", "demo-3-1"]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["question_ids"] == str(ids) and saved["provenance"]["question_ids_sha256"]

    ids.write_text("demo-2-0\nnot-a-question\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="not-a-question"):
        runner.selected_examples(plan_run(config))
    with pytest.raises(DatasetError, match="not found"):
        runner.selected_examples(plan_run(replace(config,
                                                  question_ids=str(tmp_path / "gone.txt"))))


def test_unknown_config_keys_and_flags_are_refused_by_name(tmp_path, demo_file, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(f"dataset: {demo_file}\namber: {{k: 3, rounds: 2}}\n", encoding="utf-8")
    assert main(["eval", "--config", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "amber.rounds: unknown setting" in err and str(config) in err
    with pytest.raises(SystemExit):
        main(["eval", "--dataset", str(demo_file), "--amber.rounds", "2"])
    assert "unrecognized arguments: --amber.rounds" in capsys.readouterr().err


def test_a_preset_supplies_defaults_that_flags_override():
    from sieverag.inference.cli.run import EvalCommand
    from sieverag.inference.core.settings import parse_settings

    command = parse_settings(EvalCommand, ["--preset", "amber-smollm2", "--dataset", "d.jsonl",
                                           "--amber.k", "4"], "sieverag eval")
    assert command.amber.k == 4 and command.amber.answer_from == "evidence"
    assert command.models.filter.adapter == "smollm2-filter" and command.mcf.top_k == 2
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        parse_settings(EvalCommand, ["--preset", "nope"], "sieverag eval")
    # The open-retrieval preset: one index, the same 6-document reading budget for all.
    command = parse_settings(EvalCommand, ["--preset", "amber-open", "--dataset", "d.jsonl",
                                           "--retrieval.index", "idx"], "sieverag eval")
    assert command.retrieval.index == "idx" and command.retrieval.k == 6
    assert command.amber.k * command.amber.max_iterations == 6
    assert command.iter_retgen.k * command.iter_retgen.iterations == 6
    assert {"vanilla", "iter-retgen", "amber-no-amu", "amber-no-aic"} <= set(command.pipelines)
    # The papers' protocols: MAIN-RAG reads 20 documents under the mean bar, beside the
    # paper's naive multi-agent row (generated verdicts, no bar); Amber runs the
    # filter at both granularities, the agents, the written query, and answers from memory.
    command = parse_settings(EvalCommand, ["--preset", "main-rag-paper", "--dataset", "d.jsonl"],
                             "sieverag eval")
    assert command.max_documents == 20 and command.judge.bar_n == 0.0
    assert command.pipelines == ("direct", "vanilla", "main-rag-naive", "main-rag")
    command = parse_settings(EvalCommand, ["--preset", "amber-paper", "--dataset", "d.jsonl"],
                             "sieverag eval")
    assert command.mcf.sentence_stage and command.amber.answer_from == "memory"
    assert command.amber.collector.query_source == "write" and command.amber.amu
    assert {"amber-paper", "amber-no-amu", "amber-no-aic", "amber-none"} <= set(command.pipelines)
    # The Auto-RAG study: LLM-only, always-RAG and auto over hybrid retrieval; the ablation's
    # cells are flags on top.
    command = parse_settings(EvalCommand, [
        "--preset", "auto-rag-paper", "--dataset", "d.jsonl", "--retrieval.index", "idx",
        "--retrieval.hygiene", "strict", "--retrieval.search.alpha", "0.7"], "sieverag eval")
    assert command.pipelines == ("direct", "vanilla", "auto")
    assert (command.retrieval.mode, command.retrieval.k, command.retrieval.hygiene,
            command.retrieval.search.alpha) == ("hybrid", 5, "strict", 0.7)
    assert command.router.rule == "knowledge" and command.trust.enabled


def test_trust_metrics_follow_the_study_through_a_run(tmp_path, tiny_model_dir):
    """Annotated questions (reference, keywords, kind): grounding is null without retrieval,
    TAAS is AQS there; the summary has the per-kind table and every grader criterion, and says
    the generator graded itself."""
    dataset = tmp_path / "annotated.jsonl"
    rows = [{"id": f"q{i}", "question": f"Which vitamin prevents disease {i}?",
             "answers": ["vitamin C"], "reference": "Vitamin C prevents it.",
             "keywords": ["vitamin c"], "kind": kind,
             "ctxs": [{"text": "Vitamin C prevents scurvy. Sailors ate limes.", "title": "C"}]}
            for i, kind in enumerate(("factual", "factual", "conceptual"))]
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    config = tiny_config(dataset, tiny_model_dir, pipelines=("direct", "vanilla"), limit=None)
    config = replace(config, trust=replace(config.trust, llm_grader=True))
    summaries = runner.run_evaluation(config, out, progress=False)
    direct = [json.loads(line) for line in (out / "results" / "direct.jsonl").open()]
    vanilla = [json.loads(line) for line in (out / "results" / "vanilla.jsonl").open()]
    assert [r["kind"] for r in direct] == ["factual", "factual", "conceptual"]
    assert direct[0]["reference"] == "Vitamin C prevents it."
    for record in direct:
        trust = record["trust"]
        assert trust["retrieved"] is False and trust["taas"] == trust["answer_quality"]
        assert trust["sentence_taas"] == trust["answer_quality"]
        assert trust["faithfulness"] is None and trust["hallucination_rate"] is None
        assert trust["llm_grader"]["evidence_grounding"] is None
    for record in vanilla:
        trust = record["trust"]
        assert trust["retrieved"] is True
        assert 0.0 <= trust["faithfulness"] <= 1.0
        # the study's TAAS: 0.4·AQS + 0.3·faithfulness + 0.3·(1 − hallucination rate)
        assert trust["taas"] == pytest.approx(0.4 * trust["answer_quality"]
                                              + 0.3 * trust["faithfulness"]
                                              + 0.3 * (1 - trust["hallucination_rate"]))
        assert trust["evidence_noise"] == pytest.approx(1 - trust["context_precision"])
        assert record["contexts"] == ["C\nVitamin C prevents scurvy. Sailors ate limes."]
    assert summaries["direct"]["faithfulness"] is None
    assert summaries["direct"]["trust_counts"]["faithfulness"] == 0
    assert summaries["vanilla"]["trust_counts"]["faithfulness"] == 3
    assert summaries["vanilla"]["trust_counts"]["sentence_taas"] == 3
    assert summaries["direct"]["retrieval_usage_rate"] == 0.0
    assert set(summaries["vanilla"]["by_kind"]) == {"factual", "conceptual"}
    # the random tiny model writes no verdict: every reply counted invalid, none guessed
    assert summaries["vanilla"]["grader_invalid"] == 3
    assert summaries["vanilla"]["grader_overall"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grader"] == {"model": str(tiny_model_dir), "self_graded": True}
    report = (out / "report.md").read_text()
    assert "## By question kind" in report and "### conceptual" in report
    assert "direct: 0 of 3; vanilla: 3 of 3" in report
    assert "LLM grader (1-5; ↓ lower is better)" in report and "LLM judge" not in report
