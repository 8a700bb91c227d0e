"""`amber-paper` is the paper's loop as a pipeline, with or without the `amber-paper` preset:
the sufficiency check and the memory agents every round, the answer from the memory, MCF at
both granularities (scripted agents); the adaptive `amber` default is unchanged."""

from __future__ import annotations

from fake_backend import ScriptedBackend
from scripted_amber import EXAMPLE, Agents

from sieverag.inference.cli.run import EvalCommand
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.pipelines import PipelineContext, PipelineSettings, build_pipeline
from sieverag.inference.pipelines.amber.config import AmberConfig, paper_amber, paper_mcf


def run(pipeline: str, amber: AmberConfig, mcf: MCFConfig):
    agents = Agents()  # the memory is never enough: the loop runs until the pool is spent
    backend = ScriptedBackend(reply=agents.reply, labels=agents.labels)
    context = PipelineContext(generator=backend, judge_backend=backend, mcf_backend=backend,
                              settings=PipelineSettings([mcf, amber]))
    built = build_pipeline(pipeline, context)
    return built, built.run(EXAMPLE), backend


def usage(backend: ScriptedBackend) -> dict[str, int]:
    return {agent: u.calls for agent, u in backend.meter.by_agent.items()}


def test_amber_paper_runs_the_papers_loop_without_the_preset() -> None:
    # The run's sections at their defaults: the adaptive loop, answers from the evidence, MCF
    # without its sentence stage. The pipeline runs the paper's loop regardless.
    assert AmberConfig().adaptive and AmberConfig().answer_from == "evidence"
    assert not MCFConfig().sentence_stage
    pipeline, output, backend = run("amber-paper", AmberConfig(), MCFConfig())
    config = pipeline.config
    assert (config.adaptive, config.amu, config.aic, config.filter, config.answer_from) == (
        False, True, True, "mcf", "memory")
    assert config.collector.query_source == "write"
    trace = output.trace
    assert trace["pipeline"] == "amber-paper" and trace["filter"] == "mcf"
    first, second = trace["rounds"]
    # The memory agents every round and the sufficiency check after each round that can go
    # on (no evidence-signal branch); the insufficient round writes the next query. The ten
    # given documents are spent in two rounds of five.
    assert all(r["memory_update"] is not None and r["branch"] is None for r in trace["rounds"])
    assert first["sufficiency"] is not None and not first["sufficiency"]["sufficient"]
    assert second["query"] == first["next_query"]["query"] == "search number 1"
    assert trace["stop_reason"] == "pool_exhausted"
    # Five new documents a round, MCF keeping the round's 2 best, then their key sentences.
    assert [len(r["retrieved"]) for r in trace["rounds"]] == [5, 5]
    assert [len(r["kept"]) for r in trace["rounds"]] == [2, 2]
    counts = usage(backend)
    assert counts["filter_sentence"] >= 1
    assert {counts[a] for a in ("reviewer", "challenger", "refiner")} == {2}
    assert counts["sufficiency"] == counts["query_writer"] == 1
    # The answer reads the memory M_t alone.
    answer_prompt = backend.calls[-1][1]
    assert backend.calls[-1][0] == "generator"
    assert "Notes after update 2." in answer_prompt and "Evidence:" not in answer_prompt
    assert trace["answer_from"] == "memory"


def test_the_preset_and_the_pipeline_read_one_definition() -> None:
    command = parse_settings(EvalCommand, ["--preset", "amber-paper", "--dataset", "d.jsonl"],
                             "sieverag eval")
    assert command.amber == paper_amber(AmberConfig())
    assert command.mcf == paper_mcf(MCFConfig())
    assert "amber-paper" in command.pipelines
    # The same questions give the same loop with the preset's sections or without them.
    _, with_preset, _ = run("amber-paper", command.amber, command.mcf)
    _, without, _ = run("amber-paper", AmberConfig(), MCFConfig())
    assert with_preset.trace == without.trace and with_preset.answer == without.answer


def test_the_adaptive_amber_default_is_unchanged() -> None:
    pipeline, output, backend = run("amber-mcf", AmberConfig(), MCFConfig(bar="fixed"))
    assert pipeline.config == AmberConfig() and pipeline.config.adaptive
    assert all(r["branch"] is not None for r in output.trace["rounds"])
    assert "sufficiency" not in usage(backend)
