"""Roles on their own devices, and roles on one base model sharing one copy of its weights.

Each role (generator, judge, filter, scorer, embedder) names its own device (`cuda:N` too),
checked before any model loads. Roles that run on the same base model, precision and device
share one loaded copy: the adapters live in one PEFT wrapper around it, switched per call
(`hf.SharedBase`), and each role computes exactly what it computes loaded alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401

from sieverag.inference.agents.roles import ModelRoles
from sieverag.inference.composition.compose import check_role_devices
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import validate_settings
from sieverag.inference.core.types import check_device_present
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig, load_causal_lm

PROMPTS = [
    [{"role": "user", "content": "Is the sky blue?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Name a long river in Africa and say why it matters."}],
]
GREEDY = GenerationSettings(max_new_tokens=8)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return [make_lora_adapter(tiny_model_dir, folder / f"lora{seed}", seed=seed)
            for seed in (1, 2)]


def fresh_copy(model_dir: Path, folder: Path) -> str:
    """The tiny model in a folder of its own: a base no other test has loaded anything onto."""
    return str(shutil.copytree(model_dir, folder))


def storages(*models: torch.nn.Module, lora: bool) -> dict[int, int]:
    """Distinct parameter storages (address → bytes) of `models`: the LoRA tensors', or the
    base weights'."""
    return {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
            for model in models for name, p in model.named_parameters()
            if ("lora_" in name) == lora}


def outputs(backend: HFBackend) -> tuple:
    """What a role computes: greedy replies, label log-probs, continuation log-probs."""
    return (backend.generate(PROMPTS, GREEDY),
            backend.label_logprobs(PROMPTS, ["Yes", "No"]),
            backend.continuation_logprob(PROMPTS, ["Yes, it is.", "The Nile."]))


def assert_same(got: tuple, expected: tuple) -> None:
    assert got[0] == expected[0]
    for row, want in zip(got[1], expected[1], strict=True):
        assert row == pytest.approx(want, abs=1e-5)
    assert got[2] == pytest.approx(expected[2], abs=1e-4)


def test_two_roles_on_one_base_hold_one_copy_and_compute_as_loaded_alone(
        tiny_model_dir, adapters, tmp_path):
    alone_generator = HFBackend(HFBackendConfig(model=fresh_copy(tiny_model_dir,
                                                                 tmp_path / "g")))
    alone_filter = HFBackend(HFBackendConfig(model=fresh_copy(tiny_model_dir, tmp_path / "f"),
                                             adapter=str(adapters[0])))
    expected_generator, expected_filter = outputs(alone_generator), outputs(alone_filter)

    shared = fresh_copy(tiny_model_dir, tmp_path / "shared")
    generator = HFBackend(HFBackendConfig(model=shared))
    filter_role = HFBackend(HFBackendConfig(model=shared, adapter=str(adapters[0])))
    # One copy of the base: the two roles' base weights are the same storages, as many bytes
    # as one model loaded alone holds; the adapter adds only its LoRA tensors.
    alone_base = storages(alone_generator.model, lora=False)
    assert storages(generator.model, lora=False) == storages(filter_role.model, lora=False)
    assert sum(storages(generator.model, filter_role.model, lora=False).values()) == sum(
        alone_base.values())
    assert sum(storages(filter_role.model, lora=True).values()) == sum(
        storages(alone_filter.model, lora=True).values()) > 0
    # Each role computes what it computes alone, whichever ran last on the shared weights.
    assert_same(outputs(filter_role), expected_filter)
    assert_same(outputs(generator), expected_generator)
    assert_same(outputs(filter_role), expected_filter)
    # A role's direct forward outside any call runs the plain base (the adapter layers are off).
    ids = torch.tensor([generator.prompt_ids(PROMPTS[0])])
    with torch.inference_mode():
        plain = alone_generator.model(input_ids=ids).logits
        assert torch.equal(generator.model(input_ids=ids).logits, plain)


