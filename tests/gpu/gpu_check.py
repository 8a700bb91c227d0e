"""sieverag's GPU paths, checked on one GPU machine in a few minutes; one JSON of the results.

On the GPU machine, after the wheels from tests/gpu/prepare_wheels.sh are installed (as
tests/gpu/gpu_check.sh does):

    python3 tests/gpu/gpu_check.py --out $OUT/gpu_check.json [--steps scores,serve]

Here, on the CPU, whenever the model, the adapter or a prompt template changes:

    python tests/gpu/gpu_check.py --write-reference

The model is the tests' tiny random model (2 layers, SmolLM2's tokenizer, stored in bf16) with
a random LoRA adapter, made in .gpu_check/ by --write-reference when absent: SmolLM2's 98 MB
file cannot travel to the GPU machine in one call (64 MiB). `--model`/`--adapter` take
another one (the JSON names the model used); its CPU reference must be written first.

Steps, run in this order; each is recorded as passed or failed with its figures or its
error, a failed one does not stop the others, and the exit code is 1 when any failed:

  environment       torch, CUDA, the GPU's name, package versions, `pip check`
  train_single_gpu  `sieverag train --recipe smollm2_filter_gpu --accelerate-config single_gpu`
                    (bf16) for TRAIN_STEPS steps on HotpotQA sample records; the saved adapter
                    must be non-empty and reload with PEFT; training tokens/s
  train_zero3       the same under DeepSpeed ZeRO-3 in one process (`--accelerate-config zero3
                    --num-processes 1`: deepspeed_zero3.yaml, zero3_save_16bit_model, with
                    accelerate's --num_processes 1), where a LoRA adapter is saved empty unless
                    the sharded weights are gathered
  train_8b_recipes  the 8B recipes' code path: `--recipe llama3_8b_filter_zero3` on a tiny
                    Llama-3 base without a chat template (sieverag's fallback) and
                    `--recipe qwen2_5_7b_filter_zero3` on a tiny Qwen2 with its own, each under
                    ZeRO-3 in one process for RECIPE_STEPS steps: bf16, flash_attention_2 or
                    sdpa as installed (the card says which), padding-free packed batches,
                    activation checkpointing; the models are made on the machine from the
                    tiny model's tokenizer (nothing more to carry)
  scores            the filter's chunk scores (MCF's) and the MAIN-RAG judge's on CUDA (bf16)
                    against tests/gpu/cpu_reference.json (float32 on the CPU); filter chunks/s
                    and judge docs/s
  serve             `sieverag serve --engine local --local.device cuda`: SERVED_REQUESTS
                    concurrent scoring requests as the filter sends them (chat completions,
                    max_tokens 1, logprobs), then as many generation requests; requests/s

Tolerance, bf16 on the GPU against float32 on the CPU. bf16 keeps 8 significant bits, so
every score moves a little; measured on the CPU (bf16 against float32 on the same inputs), on
SmolLM2 with the shipped filter the filter's P(Yes) moved by 0.026 at most (s by 0.18 nats) and
the judge's r by 0.19 nats at most (median 0.09); on the check's tiny model, by 0.013 and 0.05.
The GPU's kernels differ again (fused attention, other reduction orders), hence two to three
times the largest measured difference:
  * filter: |ΔP(Yes)| <= P_YES_TOLERANCE (0.05) on every chunk, P(Yes) = logistic(s). A
    fixed-bar verdict (P(Yes) >= 0.5, MCF's `fixed` bar) may flip only for a chunk whose CPU
    P(Yes) is within the tolerance of 0.5.
  * judge: |Δr| <= JUDGE_LOG_ODDS_TOLERANCE (0.5 nats) on every document, scored on the CPU's
    Agent-1 answers: greedy answers part at a near-tie under bf16, after which the whole answer
    differs (22 % of SmolLM2's), so their agreement is reported, not judged. A keep/drop
    verdict (r >= τ = mean(r)) may flip only for a document within the tolerance plus the
    bar's own move of its CPU bar.
A wrong model fails by far: another random adapter on the tiny model moves P(Yes) by up to
0.76.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "benchmarks")]  # tiny_model, tiny_adapter, bench_train

from sieverag.inference.core.io_utils import write_atomic  # noqa: E402
from sieverag.inference.core.prompt_templates import load_template  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.filters.adapter_files import weights_sha256  # noqa: E402
from sieverag.inference.filters.adapter_store import resolve_filter  # noqa: E402
from sieverag.inference.filters.filter_format import (  # noqa: E402
    CHUNK_LABELS,
    CHUNK_TEMPLATE,
    chunk_prompt,
    p_relevant,
)
from sieverag.inference.filters.judge import MainRagJudge, judge_bar  # noqa: E402
from sieverag.inference.filters.mcf import MultiGranularFilter  # noqa: E402
from sieverag.inference.llm.backend_protocol import GenerationSettings  # noqa: E402
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import resolve_model  # noqa: E402
from sieverag.training.sft.trainer import package_versions  # noqa: E402

ROOT = TESTS.parent
CARRIED = ROOT / ".gpu_check"  # git-ignored; travels to the GPU machine in `carry`
TINY_MODEL = CARRIED / "tiny-llama"
TINY_ADAPTER = CARRIED / "tiny-lora"
# The tiny model's weight scale. At the tests' 0.02 its P(Yes) stays within 0.48-0.56 and
# the judge's scores within 0.1 of each other, too flat for a comparison to tell much; at 0.15
# P(Yes) spans 0.07-0.94 and float32 -> bf16 on the CPU moves it by 0.013 at most (at 0.2,
# by 0.044: a random network's rounding errors grow with its weights).
TINY_INIT_STD = 0.15
REFERENCE = Path(__file__).with_name("cpu_reference.json")
SCORED_DATASET = TESTS / "data" / "hotpotqa_heldout_sample.jsonl"  # 5 questions x 10 passages
TRAINING_DATASET = TESTS / "data" / "hotpotqa_sample.jsonl"
STEPS = ("environment", "train_single_gpu", "train_zero3", "train_8b_recipes", "scores",
         "serve")

P_YES_TOLERANCE = 0.05
JUDGE_LOG_ODDS_TOLERANCE = 0.5
TRAIN_STEPS = 30
RECIPE_STEPS = 10
# The 8B recipes' step: architecture → (recipe, whether its tiny model has a chat template).
RECIPE_PATHS = {"llama3": ("llama3_8b_filter_zero3", False),
                "qwen2": ("qwen2_5_7b_filter_zero3", True)}
SERVED_REQUESTS = 100
SERVED_FILTER = "filter"
GENERATED_TOKENS = 32
TRAIN_TIMEOUT_S = 180
SERVER_START_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 120
# The versions recorded besides the training stack's (`package_versions`' default).
OTHER_PACKAGES = ("sieverag", "datasets", "fastapi", "uvicorn", "pydantic", "httpx")
# Scores by question id, one per document in the dataset's order.
Scores = Mapping[str, Sequence[float]]
# The adapter config fields that change its outputs along with its weights.
LORA_FIELDS = ("r", "lora_alpha", "use_rslora", "target_modules")


class StepFailed(Exception):
    """A step's check did not hold; the message says which, `figures` what was measured."""

    def __init__(self, message: str, figures: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = dict(figures or {})


@dataclass
class StepResult:
    """One step's outcome as the JSON records it."""

    name: str
    passed: bool
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


# ----- running steps and assembling the results --------------------------------------------


def run_step(name: str, step: Callable[[], dict[str, Any]]) -> StepResult:
    """Run one step; any exception fails it (recorded with its message and, for an
    unexpected one, the traceback's end) without stopping the steps after it."""
    started = time.perf_counter()
    try:
        figures = step()
    except StepFailed as err:
        return StepResult(name, False, _since(started), err.figures, str(err))
    except Exception as err:  # recorded in the JSON: a failing step must not stop the check
        tail = "".join(traceback.format_exception(err)[-6:])
        return StepResult(name, False, _since(started), {}, f"{type(err).__name__}: {err}\n{tail}")
    return StepResult(name, True, _since(started), figures)


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 2)


