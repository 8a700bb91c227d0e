"""Multi-process training on the CPU: DDP, ZeRO-2 and ZeRO-3 in two processes, each against
one process, on a tiny random model.

Every run trains STEPS optimizer steps at the same global batch (GLOBAL_BATCH records: 4 in
one process, 2 per process in two), random sampling with the same seed, no dropout: the same
records meet the same weights in every mode, so only the order of floating-point sums
differs. The one-process run is the reference (in this process, as `accelerate launch` with
cpu.yaml runs it); the two-process runs go through `sieverag train`'s launch plan (the shipped
configs as this CPU-only machine resolves them, and its environment) with tests/observed_sft.py
in place of `-m sieverag.training.sft`, so each rank reports what it saw.

The model is the tests' tiny Llama with MLPs MLP_WIDTH wide and LoRA rank LORA_RANK: DeepSpeed
keeps a tensor of fewer than 1e5 elements whole on every rank under ZeRO-3
(stage3_param_persistence_threshold's default), which is most LoRA tensors; the MLP
projections' rank-64 LoRA tensors (64 x 2048) are sharded, as on a large base, so the save
must gather them.

Tolerances. In float32, a sum split across two ranks and all-reduced rounds differently from
the same sum in one batch, ~1e-7 relative. Adam divides each update by the gradient's own
running scale, so where a gradient element is ~0 that noise can change its update by a
fraction of a step: single LoRA weights differ from the reference by up to ~2e-3 (learning
rate 1e-2), while what the adapter computes barely moves: P(Yes), the filter's score through
the hf backend on chunk prompts, by ~2e-6 at most. P_YES_TOLERANCE = 1e-4 leaves a margin of
~50 and is still 100 times smaller than what the STEPS steps moved P(Yes) from the untrained
base (asserted), so a run that trained on other records, skipped or repeated steps, or lost
its optimizer state on resume fails it by far. The logged loss is the mean over the global
batch's completion tokens in every mode (transformers counts the tokens of all ranks): it
agrees to ~1e-7 relative, LOSS_TOLERANCE = 1e-5.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from observed_sft import launch_observed, p_yes
from repo_paths import REPO
from sft_runs import filter_records
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

ROOT = REPO
RECIPE = ROOT / "training" / "sft" / "recipes" / "smollm2_filter_cpu.yaml"
STEPS = 4
GLOBAL_BATCH = 4
SAVE_AT = 2  # the ZeRO-3 run is killed after this step's checkpoint
MLP_WIDTH = 2048
LORA_RANK = 64
P_YES_TOLERANCE = 1e-4
LOSS_TOLERANCE = 1e-5
LAUNCH_TIMEOUT_S = 600
# What the shipped names launch on a machine without CUDA.
CPU_CONFIGS = {"ddp": "ddp_cpu.yaml", "zero2": "deepspeed_zero2_cpu.yaml",
               "zero3": "deepspeed_zero3_cpu.yaml"}


@dataclass
class Run:
    """One training run: its output folder, and what its ranks reported."""

    out: Path
    losses: dict[int, float]
    ranks: list[dict] = field(default_factory=list)
    output: str = ""
    returncode: int = 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model with MLPs MLP_WIDTH wide."""
    from tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("mp-model"), intermediate_size=MLP_WIDTH)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """18 training records (6 questions: STEPS x GLOBAL_BATCH fit in one epoch), 3 to
    evaluate on."""
    from datasets import Dataset, DatasetDict

    folder = tmp_path_factory.mktemp("mp-data")
    DatasetDict({"train": Dataset.from_list(filter_records("t", 6)),
                 "validation": Dataset.from_list(filter_records("v", 1))}
                ).save_to_disk(folder / "dataset")
    return folder


def recipe_overrides(dataset: Path, model: Path, out: Path, per_device_batch: int) -> dict:
    return {"dataset_path": dataset, "model_name_or_path": model, "output_dir": out,
            "max_steps": STEPS, "per_device_train_batch_size": per_device_batch,
            "gradient_accumulation_steps": 1, "per_device_eval_batch_size": 3,
            "learning_rate": 1e-2, "warmup_steps": 0, "lora_r": LORA_RANK,
            "lora_alpha": 2 * LORA_RANK, "lora_dropout": 0, "train_sampling_strategy": "random",
            "eval_strategy": "steps", "eval_steps": STEPS, "save_strategy": "steps",
            "save_steps": SAVE_AT, "logging_steps": 1, "report_to": "none",
            "disable_tqdm": True, "seed": 0}


