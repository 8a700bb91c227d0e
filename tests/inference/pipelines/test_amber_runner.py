"""`amber` through the runner and the CLI on the tiny model with a random LoRA adapter:
records carry the trace, the adapter is resolved into config.yaml, `sieverag trace` and
`sieverag ask` print it, and a missing trained filter is a clear error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.cli import main
from sieverag.inference.composition import compose
from sieverag.inference.composition.config import ModelRoles, RunConfig, TrustConfig
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.filters import adapter_store
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, install_adapter
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.pipelines.amber.config import AmberConfig
from sieverag.inference.pipelines.amber.loop_trace import STOP_REASONS
from sieverag.inference.pipelines.amber.memory import MemoryConfig
from sieverag.inference.pipelines.auto import AutoConfig
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index_folder import build_index

SHORT = AmberConfig(max_iterations=2, k=5, answer_from="memory_and_evidence",
                    memory=MemoryConfig(review_max_new_tokens=8, refine_max_new_tokens=16))


def tiny_roles(model_dir, batch_size: int = 16, adapter: str | None = None) -> ModelRoles:
    """Every role on the tiny model (the tiny adapter's base), the filter with `adapter`."""
    spec = BackendSpec(model=str(model_dir), batch_size=batch_size)
    return ModelRoles(generator=spec, filter=replace(spec, adapter=adapter))


def test_eval_runs_amber_variants_and_trace_renders_a_saved_question(
        tmp_path, tiny_model_dir, adapter_dir, monkeypatch, capsys):
    # A filter installed under the default name wins over the shipped one.
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    installed = install_adapter(adapter_dir, DEFAULT_FILTER_NAME)
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    config = RunConfig(dataset=str(dataset), pipelines=("amber-mcf", "amber-judge"), limit=2,
                       models=tiny_roles(tiny_model_dir, batch_size=8),
                       amber=SHORT, trust=TrustConfig(enabled=False))
    out = tmp_path / "run"
    summaries = runner.run_evaluation(config, out, progress=False)
    # The run says first what MCF ranks by: the tiny adapter has no card, so retrieval.
    assert (f"MCF ranks by BM25 + dense alone, z(BM25) + z(dense) uncalibrated, the filter's "
            f"score unused: the filter adapter {installed} has no sieverag_adapter.json"
            in capsys.readouterr().err)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    # The default filter, made explicit.
    assert saved["models"]["filter"]["adapter"] == str(installed)
    assert saved["amber"]["max_iterations"] == 2
    record = json.loads((out / "results" / "amber-mcf.jsonl").open().readline())
    trace = record["trace"]
    assert trace["pipeline"] == "amber-mcf" and trace["filter"] == "mcf"
    assert trace["stop_reason"] in STOP_REASONS
    assert trace["rounds"][0]["query"] == record["question"]
    # BM25 + dense rank (no card), so no chunk is sent to the filter.
    assert "filter_chunk" not in record["usage"]
    assert all(s["filter_score"] is None for s in trace["rounds"][0]["scored"])
    assert record["usage"]["generator"]["calls"] == 1
    assert record["generator_input_tokens"] == record["usage"]["generator"]["prompt_tokens"]
    assert record["documents_read"] == [e["id"] for e in trace["evidence"]]
    assert "predictor" in summaries["amber-judge"]["usage_per_question"]
    # Each agent's seconds reach the record, the summary and the report.
    assert record["usage"]["generator"]["seconds"] > 0
    saved = [json.loads(line) for line in (out / "results" / "amber-mcf.jsonl").open()]
    assert summaries["amber-mcf"]["usage_per_question"]["generator"]["seconds"] == round(
        sum(r["usage"]["generator"]["seconds"] for r in saved) / len(saved), 2)
    assert "| agent | calls/q | prompt tokens/q | completion tokens/q | LLM s/q | share of s/q |" \
        in (out / "report.md").read_text()
    # Rerunning resumes: the resolved adapter makes the same config.
    runner.run_evaluation(config, out, progress=False)

    assert main(["trace", str(out), "demo-0-0", "--pipeline", "amber-mcf"]) == 0
    shown = capsys.readouterr().out
    assert "Round 1 — query: 'In which town was" in shown and "Memory:" in shown
    assert "stopped (" in shown and "generator" in shown
    assert main(["trace", str(out), "demo-0-0"]) == 2  # no results/amber.jsonl
    assert "pick one with --pipeline: amber-judge, amber-mcf" in capsys.readouterr().err
    assert main(["trace", str(out), "nope", "--pipeline", "amber-judge"]) == 2
    assert "no question 'nope'" in capsys.readouterr().err


def test_mcf_without_a_usable_trained_filter_is_a_clear_error(tmp_path, tiny_model_dir,
                                                              monkeypatch):
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(adapter_store, "SHIPPED_DIR", tmp_path / "shipped-nothing")
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    config = RunConfig(dataset=str(dataset), pipelines=("vanilla", "amber"),
                       models=tiny_roles(tiny_model_dir))
    with pytest.raises(AdapterError, match="'smollm2-filter' is neither a folder nor the name"):
        runner.run_evaluation(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # nothing half-written
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        runner.run_evaluation(
            replace(config, models=tiny_roles(tiny_model_dir, adapter=str(tmp_path))),
            tmp_path / "run", progress=False)
    # The judge needs no training; `auto` routed to amber needs it.
    assert compose.plan_run(RunConfig(dataset="d", pipelines=("amber-judge",))
                            ).trained_filter is None
    with pytest.raises(AdapterError, match="'smollm2-filter' is neither"):
        compose.plan_run(replace(config, pipelines=("auto",),
                                 auto=AutoConfig(routed_pipeline="amber-stack")))


def test_ask_answers_over_an_index_and_shows_evidence_and_rounds(
        tmp_path, tiny_model_dir, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "title": "Liora Tamsin", "text": "Liora Tamsin was born in Quorrin."},
        {"id": "b", "title": "Penguins", "text": "Penguins huddle together in winter."},
        {"id": "c", "title": "Calder Bridge", "text": "The Calder Bridge opened in 1901."},
    ]))
    index = tmp_path / "index"
    build_index(corpus, index, IndexConfig(dense=None), show_progress=False)
    assert main(["ask", "Where was Liora Tamsin born?", "--index", str(index), "--mode", "bm25",
                 "--models.generator.model", str(tiny_model_dir), "--amber.filter", "none",
                 "--amber.k", "1", "--amber.max-iterations", "2", "--trace"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Answer: ") and "Evidence read (" in shown
    assert "[1] Liora Tamsin: Liora Tamsin was born in Quorrin." in shown
    assert "Round 1 — query: 'Where was Liora Tamsin born?'" in shown
    assert main(["ask", "q?", "--index", str(tmp_path / "none")]) == 2
    assert "index folder" in capsys.readouterr().err


def test_demo_compares_pipelines_and_explains_amber_with_the_default_filter(
        tmp_path, tiny_model_dir, adapter_dir, monkeypatch, capsys):
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    install_adapter(adapter_dir, DEFAULT_FILTER_NAME)
    out = tmp_path / "demo"
    (out / "run").mkdir(parents=True)
    (out / "run" / "stale.txt").write_text("an earlier demo", encoding="utf-8")
    assert main(["demo", "--out", str(out), "--limit", "2", "--quiet",
                 "--models.generator.model", str(tiny_model_dir),
                 "--models.filter.model", str(tiny_model_dir)]) == 0
    shown = capsys.readouterr().out
    assert not (out / "run" / "stale.txt").exists()  # a fresh run, not a resumed one
    # What ranks is said once, at start, though the demo runs twice.
    assert shown.count("MCF ranks by ") == 1
    assert shown.splitlines()[1].startswith("MCF ranks by BM25 + dense alone")
    for pipeline in ("direct", "vanilla", "main-rag", "amber-mcf"):
        assert f"| {pipeline} | 2 |" in shown
    assert "amber with the trained filter" in shown and "beat" in shown
    # The shipped card ranks by BM25 + dense alone: the filter is not asked about chunks.
    assert "relevant document ranked first in round 1: by BM25 alone in" in shown
    assert "(the filter was not called for chunks: its card ranks by BM25 + dense)" in shown
    assert "Question demo-0-0:" in shown and "Round 1 — query:" in shown
    # The two-hop example over an index: two rounds, the second led by a kept name.
    bridge = shown.split("a two-hop question over an index", 1)[1]
    assert "Round 1 — query: 'In which town was the founder of" in bridge
    assert "Round 2 — query: '" in bridge and "(bridge)" in bridge and "Candidates: " in bridge
    assert (out / "bridge-index" / "manifest.json").is_file()
    assert main(["trace", str(out / "bridge-run"), "bridge-0", "--pipeline", "amber-mcf"]) == 0
    assert "Round 2 — query:" in capsys.readouterr().out
    *_, finished, report = shown.rstrip().splitlines()
    assert finished.startswith("demo finished in ")
    assert report == f"report: {out / 'run' / 'report.html'}"  # the page, named last
    assert '"id":"demo-0-1"' in (out / "run" / "report.html").read_text(encoding="utf-8")