def results_document(results: Sequence[StepResult], inputs: Mapping[str, Any],
                     planned: Sequence[str]) -> dict[str, Any]:
    """The check's JSON: overall verdict, the failed steps and the planned ones not run (yet),
    the inputs, the tolerances, then every step run."""
    failed = [r.name for r in results if not r.passed]
    not_run = [name for name in planned if name not in {r.name for r in results}]
    return {"passed": not failed and not not_run, "failed_steps": failed, "not_run": not_run,
            "inputs": dict(inputs),
            "tolerance": {"p_yes": P_YES_TOLERANCE, "judge_log_odds": JUDGE_LOG_ODDS_TOLERANCE},
            "steps": {r.name: {k: v for k, v in asdict(r).items() if k != "name"}
                      for r in results}}


def exit_code(document: Mapping[str, Any]) -> int:
    """0 when every step passed, else 1."""
    return 0 if document["passed"] else 1


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise StepFailed("no CUDA device: torch.cuda.is_available() is False")


# ----- inputs: the model, the adapter, and what identifies them ----------------------------


def make_tiny_inputs(model_dir: Path = TINY_MODEL, adapter_dir: Path = TINY_ADAPTER) -> None:
    """The tiny model (bf16 weights: the GPU runs them exactly) and a random LoRA on it."""
    from tiny_adapter import make_lora_adapter
    from tiny_model import save_tiny_model

    save_tiny_model(model_dir, dtype="bfloat16", initializer_range=TINY_INIT_STD)
    make_lora_adapter(model_dir, adapter_dir)


