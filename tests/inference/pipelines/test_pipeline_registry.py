"""A pipeline is one module that declares what it needs where it is registered — whether it
reads documents, its filter stage, the model roles it calls, the settings sections it reads —
and composition and the commands read the declarations: a new pipeline module is composed,
configured and given flags without any other file naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sieverag.inference.composition import compose
from sieverag.inference.composition.config import ModelRoles, RunConfig, load_run_config
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import Section
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.pipelines.amber.config import AmberConfig
from sieverag.inference.pipelines.auto import AutoConfig
from sieverag.inference.pipelines.iter_retgen import IterRetGenConfig
from sieverag.inference.pipelines.pipeline_registry import (
    SECTIONS,
    PartInputs,
    PipelineContext,
    PipelineEntry,
    default_pipeline,
    pipeline_entry,
    register_pipeline,
)

# A served filter: planning a run that calls it resolves nothing on disk.
SERVED = ModelRoles(filter=BackendSpec(endpoint="http://127.0.0.1:9/v1", model="filter"))


def plan(pipelines: tuple[str, ...], **fields: object) -> compose.RunPlan:
    return compose.plan_run(RunConfig(dataset="d", pipelines=pipelines, models=SERVED,
                                      **fields))


def test_a_new_pipeline_is_composed_from_its_declaration(
    registry: dict[str, PipelineEntry]
) -> None:
    @register_pipeline("test-closed-book", reads_documents=False)
    class ClosedBook:
        name = "test-closed-book"

    @register_pipeline("test-trained", filter_stage=lambda settings: "mcf")
    class Trained:
        name = "test-trained"

    closed = plan(("test-closed-book",))
    assert not closed.reads_given_documents
    assert closed.roles == {"generator"} and closed.trained_filter is None
    trained = plan(("test-closed-book", "test-trained"))
    assert trained.reads_given_documents and trained.roles == {"generator", "filter"}
    assert trained.trained_filter == SERVED.filter
    # `auto` runs its routed pipeline: that one's needs count.
    routed = plan(("auto",), auto=AutoConfig(routed_pipeline="test-trained"))
    assert routed.pipelines == {"auto", "test-trained"}
    assert routed.reads_given_documents and "filter" in routed.roles


@pytest.mark.parametrize(("pipeline", "amber_filter", "roles", "documents"), [
    ("direct", "mcf", {"generator"}, False), ("vanilla", "mcf", {"generator"}, True),
    ("iter-retgen", "mcf", {"generator"}, True),
    ("main-rag", "mcf", {"generator", "judge"}, True),
    ("main-rag-naive", "mcf", {"generator", "judge"}, True),
    ("amber", "judge", {"generator", "judge"}, True),
    ("amber", "stack", {"generator", "judge", "filter"}, True),
    ("amber-mcf", "judge", {"generator", "filter"}, True),
    ("amber-no-amu", "mcf", {"generator", "filter"}, True),
    ("amber-paper", "judge", {"generator", "filter"}, True),  # the paper's MCF, always
    ("amber-judge", "mcf", {"generator", "judge"}, True),
    ("amber-none", "mcf", {"generator"}, True)])
def test_the_shipped_pipelines_declare_their_needs(pipeline: str, amber_filter: str,
                                                   roles: set[str], documents: bool) -> None:
    planned = plan((pipeline,), amber=AmberConfig(filter=amber_filter))
    assert planned.roles == roles
    assert planned.reads_given_documents is documents


def test_a_run_builds_only_the_roles_its_pipelines_call(monkeypatch) -> None:
    built: list[str | None] = []
    monkeypatch.setattr(compose, "build_backend", lambda spec: built.append(spec.model) or spec)
    models = ModelRoles(generator=BackendSpec(model="gen"), judge=BackendSpec(model="judge"),
                        filter=BackendSpec(endpoint="http://127.0.0.1:9/v1", model="filter"))
    for pipelines, expected in [(("vanilla",), ["gen"]), (("main-rag",), ["gen", "judge"]),
                                (("amber-mcf", "direct"), ["gen", "filter"])]:
        built.clear()
        config = RunConfig(dataset="d", pipelines=pipelines, models=models)
        compose.build_roles(compose.plan_run(config))
        assert built == expected, pipelines


def test_what_a_pipeline_runs_inside_it_and_its_part_are_built_from_its_declaration(
        registry: dict[str, PipelineEntry], monkeypatch: pytest.MonkeyPatch) -> None:
    """`inner` pipelines join the plan; a `part` begins before any model loads and is finished
    with the run's generator, then read by the pipeline as `context.part(name)`."""
    steps: list[str] = []
    monkeypatch.setattr(compose, "build_backend",
                        lambda spec: steps.append(f"model {spec.model}") or spec)

    def part(inputs: PartInputs):
        steps.append(f"part begun, index {inputs.index}")
        return lambda generator: ("the part", generator.model)

    @register_pipeline("test-outer", reads_documents=False,
                       inner=lambda settings: ["test-inner"], part=part)
    class Outer:
        def __init__(self, context: PipelineContext) -> None:
            self.part = context.part("test-outer", "thing")

    register_pipeline("test-inner", roles=["judge"])(lambda context: None)
    config = RunConfig(dataset="d", pipelines=("test-outer",), models=ModelRoles(
        generator=BackendSpec(model="gen"), judge=BackendSpec(model="judge")))
    plan = compose.plan_run(config)
    assert plan.pipelines == {"test-outer", "test-inner"}
    assert plan.roles == {"generator", "judge"} and plan.reads_given_documents
    context, _ = compose.build_context(plan)
    assert steps == ["part begun, index None", "model gen", "model judge"]
    assert Outer(context).part == ("the part", "gen")
    with pytest.raises(ConfigError, match="'test-outer' pipeline needs its thing in the context"):
        Outer(PipelineContext(generator=context.generator))