@pytest.fixture(scope="module")
def reference(dataset: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Run:
    """The one-process run, in this process (on the CPU, as the launches are)."""
    from transformers import TrainerCallback

    from sieverag.training.sft.recipe import parse_recipe
    from sieverag.training.sft.trainer import train

    class Losses(TrainerCallback):
        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, D102
            if logs and "loss" in logs:
                self.losses[state.global_step] = logs["loss"]

    out = tmp_path_factory.mktemp("mp-reference") / "run"
    values = {**recipe_overrides(dataset, model_dir, out, GLOBAL_BATCH), "use_cpu": True}
    losses = Losses()
    train(parse_recipe(["--config", str(RECIPE)]
                       + [a for k, v in values.items() for a in (f"--{k}", str(v))]),
          callbacks=[losses])
    return Run(out, losses.losses)


def launch(name: str, dataset: Path, model: Path, out: Path, *observer_flags: str,
           overrides: dict | None = None, env: dict | None = None) -> Run:
    """Two processes under the shipped config `name`, as `sieverag train` launches them."""
    from sieverag.training.cli.train import TrainCommand, plan_launch
    from sieverag.training.sft.launch import Machine

    values = {**recipe_overrides(dataset, model, out, GLOBAL_BATCH // 2), **(overrides or {})}
    # As on a machine without CUDA (here it is one; a CPU config hides any GPU).
    cpu_only = replace(Machine.detect(), cuda_devices=0)
    plan = plan_launch(TrainCommand(recipe=str(RECIPE), accelerate_config=name,
                                    num_processes=2, overrides=values), cpu_only)
    assert plan.config.path.name == CPU_CONFIGS[name] and plan.processes == 2
    assert plan.effective_batch == GLOBAL_BATCH
    done, ranks = launch_observed(plan, out.parent / f"{out.name}-ranks", *observer_flags,
                                  env=env, timeout_s=LAUNCH_TIMEOUT_S)
    losses = {int(step): loss for r in ranks for step, loss in r["losses"].items()}
    return Run(out, losses, ranks, done.stdout + done.stderr, done.returncode)


def succeeded(run: Run) -> Run:
    assert run.returncode == 0, run.output[-4000:]
    assert [r["rank"] for r in run.ranks] == [0, 1], run.output[-4000:]
    return run


def chunk_prompts() -> list:
    from sieverag.inference.filters.filter_format import chunk_prompt

    return [chunk_prompt(f"Who founded the company {name}?", text)
            for name in ("t0", "v0", "z9")
            for text in (f"Company {name} was founded by Ada Byron.",
                         "Bananas are a yellow fruit grown in warm places.")]


@functools.cache
def scores(model: Path, adapter: Path | None) -> tuple[float, ...]:
    """P(Yes) on `chunk_prompts` (the reference's and the base's are asked for often)."""
    return tuple(p_yes(model, adapter, chunk_prompts()))


def assert_same_adapter(adapter: Path, reference: Path, model: Path, mode: str) -> float:
    """The adapter is sound (non-empty, reloads with PEFT) and scores as the reference does;
    returns the largest P(Yes) difference."""
    from safetensors.torch import load_file

    from sieverag.inference.filters.adapter_files import WEIGHTS_FILE
    from sieverag.training.sft.adapter import verify_adapter

    check = verify_adapter(adapter, model)
    assert check.tensors == verify_adapter(reference, model).tensors
    ours, theirs, base = scores(model, adapter), scores(model, reference), scores(model, None)
    difference = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
    trained = max(abs(a - b) for a, b in zip(theirs, base, strict=True))
    weights, reference_weights = load_file(adapter / WEIGHTS_FILE), \
        load_file(reference / WEIGHTS_FILE)
    weight_difference = max((weights[k] - reference_weights[k]).abs().max().item()
                            for k in reference_weights)
    print(f"{mode}: max |P(Yes) - reference| = {difference:.2e} (training moved it by "
          f"{trained:.3f}); LoRA weights differ by {weight_difference:.2e} at most")
    assert trained > 100 * P_YES_TOLERANCE, trained
    assert difference <= P_YES_TOLERANCE, (ours, theirs)
    return difference


def assert_same_losses(run: Run, reference: Run, mode: str) -> None:
    assert sorted(run.losses) == sorted(reference.losses) == list(range(1, STEPS + 1))
    for step, loss in reference.losses.items():
        assert run.losses[step] == pytest.approx(loss, rel=LOSS_TOLERANCE), (step, run.losses)
    print(f"{mode}: final loss {run.losses[STEPS]:.6f} vs {reference.losses[STEPS]:.6f} "
          f"(difference {abs(run.losses[STEPS] - reference.losses[STEPS]):.2e})")


def read_card(out: Path) -> dict:
    from sieverag.inference.filters.card.card_file import CARD_FILE

    return json.loads((out / CARD_FILE).read_text(encoding="utf-8"))


def assert_rank_zero_wrote_once(run: Run, logged_steps: int = STEPS) -> None:
    """Rank 0 alone wrote the card and printed the step logs and the adapter line."""
    assert [r["card_writes"] for r in run.ranks] == [1, 0]
    assert run.output.count("'loss':") == logged_steps, run.output[-4000:]
    assert run.output.count("\nadapter filter-") == 1, run.output[-4000:]


def assert_batch_accounting(run: Run) -> None:
    """Every rank counted both processes; the card records the global batch."""
    assert [(r["world_size"], r["train_batch_size"]) for r in run.ranks] == \
        [(2, GLOBAL_BATCH)] * 2
    card = read_card(run.out)
    assert (card["recipe"]["processes"], card["recipe"]["effective_batch"]) == (2, GLOBAL_BATCH)
    assert card["metrics"]["global_step"] == STEPS


def test_one_process_reference_is_a_sound_trained_adapter(reference: Run,
                                                          model_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sieverag.training.sft.adapter import verify_adapter

    assert verify_adapter(reference.out, model_dir).parameters > 0
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                              reference.out)
    card = read_card(reference.out)
    assert (card["recipe"]["processes"], card["recipe"]["effective_batch"]) == (1, GLOBAL_BATCH)
    assert sorted(reference.losses) == list(range(1, STEPS + 1))


def test_ddp_two_processes_equal_one_and_only_rank_zero_reports(
        dataset: Path, model_dir: Path, reference: Run, tmp_path: Path) -> None:
    """DDP (multi_gpu.yaml's launch, ddp_cpu.yaml here), reporting to wandb offline."""
    wandb_dir = tmp_path / "wandb-home"
    env = {"WANDB_MODE": "offline", "WANDB_PROJECT": "sieverag-test",
           "WANDB_DISABLE_GIT": "true", "WANDB_X_DISABLE_STATS": "true"}
    for name, folder in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"),
                         ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data"),
                         ("WANDB_ARTIFACT_DIR", "artifacts")):
        (wandb_dir / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(wandb_dir / folder)
    run = succeeded(launch("ddp", dataset, model_dir, tmp_path / "run",
                           overrides={"report_to": "wandb"}, env=env))
    assert_batch_accounting(run)
    assert_same_losses(run, reference, "ddp")
    assert_same_adapter(run.out, reference.out, model_dir, "ddp")
    assert_rank_zero_wrote_once(run)
    assert [r["wandb_run"] for r in run.ranks] == [True, False]
    runs = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, sorted(p.name for p in wandb_dir.rglob("*"))


def test_zero2_two_processes_equal_one(dataset: Path, model_dir: Path, reference: Run,
                                       tmp_path: Path) -> None:
    run = succeeded(launch("zero2", dataset, model_dir, tmp_path / "run"))
    assert_batch_accounting(run)
    assert_same_adapter(run.out, reference.out, model_dir, "zero2")
    assert_same_losses(run, reference, "zero2")
    assert_rank_zero_wrote_once(run)
    assert [r["zero3_gathers"] for r in run.ranks] == [0, 0]
    # DeepSpeed compiled nothing (its CPU shared-memory all-reduce is not needed to train).
    assert not list(Path(os.environ["TORCH_EXTENSIONS_DIR"]).glob("*/deepspeed_shm_comm*"))


def test_zero3_killed_after_a_checkpoint_resumes_to_the_same_adapter(
        dataset: Path, model_dir: Path, reference: Run, tmp_path: Path) -> None:
    """ZeRO-3, killed once the checkpoint of step SAVE_AT is written, then rerun: it resumes
    there and ends with the one-process adapter; its save gathered the sharded weights, and a
    save without the gather is refused by the adapter check."""
    from sieverag.training.sft.adapter import AdapterSaveError, verify_adapter

    out = tmp_path / "run"
    killed = launch("zero3", dataset, model_dir, out, "--kill-after-save", str(SAVE_AT))
    assert killed.returncode != 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{SAVE_AT}"]
    assert not (out / "adapter_model.safetensors").exists()  # the run did not finish
    assert sorted(killed.losses) == list(range(1, SAVE_AT + 1))
    assert_same_adapter(out / f"checkpoint-{SAVE_AT}", reference.out / f"checkpoint-{SAVE_AT}",
                        model_dir, f"zero3 checkpoint-{SAVE_AT}")

    unsafe = tmp_path / "saved-without-gather"
    resumed = succeeded(launch("zero3", dataset, model_dir, out,
                               "--unsafe-save-dir", str(unsafe)))
    card = read_card(out)
    assert card["recipe"]["resumed_from"] == str(out / f"checkpoint-{SAVE_AT}")
    assert sorted(resumed.losses) == list(range(SAVE_AT + 1, STEPS + 1))
    assert_batch_accounting(resumed)
    assert_same_adapter(out, reference.out, model_dir, "zero3 (resumed)")
    assert_same_losses(Run(out, {**killed.losses, **resumed.losses}), reference, "zero3")
    assert_rank_zero_wrote_once(resumed, logged_steps=STEPS - SAVE_AT)
    # Both ranks joined DeepSpeed's 16-bit gather on every save (checkpoint and final).
    gathers = [r["zero3_gathers"] for r in resumed.ranks]
    assert gathers[0] == gathers[1] >= 2, gathers
    with pytest.raises(AdapterSaveError, match="is empty"):
        verify_adapter(unsafe, model_dir)
