"""CPU training throughput of the SmolLM2 filter recipe, side by side in one run.

Runs `training.sft.trainer.train` in this process (as `accelerate launch` with accelerate_configs/
cpu.yaml would: one CPU process) on the recipe training/sft/recipes/smollm2_filter_cpu.yaml, on
the same records and seed, as:
  recipe                    as the recipe says (`train_sampling_strategy: group_by_length`,
                            batches of similar length; the LM head scores the trained
                            positions only, `score_label_positions_only`);
  random batches            TRL's default sampling;
  every position            the LM head over every position (TRL's own choice on a CPU:
                            the recipe as the shipped filter was trained);
  LoRA from layer 15 / 20   LoRA on the upper half / third of the 30 layers only
                            (`lora_layers_from`), so the backward pass stops there.
Steps and real (non-padding) tokens are timed from the first logged step to the last, so
model loading and the first step's warm-up are not counted. Prints a table (seconds per
record, and its ratio to the recipe's) and one JSON line; also the recipe's estimated
training minutes at the measured rate.

    python tests/benchmarks/bench_train.py [--quick] [--steps 20] [--dataset BUILD_DATASET_DIR]

Without --dataset, gold-labelled records in the filter format are built from the shared
HotpotQA file (chunk records for every passage, sentence records for gold passages with
supporting facts), as `sieverag build-dataset --gold only` would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from offline_env import run_offline

run_offline()

import yaml  # noqa: E402
from bench_data import HOTPOT  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.filters.filter_format import chunk_record, sentence_record  # noqa: E402
from sieverag.training.sft.recipe import parse_recipe  # noqa: E402
from sieverag.training.sft.trainer import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "training" / "sft" / "recipes" / "smollm2_filter_cpu.yaml"
SAMPLE = ROOT / "tests" / "data" / "hotpotqa_sample.jsonl"


class StepClock(TrainerCallback):
    """Wall time, step and token count at every logged step (logging_steps = 1)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, D102
        if logs and "num_tokens" in logs:
            self.marks.append((time.perf_counter(), state.global_step, float(logs["num_tokens"])))

    def rates(self) -> dict[str, float]:
        (t0, s0, n0), (t1, s1, n1) = self.marks[0], self.marks[-1]
        seconds = t1 - t0
        return {"steps": s1 - s0, "seconds": seconds, "steps_per_s": (s1 - s0) / seconds,
                "tokens_per_s": (n1 - n0) / seconds, "tokens_per_step": (n1 - n0) / (s1 - s0)}


def build_records(dataset: Path, questions: int, out: Path) -> Path:
    """A build-dataset-like folder of gold-labelled filter records."""
    from datasets import Dataset, DatasetDict

    records = []
    for example in load_examples(dataset, limit=questions):
        for document in example.documents:
            provenance = {"question": example.question, "source": "hotpotqa",
                          "question_id": example.id, "title": document.title}
            records.append(chunk_record(chunk_text=document.text, relevant=bool(document.is_gold),
                                        **provenance))
            if document.is_gold and document.sentences and \
                    document.supporting_sentences is not None:
                records.append(sentence_record(sentences=document.sentences,
                                               key_sentences=document.supporting_sentences,
                                               **provenance))
    for record in records:
        record["evidence"] = {}
    DatasetDict({"train": Dataset.from_list(records),
                 "validation": Dataset.from_list(records[:8])}).save_to_disk(out / "dataset")
    return out


# Each variant's flags over the recipe's.
VARIANTS = {
    "recipe": [],
    "random batches": ["--train_sampling_strategy", "random"],
    "every position": ["--score_label_positions_only", "false"],
    "LoRA from layer 15": ["--lora_layers_from", "15"],
    "LoRA from layer 20": ["--lora_layers_from", "20"],
}


def run(dataset: Path, steps: int, name: str, workdir: Path) -> dict[str, float]:
    clock = StepClock()
    recipe = parse_recipe([
        "--config", str(RECIPE), "--dataset_path", str(dataset),
        "--output_dir", str(workdir / name.replace(" ", "-")), "--max_steps", str(steps + 1),
        "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", "1",
        "--report_to", "none", "--disable_tqdm", "true", "--auto_resume", "false",
        *VARIANTS[name]])
    train(recipe, callbacks=[clock])
    return clock.rates()


def step_arguments(doc: str, steps: int, quick_steps: int, per: str) -> argparse.Namespace:
    """A training benchmark's flags: --quick, --steps (timed steps `per` variant or mode;
    `args.steps` holds the number to run) and --dataset."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{quick_steps} steps per {per}")
    parser.add_argument("--steps", type=int, default=steps, help=f"timed steps per {per}")
    parser.add_argument("--dataset", type=Path, help="a `sieverag build-dataset` folder")
    args = parser.parse_args()
    if args.quick:
        args.steps = quick_steps
    return args


def main() -> int:
    args = step_arguments(__doc__, 20, 5, "variant")
    steps = args.steps
    recipe_values = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        workdir = Path(tmp)
        dataset = args.dataset or build_records(HOTPOT if HOTPOT.is_file() else SAMPLE,
                                                60, workdir / "data")
        results = {name: run(dataset, steps, name, workdir) for name in VARIANTS}
    batch = recipe_values["per_device_train_batch_size"] * \
        recipe_values.get("gradient_accumulation_steps", 1)
    recipe_steps = math.ceil(recipe_values["max_train_examples"] / batch) * \
        recipe_values.get("num_train_epochs", 1)
    base = results["recipe"]
    print(f"SmolLM2-135M LoRA SFT on CPU ({os.cpu_count()} cores), recipe {RECIPE.name}, "
          f"batch {batch}, {steps} timed steps per variant")
    print(f"{'variant':<20}{'steps/s':>9}{'tokens/s':>10}{'tokens/step':>13}{'s/record':>10}"
          f"{'s/record ÷ recipe':>19}")
    for name, figures in results.items():
        per_record = 1 / figures["steps_per_s"] / batch
        print(f"{name:<20}{figures['steps_per_s']:>9.3f}{figures['tokens_per_s']:>10.1f}"
              f"{figures['tokens_per_step']:>13.1f}{per_record:>10.3f}"
              f"{base['steps_per_s'] / figures['steps_per_s']:>19.2f}")
    minutes = recipe_steps / base["steps_per_s"] / 60
    print(f"recipe: {recipe_steps} training steps → about {minutes:.0f} min at this rate "
          "(plus evaluation passes)")
    every, random = results["every position"], results["random batches"]
    print(json.dumps({
        "steps_per_s": round(base["steps_per_s"], 4),
        "tokens_per_s": round(base["tokens_per_s"], 1),
        "random_batches_steps_per_s": round(random["steps_per_s"], 4),
        "random_batches_tokens_per_s": round(random["tokens_per_s"], 1),
        "tokens_per_s_ratio": round(base["tokens_per_s"] / random["tokens_per_s"], 3),
        "every_position_steps_per_s": round(every["steps_per_s"], 4),
        "label_positions_speedup": round(base["steps_per_s"] / every["steps_per_s"], 3),
        **{f"lora_from_{n}_speedup_over_every_position":
           round(results[f"LoRA from layer {n}"]["steps_per_s"] / every["steps_per_s"], 3)
           for n in (15, 20)},
        "batch": batch, "timed_steps": steps, "recipe_train_steps": recipe_steps,
        "recipe_estimated_train_minutes": round(minutes, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
