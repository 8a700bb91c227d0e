"""The GPU check (tests/gpu/gpu_check.py) without a GPU: the command lines of its steps as
sieverag's own parsers read them, the comparison at its tolerances, the results JSON and exit
code, the CPU reference written and met again on the CPU, and its training and serving steps
run on the CPU. The tests marked `gpu` run the CUDA steps themselves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from repo_paths import TESTS
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401 (autouse)

sys.path.insert(0, str(TESTS / "gpu"))
import gpu_check  # noqa: E402

from sieverag.inference.filters.filter_format import p_relevant  # noqa: E402
from sieverag.training.sft.launch import Machine  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The check's own tiny model and random adapter, as --write-reference makes them."""
    folder = tmp_path_factory.mktemp("gpu-check-inputs")
    gpu_check.make_tiny_inputs(folder / "tiny-llama", folder / "tiny-lora")
    return folder / "tiny-llama", folder / "tiny-lora"


@pytest.fixture(scope="module")
def model_dir(inputs: tuple[Path, Path]) -> Path:
    return inputs[0]


@pytest.fixture(scope="module")
def adapter_dir(inputs: tuple[Path, Path]) -> Path:
    return inputs[1]


@pytest.fixture(scope="module")
def reference(model_dir: Path, adapter_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU reference for the tiny model and adapter, written by --write-reference."""
    path = tmp_path_factory.mktemp("reference") / "cpu_reference.json"
    assert gpu_check.main(["--write-reference", "--model", str(model_dir),
                           "--adapter", str(adapter_dir), "--reference", str(path)]) == 0
    return path


# ----- the command lines ------------------------------------------------------------------


@pytest.fixture
def bf16_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the GPU machine answers when `sieverag train` checks the bf16 recipe, the
    accelerate config's fit to the machine (one GPU) and the dataset (tmp_path/data)."""
    import transformers.training_args
    from sft_runs import write_filter_dataset

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(Machine, "detect", classmethod(
        lambda cls: Machine(cuda_devices=1, cpu_cores=16, cpu_bf16=True)))
    write_filter_dataset(tmp_path / "data")


def launched_recipe(argv: list[str]):
    from sieverag.training.sft.recipe import parse_recipe

    return parse_recipe(argv[argv.index("sieverag.training.sft") + 1:])


def test_single_gpu_training_runs_the_gpu_recipe_in_bf16(bf16_gpu: None, tmp_path: Path) -> None:
    argv = gpu_check.train_command("single_gpu", None, "tiny", tmp_path / "data",
                                   tmp_path / "out")
    config = Path(argv[argv.index("--config_file") + 1])
    assert config.name == "single_gpu.yaml" and "--num_processes" not in argv
    assert yaml.safe_load(config.read_text())["mixed_precision"] == "bf16"
    recipe = launched_recipe(argv)
    assert recipe.path.endswith("smollm2_filter_gpu.yaml")
    assert recipe.model.model_name_or_path == "tiny"
    assert recipe.training.bf16 and recipe.model.dtype == "bfloat16"
    assert recipe.training.max_steps == gpu_check.TRAIN_STEPS
    assert recipe.training.save_steps == gpu_check.TRAIN_STEPS  # a checkpoint to read tokens from
    assert recipe.training.output_dir == str(tmp_path / "out")
    assert recipe.script.dataset_path == str(tmp_path / "data")


def test_zero3_training_is_one_process_with_gathered_weights(bf16_gpu: None,
                                                            tmp_path: Path) -> None:
    argv = gpu_check.train_command("zero3", 1, "tiny", tmp_path / "data", tmp_path / "out")
    config_file = Path(argv[argv.index("--config_file") + 1])
    assert argv[argv.index("--num_processes") + 1] == "1"
    config = yaml.safe_load(config_file.read_text())
    assert config["distributed_type"] == "DEEPSPEED" and config["mixed_precision"] == "bf16"
    assert config["deepspeed_config"]["zero_stage"] == 3
    # Without it the LoRA weights are saved from empty shards: the trap the step checks.
    assert config["deepspeed_config"]["zero3_save_16bit_model"] is True
    assert launched_recipe(argv).training.bf16


@pytest.mark.parametrize("architecture", list(gpu_check.RECIPE_PATHS))
def test_the_8b_recipes_step_runs_each_recipe_under_zero3_in_one_process(
        bf16_gpu: None, tmp_path: Path, architecture: str) -> None:
    from sieverag.training.sft.sft_config import FLASH_OR_SDPA

    recipe_name, _ = gpu_check.RECIPE_PATHS[architecture]
    argv = gpu_check.train_command("zero3", 1, "tiny", tmp_path / "data", tmp_path / "out",
                                   gpu_check.RECIPE_STEPS, recipe=recipe_name)
    config = yaml.safe_load(Path(argv[argv.index("--config_file") + 1]).read_text())
    assert argv[argv.index("--num_processes") + 1] == "1"
    assert config["deepspeed_config"]["zero_stage"] == 3 and config["mixed_precision"] == "bf16"
    recipe = launched_recipe(argv)
    assert recipe.path.endswith(f"{recipe_name}.yaml")
    assert recipe.training.bf16 and recipe.model.dtype == "bfloat16"
    assert recipe.training.packing and recipe.training.packing_strategy == "bfd"
    assert recipe.training.activation_checkpointing
    assert recipe.model.attn_implementation == FLASH_OR_SDPA
    assert recipe.training.max_steps == gpu_check.RECIPE_STEPS


def test_the_8b_recipes_step_on_the_cpu(model_dir: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's own work on the CPU (float32, one process, no DeepSpeed): the tiny Llama-3
    base made from the check's tokenizer, trained with its recipe, the card read back."""
    monkeypatch.setattr(gpu_check, "TRAIN_TIMEOUT_S", 900)  # a CPU shared with other jobs
    figures = gpu_check.check_recipe_path(
        "llama3", tmp_path, accelerate_config="cpu", steps=1, tokenizer_from=model_dir,
        overrides={"use_cpu": True, "bf16": False, "dtype": "float32",
                   "dataloader_num_workers": 0, "warmup_steps": 0})  # one step, at a rate
    assert figures["steps"] == 1 and figures["adapter"]["tensors"] > 0
    assert figures["chat_template"] == "sieverag-plain" and figures["packing"] is True
    assert figures["model_init_kwargs"] == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert "llama3_8b_filter_zero3.yaml" in figures["command"]


def test_serve_command_is_the_embedded_server_on_cuda() -> None:
    from sieverag.inference.core.settings import parse_settings
    from sieverag.serving.cli import ServeCommand, engine_config
    from sieverag.serving.config import LocalServerConfig

    argv = gpu_check.serve_command("tiny", "/adapters/lora", 8123, "cuda")
    assert argv[1:4] == ["-m", "sieverag", "serve"]
    config = engine_config(parse_settings(ServeCommand, argv[4:], "sieverag serve"))
    assert isinstance(config, LocalServerConfig)
    assert (config.device, config.model, config.port) == ("cuda", "tiny", 8123)
    assert config.adapters == ("filter=/adapters/lora",)
    assert config.access_log is False


def test_served_requests_pair_every_question_with_every_passage() -> None:
    examples = gpu_check.scored_examples()
    scoring, generation = gpu_check.served_requests(examples, 100)
    assert len(scoring) == len(generation) == 100
    assert len({json.dumps(p) for p in scoring}) == 100
    assert len({json.dumps(p) for p in generation}) == 100
    pairs = len(examples) * sum(len(e.documents) for e in examples)
    with pytest.raises(ValueError, match=f"only {pairs} distinct"):
        gpu_check.served_requests(examples, pairs + 1)


# ----- the comparison at tolerance ---------------------------------------------------------


def log_odds(p_yes: float) -> float:
    return float(torch.logit(torch.tensor(p_yes, dtype=torch.float64)))


def test_filter_scores_within_tolerance_pass() -> None:
    reference = {"q": [log_odds(p) for p in (0.1, 0.3, 0.7, 0.95)]}
    measured = {"q": [log_odds(p) for p in (0.14, 0.26, 0.74, 0.93)]}
    result = gpu_check.compare_filter(reference, measured)
    assert result["passed"] and result["chunks"] == 4
    assert result["max_abs_delta_p_yes"] == pytest.approx(0.04, abs=1e-6)


def test_filter_score_outside_tolerance_fails_and_is_named() -> None:
    reference = {"q": [log_odds(0.3), log_odds(0.9)]}
    measured = {"q": [log_odds(0.3), log_odds(0.82)]}
    result = gpu_check.compare_filter(reference, measured)
    assert not result["passed"] and result["over_tolerance"] == ["q/1"]
    assert result["verdict_flips_outside_margin"] == []


def test_filter_verdict_may_flip_only_near_the_bar() -> None:
    near = gpu_check.compare_filter({"q": [log_odds(0.52)]}, {"q": [log_odds(0.49)]})
    assert near["passed"] and near["verdict_flips_outside_margin"] == []
    far = gpu_check.compare_filter({"q": [log_odds(0.58)]}, {"q": [log_odds(0.45)]})
    assert not far["passed"] and far["verdict_flips_outside_margin"] == ["q/0"]


def test_judge_scores_within_tolerance_pass_and_flips_near_the_bar_are_allowed() -> None:
    # bar = mean = 0; the document at 0.1 drops below the moved bar (-0.13): within the margin.
    reference = {"q": [-2.0, 0.1, 1.9]}
    measured = {"q": [-2.0, -0.3, 1.9]}
    result = gpu_check.compare_judge(reference, measured)
    assert result["passed"] and result["verdict_flips_outside_margin"] == []
    assert result["max_abs_delta_log_odds"] == pytest.approx(0.4)


def test_judge_scores_over_tolerance_or_flipped_far_from_the_bar_fail() -> None:
    over = gpu_check.compare_judge({"q": [-2.0, 0.0, 2.0]}, {"q": [-2.0, 0.0, 2.7]})
    assert not over["passed"] and over["over_tolerance"] == ["q/2"]
    assert over["verdict_flips_outside_margin"] == []
    # Kept 1.0 above the bar on the CPU, dropped below a bar that moved by 0.25 only.
    reference = {"q": [-1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0]}
    measured = {"q": [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, -1.0]}
    flipped = gpu_check.compare_judge(reference, measured)
    assert not flipped["passed"] and flipped["verdict_flips_outside_margin"] == ["q/2"]
    assert flipped["over_tolerance"] == ["q/2"]


def test_same_answers_is_the_share_of_identical_answers() -> None:
    assert gpu_check.same_answers({"a": ["x", "y"], "b": ["z", "w"]},
                                  {"a": ["x", "y!"], "b": ["z", "w"]}) == 0.75


# ----- steps, results JSON, exit code -------------------------------------------------------


def test_a_failed_step_is_recorded_and_the_rest_still_run() -> None:
    ran = []

    def failing() -> dict:
        ran.append("failing")
        raise gpu_check.StepFailed("scores differ", {"max": 0.3})

    def broken() -> dict:
        ran.append("broken")
        raise KeyError("trainer_state.json")

    results = [gpu_check.run_step("first", lambda: {"tokens_per_s": 10.0}),
               gpu_check.run_step("failing", failing), gpu_check.run_step("broken", broken),
               gpu_check.run_step("last", lambda: ran.append("last") or {})]
    assert ran == ["failing", "broken", "last"]
    document = gpu_check.results_document(results, {"model": "tiny"},
                                          ["first", "failing", "broken", "last"])
    assert document["passed"] is False and gpu_check.exit_code(document) == 1
    assert document["failed_steps"] == ["failing", "broken"] and document["not_run"] == []
    steps = document["steps"]
    assert steps["first"]["passed"] and steps["first"]["figures"] == {"tokens_per_s": 10.0}
    assert steps["failing"]["error"] == "scores differ"
    assert steps["failing"]["figures"] == {"max": 0.3}
    assert steps["broken"]["error"].startswith("KeyError: 'trainer_state.json'")
    assert "Traceback" in steps["broken"]["error"]
    assert document["inputs"] == {"model": "tiny"}
    assert document["tolerance"] == {"p_yes": gpu_check.P_YES_TOLERANCE,
                                     "judge_log_odds": gpu_check.JUDGE_LOG_ODDS_TOLERANCE}
    passing = gpu_check.results_document(results[:1], {}, ["first"])
    assert passing["passed"] and gpu_check.exit_code(passing) == 0
    unfinished = gpu_check.results_document(results[:1], {}, ["first", "failing"])
    assert unfinished["not_run"] == ["failing"] and not unfinished["passed"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the check on a machine without CUDA")
def test_without_cuda_every_step_fails_and_says_so(model_dir: Path, adapter_dir: Path,
                                                   reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--model", str(model_dir), "--adapter", str(adapter_dir),
                           "--reference", str(reference), "--out", str(out)]) == 1
    document = json.loads(out.read_text())
    assert document["failed_steps"] == list(gpu_check.STEPS)
    for step in document["steps"].values():
        assert step["error"] == "no CUDA device: torch.cuda.is_available() is False"
    environment = document["steps"]["environment"]["figures"]
    assert environment["cuda_available"] is False and environment["gpu"] is None
    assert environment["torch"] == torch.__version__
    assert environment["versions"]["sieverag"]
    assert document["inputs"]["model"] == model_dir.name
    assert len(document["inputs"]["model_sha256"]) == 64


def test_unknown_step_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--steps", "scores,benchmark"])
    assert "unknown steps benchmark" in capsys.readouterr().err


# ----- the reference, written and met on the CPU --------------------------------------------


def test_write_reference_stores_one_entry_and_a_rerun_writes_the_same_file(
        model_dir: Path, adapter_dir: Path, reference: Path) -> None:
    written = reference.read_bytes()
    (entry,) = json.loads(written)["entries"]
    assert entry["identity"] == gpu_check.inputs_identity(str(model_dir), str(adapter_dir))
    assert (entry["device"], entry["dtype"]) == ("cpu", "float32")
    examples = gpu_check.scored_examples()
    assert sorted(entry["filter_log_odds"]) == sorted(e.id for e in examples)
    assert [len(entry["judge_scores"][e.id]) for e in examples] == \
        [len(e.documents) for e in examples]
    assert gpu_check.main(["--write-reference", "--model", str(model_dir),
                           "--adapter", str(adapter_dir), "--reference", str(reference)]) == 0
    assert reference.read_bytes() == written


def test_a_cpu_rerun_meets_the_reference(model_dir: Path, adapter_dir: Path,
                                         reference: Path) -> None:
    figures = gpu_check.check_scores(str(model_dir), str(adapter_dir), "cpu", reference)
    assert figures["filter"]["passed"] and figures["judge"]["passed"]
    assert figures["filter"]["max_abs_delta_p_yes"] <= 1e-5
    assert figures["judge"]["max_abs_delta_log_odds"] <= 1e-4
    assert figures["judge_same_answers"] == 1.0
    assert figures["filter_chunks_per_s"] > 0 and figures["judge_docs_per_s"] > 0


def test_another_adapter_has_no_reference(model_dir: Path, reference: Path,
                                          tmp_path: Path) -> None:
    other = make_lora_adapter(model_dir, tmp_path / "other", seed=2)
    with pytest.raises(gpu_check.StepFailed, match=r"holds no CPU reference .*other inputs: 1\)"):
        gpu_check.check_scores(str(model_dir), str(other), "cpu", reference)


def test_the_filter_comparison_tells_another_adapter_apart(
        model_dir: Path, adapter_dir: Path, reference: Path, tmp_path: Path) -> None:
    """The tolerance is tight enough to fail a different filter on the tiny model."""
    (entry,) = json.loads(reference.read_text())["entries"]
    other = make_lora_adapter(model_dir, tmp_path / "other", seed=2)
    measured = gpu_check.measure_scores(str(model_dir), str(other), "cpu")
    result = gpu_check.compare_filter(entry["filter_log_odds"], measured["filter_log_odds"])
    assert not result["passed"]
    assert result["max_abs_delta_p_yes"] > 2 * gpu_check.P_YES_TOLERANCE
    spread = [p_relevant(s) for row in entry["filter_log_odds"].values() for s in row]
    assert max(spread) - min(spread) > 0.5  # P(Yes) spans the bar, so verdicts mean something


# ----- the training and serving steps, on the CPU -------------------------------------------


def test_training_step_reports_a_sound_adapter_and_its_throughput(model_dir: Path,
                                                                  tmp_path: Path) -> None:
    # The GPU recipe on the CPU: use_cpu, bf16 autocast only where this CPU has bf16
    # instructions (`sieverag train` refuses it elsewhere), smaller batches to keep it short.
    figures = gpu_check.check_training("cpu", None, str(model_dir), tmp_path, steps=2,
                                       overrides={"use_cpu": True,
                                                  "bf16": Machine.detect().cpu_bf16,
                                                  "per_device_train_batch_size": 4,
                                                  "per_device_eval_batch_size": 8})
    assert figures["steps"] == 2 and figures["processes"] == 1
    assert figures["adapter"]["tensors"] == 2 * 7 * 2  # A and B on 7 projections, 2 layers
    assert figures["adapter"]["file_bytes"] > 0
    assert figures["tokens"] > 0 and figures["tokens_per_s"] > 0
    assert "accelerate_configs/cpu.yaml" in figures["command"]


def test_serving_step_answers_every_concurrent_request(model_dir: Path, adapter_dir: Path,
                                                       tmp_path: Path) -> None:
    figures = gpu_check.check_serving(str(model_dir), str(adapter_dir), "cpu", tmp_path,
                                      requests=8)
    assert figures["scored"] == figures["generated"] == figures["requests"] == 8
    assert figures["scoring_requests_per_s"] > 0 and figures["generation_requests_per_s"] > 0
    assert figures["generated_tokens_per_s"] > 0
    assert "--local.device cpu" in figures["command"]


# ----- the GPU half -------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_scores_on_cuda_meet_the_cpu_reference(model_dir: Path, adapter_dir: Path,
                                               reference: Path) -> None:
    figures = gpu_check.check_scores(str(model_dir), str(adapter_dir), "cuda", reference)
    assert figures["dtype"] == "bfloat16" and figures["device"].startswith("cuda")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("config", "processes"), [("single_gpu", None), ("zero3", 1)])
def test_training_on_cuda_saves_a_sound_adapter(model_dir: Path, tmp_path: Path,
                                                config: str, processes: int | None) -> None:
    figures = gpu_check.check_training(config, processes, str(model_dir), tmp_path,
                                       steps=4)
    assert figures["adapter"]["tensors"] > 0 and figures["bf16"] is True