def test_the_default_pipeline_is_the_one_registered_as_default(
        registry: dict[str, PipelineEntry]) -> None:
    assert default_pipeline() == "vanilla" == RunConfig(dataset="d").pipelines[0]
    assert AutoConfig().routed_pipeline == "vanilla"
    with pytest.raises(ConfigError, match="both declare themselves the default"):
        register_pipeline("test-other-default", default=True)(lambda context: None)
    assert "test-other-default" not in registry and default_pipeline() == "vanilla"


def test_an_old_top_level_routed_pipeline_is_read_into_autos_section(tmp_path: Path) -> None:
    old = tmp_path / "config.yaml"
    old.write_text("dataset: d.jsonl\npipelines: [auto]\nrouted_pipeline: amber-mcf\n",
                   encoding="utf-8")
    assert load_run_config(old).auto == AutoConfig(routed_pipeline="amber-mcf")
    both = tmp_path / "both.yaml"
    both.write_text("dataset: d.jsonl\nrouted_pipeline: amber-mcf\n"
                    "auto: {routed_pipeline: main-rag}\n", encoding="utf-8")
    assert load_run_config(both).auto.routed_pipeline == "main-rag"  # the section's wins
    with pytest.raises(ConfigError, match="cannot be `auto` itself"):
        AutoConfig(routed_pipeline="auto")


def test_the_sections_the_pipelines_declare_are_run_config_fields() -> None:
    assert {"amber", "judge", "mcf", "iter_retgen", "router"} <= set(SECTIONS)
    config = RunConfig(dataset="d", pipelines=("iter-retgen",),
                       iter_retgen=IterRetGenConfig(k=4))
    assert compose.plan_run(config).settings(IterRetGenConfig).k == 4
    assert compose.plan_run(config).settings(AmberConfig) == AmberConfig()  # defaults
    assert "iter_retgen:\n  k: 4\n" in config.to_yaml()