def inputs_identity(model: str, adapter: str, dataset: Path = SCORED_DATASET) -> dict[str, Any]:
    """What the scores depend on, by content (no paths): the base weights, the adapter's
    weights and LoRA settings, the prompt templates, the scored questions."""
    adapter_config = json.loads((Path(adapter) / "adapter_config.json").read_text("utf-8"))
    settings = {k: adapter_config.get(k) for k in LORA_FIELDS}
    if isinstance(settings["target_modules"], list):
        settings["target_modules"] = sorted(settings["target_modules"])
    return {
        "model_sha256": weights_sha256(resolve_model(model)),
        "adapter_sha256": weights_sha256(adapter),
        "adapter_settings": settings,
        "templates": {name: load_template(name).sha256
                      for name in (CHUNK_TEMPLATE, "judge_predictor", "judge_evaluator")},
        "dataset_sha256": hashlib.sha256(dataset.read_bytes()).hexdigest(),
    }


def scored_examples(dataset: Path = SCORED_DATASET) -> list[Example]:
    return load_examples(dataset)


# ----- scores: the filter and the judge on one device --------------------------------------


def measure_scores(model: str, adapter: str, device: str,
                   answers: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The filter's s = log P("Yes") − log P("No") per chunk (MCF's `chunk_scores`), Agent-1's
    answers and Agent-2's r per document (on `answers` where given, else on its own), by
    question id; and filter chunks/s and judge docs/s (Agent-1 + Agent-2) after a warm-up."""
    examples = scored_examples()
    filter_backend = HFBackend(HFBackendConfig(model=model, adapter=adapter, device=device))
    mcf = MultiGranularFilter(filter_backend)
    judge = MainRagJudge(HFBackend(HFBackendConfig(model=model, device=device)))
    warm = examples[0]
    mcf.chunk_scores(warm.question, warm.documents)
    judge.judge_scores(warm.question, warm.documents,
                       judge.predict_answers(warm.question, warm.documents))
    documents = sum(len(e.documents) for e in examples)

    started = time.perf_counter()
    log_odds = {e.id: [s["score"] for s in mcf.chunk_scores(e.question, e.documents)]
                for e in examples}
    filter_seconds = time.perf_counter() - started
    started = time.perf_counter()
    own_answers = {e.id: judge.predict_answers(e.question, e.documents) for e in examples}
    own_scores = {e.id: judge.judge_scores(e.question, e.documents, own_answers[e.id])
                  for e in examples}
    judge_seconds = time.perf_counter() - started
    scores = own_scores if answers is None else {
        e.id: judge.judge_scores(e.question, e.documents, answers[e.id]) for e in examples}
    return {
        "device": str(filter_backend.device),
        "dtype": str(next(filter_backend.model.parameters()).dtype).removeprefix("torch."),
        "filter_log_odds": _rounded(log_odds),
        "judge_answers": own_answers,
        "judge_scores": _rounded(scores),
        "filter_chunks_per_s": round(documents / filter_seconds, 1),
        "judge_docs_per_s": round(documents / judge_seconds, 1),
    }


def _rounded(values: Scores) -> dict[str, list[float]]:
    return {key: [round(v, 6) for v in row] for key, row in values.items()}


def compare_filter(reference: Scores, measured: Scores,
                   tolerance: float = P_YES_TOLERANCE) -> dict[str, Any]:
    """Each chunk's P(Yes) = logistic(s) against the reference's: the largest difference,
    the chunks over `tolerance`, and the fixed-bar verdicts (P(Yes) >= 0.5) that flipped
    although the reference's P(Yes) is more than `tolerance` from 0.5."""
    deltas, over, flips = [], [], []
    for key, expected in reference.items():
        for index, (s_ref, s_got) in enumerate(zip(expected, measured[key], strict=True)):
            p_ref, p_got = p_relevant(s_ref), p_relevant(s_got)
            deltas.append(abs(p_got - p_ref))
            if deltas[-1] > tolerance:
                over.append(f"{key}/{index}")
            if (p_ref >= 0.5) != (p_got >= 0.5) and abs(p_ref - 0.5) > tolerance:
                flips.append(f"{key}/{index}")
    return {"chunks": len(deltas), "max_abs_delta_p_yes": round(max(deltas), 6),
            "over_tolerance": over, "verdict_flips_outside_margin": flips,
            "passed": not over and not flips}


