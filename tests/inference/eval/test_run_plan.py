"""A run's decisions are made once, in its plan (`compose.plan_run`): which role runs on which
model, and whether the trust metrics' LLM grader runs and on which. The runner and the role
builder read the plan, never the config again — so a plan changed after planning is what runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend, serve_every_role
from fake_dense import fake_encoder

from sieverag.inference.composition import compose
from sieverag.inference.composition.config import ModelRoles, RunConfig, TrustConfig
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.metrics.grader import GRADER_CRITERIA
from sieverag.inference.retrieval import dense

GENERATOR = BackendSpec(model="gen", endpoint="http://127.0.0.1:9/v1")
JUDGE = BackendSpec(model="judge", endpoint="http://127.0.0.1:9/v1")
OWN_GRADER = BackendSpec(model="own-grader", endpoint="http://127.0.0.1:9/v1")


@pytest.mark.parametrize(("models", "trust", "grader"), [
    (ModelRoles(generator=GENERATOR), TrustConfig(), None),
    (ModelRoles(generator=GENERATOR), TrustConfig(enabled=False, llm_grader=True), None),
    (ModelRoles(generator=GENERATOR), TrustConfig(llm_grader=True), GENERATOR),
    (ModelRoles(generator=GENERATOR, judge=JUDGE), TrustConfig(llm_grader=True), JUDGE),
    (ModelRoles(generator=GENERATOR, judge=JUDGE),
     TrustConfig(llm_grader=True, grader_model=OWN_GRADER), OWN_GRADER),
])
def test_the_plan_decides_whether_a_grader_runs_and_on_which_model(
        models: ModelRoles, trust: TrustConfig, grader: BackendSpec | None) -> None:
    plan = compose.plan_run(RunConfig(dataset="d", pipelines=("vanilla",), models=models,
                                      trust=trust))
    assert plan.grader == grader
    assert plan.model_specs == [GENERATOR, *([grader] if grader is not None else [])]


def test_the_plan_maps_each_role_it_calls_to_its_model() -> None:
    models = ModelRoles(generator=GENERATOR, judge=JUDGE)
    for pipelines, specs in [(("vanilla",), {"generator": GENERATOR}),
                             (("main-rag",), {"generator": GENERATOR, "judge": JUDGE})]:
        plan = compose.plan_run(RunConfig(dataset="d", pipelines=pipelines, models=models))
        assert dict(plan.role_specs) == specs, pipelines
    # No judge set: the judge role runs on the generator's model.
    plan = compose.plan_run(RunConfig(dataset="d", pipelines=("main-rag",),
                                      models=ModelRoles(generator=GENERATOR)))
    assert dict(plan.role_specs) == {"generator": GENERATOR, "judge": GENERATOR}


def test_roles_are_built_from_the_plan_s_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose, "build_backend", lambda spec: spec.model)
    plan = compose.plan_run(RunConfig(dataset="d", pipelines=("vanilla",),
                                      models=ModelRoles(generator=GENERATOR)))
    roles = compose.build_roles(replace(plan, role_specs={"generator": GENERATOR,
                                                          "judge": JUDGE},
                                        grader=OWN_GRADER))
    assert (roles.generator, roles.judge, roles.filter, roles.grader) == (
        "gen", "judge", None, "own-grader")


@pytest.fixture
def graded_backend(monkeypatch: pytest.MonkeyPatch) -> ScriptedBackend:
    """Every model of a run is one scripted backend whose every reply is a valid grading (the
    pipelines' answers too); the trust metrics' encoder hashes words (no model loads)."""
    grades = json.dumps(dict.fromkeys(GRADER_CRITERIA, 4))
    backend = ScriptedBackend(reply=lambda text: grades)
    serve_every_role(monkeypatch, backend)
    monkeypatch.setattr(dense, "make_encoder", lambda config: fake_encoder)
    return backend


@pytest.mark.parametrize("config_grades", [False, True])
def test_the_runner_grades_as_its_plan_says_not_as_the_config_says(
        tmp_path: Path, graded_backend: ScriptedBackend, config_grades: bool) -> None:
    """The config asks for a grader and the plan says none, or the other way round: the
    records, the usage and summary.json follow the plan."""
    config = RunConfig(dataset=str(write_demo_dataset(tmp_path / "demo.jsonl")),
                       pipelines=("direct",), limit=2, models=ModelRoles(generator=GENERATOR),
                       trust=TrustConfig(llm_grader=config_grades))
    plan = compose.plan_run(config)
    assert (plan.grader is not None) is config_grades
    planned = replace(plan, grader=None if config_grades else OWN_GRADER)
    out = tmp_path / "run"
    runner.run_plan(planned, out, progress=False, announce=False)
    records = [json.loads(line) for line in (out / "results" / "direct.jsonl").open()]
    summary = json.loads((out / "summary.json").read_text())
    graded_by = {agent for agent, _ in graded_backend.calls if agent == "grader"}
    if config_grades:  # the plan says no grader
        assert [r["trust"].get("llm_grader") for r in records] == [None, None]
        assert "grader" not in summary and not graded_by
    else:  # the plan names one
        assert [r["trust"]["llm_grader"]["overall"] for r in records] == [4, 4]
        assert summary["grader"] == {"model": "own-grader", "self_graded": False}
        assert graded_by == {"grader"}