def test_a_second_adapter_on_the_same_base_is_a_named_adapter_not_a_copy(
        tiny_model_dir, adapters, tmp_path):
    alone = HFBackend(HFBackendConfig(model=fresh_copy(tiny_model_dir, tmp_path / "alone"),
                                      adapter=str(adapters[1])))
    expected = outputs(alone)
    shared = fresh_copy(tiny_model_dir, tmp_path / "shared")
    first = HFBackend(HFBackendConfig(model=shared, adapter=str(adapters[0])))
    second = HFBackend(HFBackendConfig(model=shared, adapter=str(adapters[1])))
    assert second.model is first.model  # one PeftModel holding both adapters by name
    assert {first.adapter_name, second.adapter_name} <= set(first.model.peft_config)
    assert first.adapter_name != second.adapter_name
    assert sum(storages(first.model, lora=False).values()) == sum(
        storages(alone.model, lora=False).values())  # one base, not one per adapter
    first_outputs = outputs(first)
    assert_same(outputs(second), expected)
    assert_same(outputs(first), first_outputs)
    # A role on the same base built after the adapters runs the plain base.
    plain_alone = HFBackend(HFBackendConfig(model=fresh_copy(tiny_model_dir, tmp_path / "p")))
    assert_same(outputs(HFBackend(HFBackendConfig(model=shared))), outputs(plain_alone))


def test_auto_and_cpu_are_one_load_on_a_machine_without_a_gpu(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine auto is cuda:0")
    assert load_causal_lm(str(tiny_model_dir), "auto", "auto")[0] is load_causal_lm(
        str(tiny_model_dir), "float32", "cpu")[0]


def test_a_device_is_auto_cpu_cuda_or_cuda_n_named_by_its_setting():
    for good in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert validate_settings(BackendSpec, {"device": good}, "flags").device == good
    for bad in ("gpu", "cuda:", "cuda:x", "CUDA:1", "cuda:1 "):
        with pytest.raises(ConfigError, match=r"filter\.device: a device is auto, cpu, cuda or "
                                              r"cuda:N .*got"):
            validate_settings(ModelRoles, {"filter": {"device": bad}}, "flags")
    with pytest.raises(ConfigError, match="device: a device is"):
        HFBackendConfig(device="gpu")


def test_a_gpu_the_machine_lacks_is_one_error_naming_the_role_and_the_count(monkeypatch):
    models = validate_settings(ModelRoles, {"filter": {"device": "cuda:3"},
                                            "judge": {"device": "cuda:1"}}, "flags")
    specs = {"generator": models.generator, "judge": models.judge_spec,
             "filter": models.filter}  # as `RunPlan.role_specs` has them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ConfigError, match=r"^models\.filter\.device is cuda:3, but this machine "
                                          r"has 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        check_role_devices(specs)
    del specs["filter"]  # a run that calls no filter plans no filter spec: none checked
    check_role_devices(specs)
    assert check_device_present("cuda", "x") == "cuda:0"
    assert check_device_present("auto", "x") == "cuda:0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"^models\.judge\.device is cuda:1, but this machine "
                                          r"has no CUDA GPU"):
        check_role_devices(specs)
    assert check_device_present("auto", "x") == "cpu"


def test_the_prefill_budget_and_batch_size_are_role_settings(tiny_model_dir):
    from sieverag.inference.composition.config import RunConfig
    from sieverag.inference.core.settings import parse_settings

    config = parse_settings(RunConfig, ["--dataset", "data.jsonl",
                                        "--models.generator.batch-tokens", "4096",
                                        "--models.filter.batch-size", "64"], "sieverag eval")
    assert config.models.generator.batch_tokens == 4096
    assert config.models.filter.batch_size == 64
    with pytest.raises(ConfigError, match="batch_tokens must be >= 1"):
        BackendSpec(batch_tokens=0)
    backend = build_backend(BackendSpec(model=str(tiny_model_dir), batch_tokens=64,
                                        batch_size=3))
    assert (backend.config.batch_tokens, backend.config.batch_size) == (64, 3)