def compare_judge(reference: Scores, measured: Scores,
                  tolerance: float = JUDGE_LOG_ODDS_TOLERANCE) -> dict[str, Any]:
    """Each document's r against the reference's: the largest difference, the documents over
    `tolerance`, and the keep/drop verdicts (r >= τ = mean(r) of the question) that flipped
    although the reference's r is farther from its bar than `tolerance` plus the bar's move."""
    deltas, over, flips = [], [], []
    for key, expected in reference.items():
        got = measured[key]
        bar_ref, bar_got = judge_bar(expected, 0.0), judge_bar(got, 0.0)
        margin = tolerance + abs(bar_got - bar_ref)
        for index, (r_ref, r_got) in enumerate(zip(expected, got, strict=True)):
            deltas.append(abs(r_got - r_ref))
            if deltas[-1] > tolerance:
                over.append(f"{key}/{index}")
            if (r_ref >= bar_ref) != (r_got >= bar_got) and abs(r_ref - bar_ref) > margin:
                flips.append(f"{key}/{index}")
    return {"documents": len(deltas), "max_abs_delta_log_odds": round(max(deltas), 6),
            "over_tolerance": over, "verdict_flips_outside_margin": flips,
            "passed": not over and not flips}


def same_answers(reference: Mapping[str, Sequence[str]],
                 measured: Mapping[str, Sequence[str]]) -> float:
    """The share of Agent-1 answers identical to the reference's."""
    pairs = [(a, b) for key in reference for a, b in zip(reference[key], measured[key],
                                                          strict=True)]
    return round(sum(a == b for a, b in pairs) / len(pairs), 4)


