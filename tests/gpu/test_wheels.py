"""The GPU check's wheel set covers what the check imports (no network).

The lent GPU machine has no network: what the check imports must be there already (the
device README's package list, tests/gpu/lent_machine.txt) or travel as a wheel
(tests/gpu/prepare_wheels.sh, whose list tests/gpu/wheel_set.py derives from pyproject.toml).
The check once stopped at import for want of rouge-score and openai; this walks the imports
of every module the check runs and fails on any third-party distribution in neither."""

from __future__ import annotations

import wheel_set


def test_every_third_party_import_of_the_check_is_on_the_machine_or_in_the_wheel_set():
    """What a module the check runs imports at load time is there; what it imports inside a
    function is there too, or belongs to an optional extra for a feature the check does not
    use (Milvus, OpenTelemetry's exporter): the module loads without it."""
    there = set(wheel_set.wheel_set()) | set(wheel_set.lent_machine())
    extras = wheel_set.optional_extras()
    missing = {}
    for lazy in (False, True):
        for module, files in sorted(wheel_set.third_party_imports(lazy).items()):
            distribution = wheel_set.distribution_of(module)
            if distribution in there or (lazy and distribution in extras):
                continue
            missing[module] = (distribution, "inside functions" if lazy else "at load time",
                               sorted(files)[:3])
    assert not missing, (
        "imported by the GPU check's modules but neither on the lent machine "
        f"(tests/gpu/lent_machine.txt) nor in the wheel set (pyproject.toml): {missing}")


def test_the_walk_reaches_what_the_check_runs():
    modules = wheel_set.checked_modules()
    # The training step's launched module, the server the serve step starts, the combination
    # fit `sieverag train` imports, and the OpenAI client of the serve step.
    for file in ("training/sft/trainer.py", "serving/cli.py", "training/cli/train.py",
                 "inference/metrics/answer_scores.py", "inference/llm/openai_backend.py",
                 "tests/benchmarks/bench_train.py"):
        assert file in modules, file
    at_load = {module.split(".")[0] for module in wheel_set.third_party_imports(lazy=False)}
    assert {"rouge_score", "openai", "trl", "torch", "fastapi", "transformers"} <= at_load
    assert "deepspeed" in {module.split(".")[0] for module in wheel_set.third_party_imports()}


def test_the_wheel_set_is_the_declared_dependencies_the_machine_lacks():
    carried = wheel_set.wheel_set()
    on_machine = wheel_set.lent_machine()
    # Declared, not on the machine: carried, with what they need in turn.
    assert {"rouge-score", "openai", "trl", "datasets", "deepspeed", "pydantic-settings",
            "nltk", "jiter"} <= set(carried)
    # On the machine: never carried (torch's own build there is CUDA's).
    assert not set(carried) & set(on_machine)
    assert on_machine["torch"] == "2.11.0" and on_machine["transformers"] == "5.17.0"
    declared = {wheel_set.normalize(r.name) for r in wheel_set.declared_requirements()}
    assert declared <= set(carried) | set(on_machine)
    assert all(version for version in carried.values())