def test_a_section_key_means_one_settings_class(registry: dict[str, PipelineEntry]) -> None:
    with pytest.raises(ConfigError, match="section 'amber' as IterRetGenConfig, already "
                                          "declared as AmberConfig"):
        register_pipeline("test-clash", sections=[Section("amber", IterRetGenConfig, "x")])
    with pytest.raises(ConfigError, match="unknown role"):
        register_pipeline("test-role", roles=("reranker",))  # type: ignore[arg-type]


def test_an_unknown_pipeline_is_one_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown pipeline 'nope' .*amber-mcf"):
        pipeline_entry("nope")
    with pytest.raises(ConfigError, match="unknown pipeline 'nope'"):
        compose.plan_run(RunConfig(dataset="d", pipelines=("nope",)))


# A whole new pipeline, as a newcomer writes it: one module, nothing else edited.
ECHO_MODULE = '''
"""`echo`: answers with the question repeated `echo.times` times (a test pipeline)."""

from dataclasses import field

from sieverag.inference.pipelines.pipeline_registry import (
    PipelineContext, PipelineOutput, register_pipeline)
from sieverag.inference.core.settings import Section, settings


@settings
class EchoConfig:
    times: int = field(default=1, metadata={"help": "how many times to repeat the question"})


@register_pipeline("echo", reads_documents=False, sections=[Section("echo", EchoConfig,
                                                                     "the `echo` pipeline")])
class EchoPipeline:
    name = "echo"

    def __init__(self, context: PipelineContext) -> None:
        self.times = context.settings(EchoConfig).times

    def run(self, example):
        answer = " ".join([example.question] * self.times)
        return PipelineOutput(answer=answer, raw_answer=answer, documents_read=())
'''

# The start of a script run as `python -c SCRIPT FOLDER ...`: imports the pipelines package
# with one more folder on its path, FOLDER (where a new pipeline's module is).
WITH_NEW_PIPELINES = '''
import importlib.util, sys
spec = importlib.util.find_spec("sieverag.inference.pipelines")
spec.submodule_search_locations.append(sys.argv[1])
package = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = package
spec.loader.exec_module(package)
'''

# Uses the new `echo` pipeline through the run config, composition and the `eval` command's
# flags.
ECHO_RUN = WITH_NEW_PIPELINES + '''
from sieverag.inference.composition.compose import build_context, plan_run
from sieverag.inference.composition.config import RunConfig
from sieverag.inference.pipelines import build_pipeline
from sieverag.inference.core.types import Example
import sieverag.inference.llm.backend_registry as backend_registry

config = RunConfig(dataset="d", pipelines=("echo",), echo={"times": 2})
plan = plan_run(config)
print("roles", sorted(plan.roles), "documents", plan.reads_given_documents)
backend_registry.build_backend = lambda spec: object()  # no model: echo calls none
import sieverag.inference.composition.compose as compose
compose.build_backend = backend_registry.build_backend
context, _ = build_context(plan)
echo = build_pipeline("echo", context)
print("answer", echo.run(Example(id="q", question="hi", answers=())).answer)
from sieverag.cli import main
main(["eval", "--help"])
'''