def read_reference(path: Path, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The reference entry written for `identity`; `StepFailed` naming what to do if none."""
    entries = json.loads(path.read_text("utf-8"))["entries"] if path.is_file() else []
    for entry in entries:
        if entry["identity"] == identity:
            return entry
    raise StepFailed(f"{path} holds no CPU reference for this model, adapter, prompts and "
                     f"questions (entries for other inputs: {len(entries)}): run `python "
                     "tests/gpu/gpu_check.py --write-reference` with the same --model/--adapter "
                     "on a CPU machine and carry the result", {"identity": dict(identity)})


def write_reference(model: str, adapter: str, path: Path = REFERENCE) -> dict[str, Any]:
    """Measure on the CPU in float32 and store the entry for these inputs in `path` (other
    inputs' entries kept). Throughput is left out, so a rerun writes the same file."""
    identity = inputs_identity(model, adapter)
    measured = measure_scores(model, adapter, "cpu")
    entry = {"identity": identity, "model": Path(model).name, "adapter": Path(adapter).name,
             "device": measured["device"], "dtype": measured["dtype"],
             "versions": package_versions(("torch", "transformers", "peft")),
             **{k: measured[k] for k in ("filter_log_odds", "judge_answers", "judge_scores")}}
    entries = json.loads(path.read_text("utf-8"))["entries"] if path.is_file() else []
    entries = [e for e in entries if e["identity"] != identity] + [entry]
    write_atomic(path, json.dumps({"entries": entries}, indent=1) + "\n")
    return entry


def check_scores(model: str, adapter: str, device: str, reference: Path = REFERENCE,
                 ) -> dict[str, Any]:
    """The scores on `device` compared with the CPU reference at the tolerances above."""
    expected = read_reference(reference, inputs_identity(model, adapter))
    measured = measure_scores(model, adapter, device, answers=expected["judge_answers"])
    figures = {
        "device": measured["device"], "dtype": measured["dtype"],
        "filter": compare_filter(expected["filter_log_odds"], measured["filter_log_odds"]),
        "judge": compare_judge(expected["judge_scores"], measured["judge_scores"]),
        "judge_same_answers": same_answers(expected["judge_answers"], measured["judge_answers"]),
        "filter_chunks_per_s": measured["filter_chunks_per_s"],
        "judge_docs_per_s": measured["judge_docs_per_s"],
    }
    failed = [part for part in ("filter", "judge") if not figures[part]["passed"]]
    if failed:
        raise StepFailed(f"{' and '.join(failed)} scores on {device} differ from the CPU "
                         "reference beyond the tolerance", figures)
    return figures


# ----- training -----------------------------------------------------------------------------


def train_command(accelerate_config: str, num_processes: int | None, model: str, dataset: Path,
                  output_dir: Path, steps: int = TRAIN_STEPS,
                  overrides: Mapping[str, Any] | None = None,
                  recipe: str = "smollm2_filter_gpu") -> list[str]:
    """`sieverag train`'s launch line for `recipe` (default: the GPU recipe) on `model`,
    `steps` steps, logging every step and saving at the end (other recipe `overrides` after
    these). Like `sieverag train`, it checks the recipe first, which needs a bf16-capable GPU."""
    from sieverag.training.cli.train import TrainCommand, launch_command

    return launch_command(TrainCommand(
        recipe=recipe, accelerate_config=accelerate_config,
        num_processes=num_processes,
        overrides={"model_name_or_path": model, "dataset_path": dataset,
                   "output_dir": output_dir, "max_steps": steps, "save_steps": steps,
                   "eval_steps": steps, "logging_steps": 1, "report_to": "none",
                   "disable_tqdm": True, **(overrides or {})}))


def training_dataset(workdir: Path) -> Path:
    """Gold-labelled filter records of the HotpotQA sample (bench_train's), built once."""
    from bench_train import build_records

    folder = workdir / "training-data"
    if not (folder / "dataset").is_dir():
        build_records(TRAINING_DATASET, 2, folder)
    return folder


def training_figures(output_dir: Path, model: str) -> dict[str, Any]:
    """The adapter check (non-empty, reloads with PEFT onto the base) and the run's figures:
    tokens/s over the whole run, the first step's warm-up included."""
    from sieverag.training.sft.adapter import verify_adapter

    check = verify_adapter(output_dir, resolve_model(model))
    card = json.loads((output_dir / "sieverag_adapter.json").read_text("utf-8"))
    metrics = card["metrics"]
    step = metrics["global_step"]
    state = json.loads((output_dir / f"checkpoint-{step}" / "trainer_state.json").read_text(
        "utf-8"))
    tokens = max(entry.get("num_tokens", 0) for entry in state["log_history"])
    training = card["recipe"]["training"]
    return {"adapter": asdict(check), "steps": step, "train_loss": metrics.get("train_loss"),
            "eval_loss": metrics.get("eval_loss"), "train_seconds": metrics["train_runtime"],
            "tokens": tokens, "tokens_per_s": round(tokens / metrics["train_runtime"], 1),
            "processes": card["recipe"]["processes"], "bf16": training["bf16"],
            "packing": training.get("packing"), "chat_template": card["chat_template"]["name"],
            "model_init_kwargs": card["recipe"]["model_init_kwargs"]}


def check_training(accelerate_config: str, num_processes: int | None, model: str,
                   workdir: Path, steps: int = TRAIN_STEPS,
                   overrides: Mapping[str, Any] | None = None,
                   recipe: str = "smollm2_filter_gpu") -> dict[str, Any]:
    """Train `recipe` under `accelerate_config` in a subprocess and check what it saved."""
    output_dir = workdir / f"train-{recipe}-{accelerate_config}"
    argv = train_command(accelerate_config, num_processes, model, training_dataset(workdir),
                         output_dir, steps, overrides, recipe)
    command = {"command": " ".join(argv)}
    returncode, output = run_bounded(argv, workdir, TRAIN_TIMEOUT_S)
    if returncode != 0:
        raise StepFailed(f"training exited with {returncode}: {output[-3000:]}", command)
    return {**command, **training_figures(output_dir, model)}


def run_bounded(argv: Sequence[str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run `argv` in a process group of its own; past `timeout_s` the whole group is killed
    (accelerate's launcher leaves its workers behind otherwise, holding the GPU)."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise StepFailed(f"still running after {timeout_s} s, killed: {output[-3000:]}",
                         {"command": " ".join(argv)}) from None
    return process.returncode, output


def check_recipe_path(architecture: str, workdir: Path, accelerate_config: str = "zero3",
                      steps: int = RECIPE_STEPS, overrides: Mapping[str, Any] | None = None,
                      tokenizer_from: Path = TINY_MODEL) -> dict[str, Any]:
    """One 8B recipe (RECIPE_PATHS) on a tiny model of its architecture, made here, in one
    process: the adapter is sound, and the card says the recipe reached the model (its
    dtype, an attention kernel that keeps packed records apart, packed batches, the chat
    template: the tokenizer's own, else the fallback)."""
    from tiny_model import save_tiny_architecture

    from sieverag.inference.llm.chat_template import FALLBACK_TEMPLATE, TOKENIZER_TEMPLATE

    recipe, template = RECIPE_PATHS[architecture]
    model = workdir / f"tiny-{architecture}"
    if not model.is_dir():
        save_tiny_architecture(model, architecture, template, tokenizer_from=tokenizer_from)
    figures = check_training(accelerate_config, 1, str(model), workdir, steps,
                             {"per_device_train_batch_size": 2, "per_device_eval_batch_size": 4,
                              "max_eval_examples": 8, **(overrides or {})}, recipe)
    loaded = figures["model_init_kwargs"]
    expected = {"packing": True, "chat_template": TOKENIZER_TEMPLATE if template
                else FALLBACK_TEMPLATE, "padding-free attention": True}
    found = {"packing": figures["packing"], "chat_template": figures["chat_template"],
             "padding-free attention": loaded.get("attn_implementation") in (
                 "sdpa", "flash_attention_2")}
    if found != expected:
        raise StepFailed(f"{recipe} did not reach the model: {found} (expected {expected})",
                         figures)
    return figures


def check_8b_recipes(workdir: Path) -> dict[str, Any]:
    """`check_recipe_path` for each architecture in RECIPE_PATHS, bf16 on the GPU."""
    figures = {}
    for architecture in RECIPE_PATHS:
        figures[architecture] = check_recipe_path(architecture, workdir)
        if figures[architecture]["model_init_kwargs"].get("dtype") != "bfloat16":
            raise StepFailed(f"{architecture}: the base was not loaded in bf16", figures)
    return figures


# ----- serving ------------------------------------------------------------------------------


def serve_command(model: str, adapter: str, port: int, device: str) -> list[str]:
    """`sieverag serve` on the embedded server: `model` with `adapter` as SERVED_FILTER."""
    return [sys.executable, "-m", "sieverag", "serve", "--engine", "local", "--model", model,
            "--adapters", f"{SERVED_FILTER}={adapter}", "--port", str(port),
            "--local.device", device, "--no-local.access-log"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(argv: Sequence[str], port: int, log: Path) -> Iterator[str]:
    """Start `argv`, wait for /health, yield the base URL (…/v1); stop it afterwards."""
    import httpx

    with log.open("w") as log_file:
        process = subprocess.Popen(argv, cwd=log.parent, stdout=log_file,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise StepFailed(f"the server exited with {process.returncode}: "
                                 f"{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise StepFailed(f"the server did not answer /health within "
                                 f"{SERVER_START_TIMEOUT_S} s: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def served_requests(examples: Sequence[Example], count: int) -> tuple[list, list]:
    """`count` filter chunk prompts and `count` Agent-1 prompts, every question paired with
    every passage in turn, so no two requests are alike."""
    predictor = load_template("judge_predictor")
    pairs = [(e.question, d) for d in (d for x in examples for d in x.documents)
             for e in examples][:count]
    if len(pairs) < count:
        raise ValueError(f"only {len(pairs)} distinct (question, passage) pairs for {count} "
                         "requests")
    return ([chunk_prompt(question, d.text, d.title) for question, d in pairs],
            [predictor.messages(question=question, document=d.as_context())
             for question, d in pairs])


def check_serving(model: str, adapter: str, device: str, workdir: Path,
                  requests: int = SERVED_REQUESTS) -> dict[str, Any]:
    """The embedded server on `device` under `requests` concurrent scoring requests, then as
    many concurrent generation requests (GENERATED_TOKENS tokens each), sent by the openai
    backend as the filter and the generator send them; requests/s of each."""
    from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

    scoring, generation = served_requests(scored_examples(), requests)
    port = free_port()
    argv = serve_command(model, adapter, port, device)
    figures: dict[str, Any] = {"command": " ".join(argv), "requests": requests}
    with running_server(argv, port, workdir / "serve.log") as base_url:
        def client(name: str) -> OpenAIBackend:
            # The tiny random model ranks "Yes" and "No" outside its top 20: a floor keeps one
            # request per chunk, as a trained filter's scoring sends (exact scores would add
            # one more per label).
            return OpenAIBackend(OpenAIBackendConfig(
                base_url=base_url, model=name, max_concurrency=requests,
                timeout_s=REQUEST_TIMEOUT_S, max_retries=0, missing_label_logprob="topk_min"))

        with client(SERVED_FILTER) as scorer, client(model) as generator:
            scorer.label_logprobs(scoring[:2], CHUNK_LABELS)  # warm-up
            started = time.perf_counter()
            scores = scorer.label_logprobs(scoring, CHUNK_LABELS, agent="filter_chunk")
            figures["scoring_requests_per_s"] = round(requests / (time.perf_counter() - started),
                                                      1)
            started = time.perf_counter()
            replies = generator.generate(generation, GenerationSettings(
                max_new_tokens=GENERATED_TOKENS), agent="generator")
            seconds = time.perf_counter() - started
            tokens = generator.meter.by_agent["generator"].completion_tokens
    figures.update(generation_requests_per_s=round(requests / seconds, 1),
                   generated_tokens_per_s=round(tokens / seconds, 1),
                   scored=len(scores), generated=len(replies))
    return figures


# ----- the environment ----------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Python, torch, CUDA and the GPU, package versions, and `pip check`'s complaints."""
    import torch

    cuda = torch.cuda.is_available()
    pip_check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                               text=True, check=False)
    figures = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_memory_gib": (round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                           if cuda else None),
        "versions": {**package_versions(), **package_versions(OTHER_PACKAGES)},
        "pip_check": pip_check.stdout.splitlines(),
    }
    if not cuda:
        raise StepFailed("no CUDA device: torch.cuda.is_available() is False", figures)
    return figures


# ----- the command line ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-reference", action="store_true",
                        help=f"measure on the CPU and write the reference into {REFERENCE.name}")
    parser.add_argument("--model", default=str(TINY_MODEL),
                        help="base model: a folder or an embedded name (default: the tiny one)")
    parser.add_argument("--adapter", default=str(TINY_ADAPTER),
                        help="the filter's LoRA adapter: a folder or a filter name")
    parser.add_argument("--reference", type=Path, default=REFERENCE,
                        help="the CPU reference file")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated steps to run, of {', '.join(STEPS)}")
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("OUT", ROOT / "runs")) / "gpu_check.json",
                        help="the results JSON (default: $OUT/gpu_check.json)")
    args = parser.parse_args(argv)
    args.steps = [s for s in args.steps.split(",") if s]
    if not args.steps:
        parser.error("--steps names no step")
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    return args


def planned_steps(args: argparse.Namespace, workdir: Path) -> list[tuple[str, Callable]]:
    """The chosen steps, in STEPS order, each a call that needs CUDA (but `environment`)."""
    def on_cuda(step: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        def checked() -> dict[str, Any]:
            require_cuda()
            return step()
        return checked

    model, adapter = args.model, args.adapter
    steps = {
        "environment": environment,
        "train_single_gpu": on_cuda(lambda: check_training("single_gpu", None, model, workdir)),
        "train_zero3": on_cuda(lambda: check_training("zero3", 1, model, workdir)),
        "train_8b_recipes": on_cuda(lambda: check_8b_recipes(workdir)),
        "scores": on_cuda(lambda: check_scores(model, adapter, "cuda", args.reference)),
        "serve": on_cuda(lambda: check_serving(model, adapter, "cuda", workdir)),
    }
    return [(name, steps[name]) for name in STEPS if name in args.steps]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model == str(TINY_MODEL) and not TINY_MODEL.is_dir():
        if not args.write_reference:
            print(f"{TINY_MODEL} is absent: run `python tests/gpu/gpu_check.py "
                  "--write-reference` on a CPU machine first, and carry .gpu_check",
                  file=sys.stderr)
            return 2
        make_tiny_inputs()
    args.adapter = str(resolve_filter(args.adapter, args.model))
    if args.write_reference:
        entry = write_reference(args.model, args.adapter, args.reference)
        print(f"wrote the CPU reference for {entry['model']} + {entry['adapter']} into "
              f"{args.reference}")
        return 0
    inputs = {"model": Path(args.model).name, "adapter": Path(args.adapter).name,
              "tiny_model": args.model == str(TINY_MODEL),
              **inputs_identity(args.model, args.adapter)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: list[StepResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        steps = planned_steps(args, Path(tmp))
        planned = [name for name, _ in steps]
        for name, step in steps:
            print(f"== {name}", file=sys.stderr, flush=True)
            results.append(run_step(name, step))
            print(f"   {'passed' if results[-1].passed else 'FAILED'} in "
                  f"{results[-1].seconds} s", file=sys.stderr, flush=True)
            # After every step, so a run stopped from outside keeps what it finished.
            document = results_document(results, inputs, planned)
            write_atomic(args.out, json.dumps(document, indent=1) + "\n")
    print(json.dumps({"passed": document["passed"], "failed_steps": document["failed_steps"]}))
    return exit_code(document)


if __name__ == "__main__":
    sys.exit(main())