def test_a_new_pipeline_is_one_module(tmp_path: Path) -> None:
    folder = tmp_path / "more_pipelines"
    folder.mkdir()
    (folder / "echo.py").write_text(textwrap.dedent(ECHO_MODULE), encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", ECHO_RUN, str(folder)], capture_output=True,
                         text=True, timeout=120, env={**os.environ,
                                                      "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    assert "roles ['generator'] documents False" in run.stdout
    assert "answer hi hi" in run.stdout
    assert "--echo.times" in run.stdout and "how many times to repeat" in run.stdout


# A new pipeline with a trace of its own, as a newcomer writes it: its trace model and the
# renderer `sieverag trace` shows it with are declared where it registers; nothing else edited.
TALLY_MODULE = '''
"""`tally`: answers with the title of the longest document it is given (a test pipeline)."""

from pydantic import Field

from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.pipelines.pipeline_registry import PipelineOutput, register_pipeline
from sieverag.inference.pipelines.traces import PipelineTrace


class Count(JsonlRecord):
    id: str = Field(description="the document's id")
    words: int = Field(description="its words")


class TallyTrace(PipelineTrace):
    counts: list[Count] = Field(description="every document's words, in the given order")
    longest: str = Field(description="the id of the longest")


def render_tally(trace: TallyTrace) -> str:
    return "\\n".join([f"Tally: longest {trace.longest}",
                       *(f"  {c.id}: {c.words} words" for c in trace.counts)])


@register_pipeline("tally", trace=TallyTrace, render_trace=render_tally)
class TallyPipeline:
    name = "tally"

    def __init__(self, context) -> None:
        self.documents = context.documents

    def run(self, example):
        documents = tuple(self.documents(example))
        counts = [Count(id=d.id, words=len(d.text.split())) for d in documents]
        longest = max(documents, key=lambda d: len(d.text.split()))
        trace = TallyTrace(counts=counts, longest=longest.id)
        return PipelineOutput(answer=longest.title, raw_answer=longest.title,
                              documents_read=(longest,), trace=trace.to_json())
'''

# Runs `tally` through `sieverag eval` in process (no model: it calls none), alone and behind
# `auto`'s router, then reads its records back and shows one with `sieverag trace`.
TALLY_RUN = WITH_NEW_PIPELINES + '''
import json
from pathlib import Path

import sieverag.inference.composition.compose as compose
from sieverag.cli import main
from sieverag.inference.composition.config import RunConfig, TrustConfig
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.pipelines.auto import RouteTrace
from sieverag.inference.pipelines.tally import TallyTrace

compose.build_backend = lambda spec: object()  # no model: tally calls none
dataset, out = sys.argv[2], Path(sys.argv[3])
config = RunConfig(dataset=dataset, pipelines=("tally", "auto"), trust=TrustConfig(enabled=False),
                   auto={"routed_pipeline": "tally"},
                   router={"rule": "corpus-match", "long_query_tokens": 1})
run_evaluation(config, out, progress=False, announce=False)
for name in ("tally", "auto"):
    path = out / "results" / f"{name}.jsonl"
    line = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    (record,) = JsonlLog(path).read_records(EvalRecord)
    print(name, "tally trace", isinstance(record.trace, TallyTrace), "route",
          isinstance(record.trace, RouteTrace), "round trip", record.to_json() == line,
          "longest", record.trace.longest)
bad = dict(line, trace={**line["trace"], "longest_id": "q1/1"})
try:
    EvalRecord.model_validate(bad)
except ValueError as error:
    print("renamed key refused:", "trace.longest_id" in str(error))
main(["trace", str(out), "q1", "--pipeline", "auto"])
'''


def test_a_new_pipeline_declares_its_trace_and_eval_shows_it(tmp_path: Path) -> None:
    """A pipeline with its own trace model and renderer is one module too: `sieverag eval`
    stores its trace, reads it back as its model (also beside `auto`'s route, when `auto`
    runs it), refuses a renamed key, and `sieverag trace` shows it by its renderer."""
    folder = tmp_path / "more_pipelines"
    folder.mkdir()
    (folder / "tally.py").write_text(textwrap.dedent(TALLY_MODULE), encoding="utf-8")
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({
        "id": "q1", "question": "Which river is longest?", "answers": ["Nile"],
        "ctxs": [{"title": "Seine", "text": "The Seine is a river."},
                 {"title": "Nile", "text": "The Nile is the longest river of all."}],
    }) + "\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", TALLY_RUN, str(folder), str(dataset),
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    assert "tally tally trace True route False round trip True longest q1/1" in run.stdout
    assert "auto tally trace True route True round trip True longest q1/1" in run.stdout
    assert "renamed key refused: True" in run.stdout
    # `sieverag trace`: the router's line, then tally's own renderer.
    shown = run.stdout[run.stdout.index("Question q1"):]
    assert "Router: retrieve (" in shown
    assert "Tally: longest q1/1\n  q1/0: 5 words\n  q1/1: 8 words" in shown
    assert shown.index("Router: ") < shown.index("Tally: ")
