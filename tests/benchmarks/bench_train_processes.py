"""CPU training throughput of the SmolLM2 filter in one process against two (DDP and ZeRO-3),
and whether their adapters agree.

Each mode is a real `sieverag train` launch of the recipe training/sft/recipes/
smollm2_filter_cpu.yaml on the embedded SmolLM2-135M-Instruct, planned by `plan_launch` as the
command plans it on this machine (`cpu`, then `ddp` and `zero3` with 2 processes: their CPU
files here) and run with tests/observed_sft.py in place of `-m sieverag.training.sft`, so
rank 0 reports the time and the token count of every logged step. The modes run one after
the other, on the same records, at the same global batch (the recipe's 8: 4 x 2 accumulated
steps in one process, 4 per process in two), float32, random sampling with one seed and no
dropout, so all of them train the same adapter: the table gives each one's largest P(Yes)
difference from the one-process adapter (the filter's score on chunk prompts of the
records) and its final-loss difference. The processes share the cores as `sieverag train`
sets them (OMP_NUM_THREADS = cores / processes unless it is set); a last row runs one
process on one thread, which tells the cost of a second process from that of a second
thread (on a busy machine, a process's second thread waits at every parallel region for a
core: the two-thread row suffers most from other work on the machine).

tokens/s is the median over the timed steps of each step's real (non-padding) tokens, all
ranks', per second, and s/step the median step time: the first step's warm-up, loading and
DeepSpeed's start are left out ("launch s" is the whole launch, start to adapter check), and
a stall of a shared machine moves a median less than a mean. The header gives the load
average before and after. On 2 cores two processes cannot be faster than one: the point is
that the figures exist and the adapters agree.

    python tests/benchmarks/bench_train_processes.py [--quick] [--steps 6] [--dataset DIR]

Without --dataset, records are built from the shared HotpotQA file (else the repository's
sample) as bench_train.py builds them. On an idle 2-core machine the default (6 timed steps
per mode) takes about 8 minutes and `--quick` (2 timed steps) about 5, most of it four
launches' start-up; a busy one takes twice that. Prints a table, then one line of JSON with
every figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from offline_env import run_offline

run_offline()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from bench_data import HOTPOT  # noqa: E402
from bench_train import SAMPLE, build_records, step_arguments  # noqa: E402
from observed_sft import launch_observed, p_yes  # noqa: E402

from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model  # noqa: E402
from sieverag.training.cli.train import TrainCommand, plan_launch  # noqa: E402

# (name, --accelerate-config, processes, per-device batch, accumulation, threads per process:
# None as `sieverag train` sets them): global batch 8. "1 process, 1 thread" tells the cost of
# a second process from that of a second thread.
MODES = (("1 process", "cpu", 1, 4, 2, None), ("DDP x2", "ddp", 2, 4, 1, None),
         ("ZeRO-3 x2", "zero3", 2, 4, 1, None), ("1 proc 1 thr", "cpu", 1, 4, 2, 1))
QUESTIONS = 12  # ~140 records: 7 steps of 8 fit in one epoch
PROMPT_QUESTIONS = 2


def run(mode: tuple, dataset: Path, steps: int, workdir: Path) -> dict:
    """One launch of `mode`; its rank-0 figures and where its adapter is."""
    name, config, processes, batch, accumulation, threads = mode
    out = workdir / name.replace(" ", "-")
    plan = plan_launch(TrainCommand(
        recipe="smollm2_filter_cpu", accelerate_config=config, num_processes=processes,
        overrides={"dataset_path": dataset, "output_dir": out, "max_steps": steps + 1,
                   "per_device_train_batch_size": batch,
                   "gradient_accumulation_steps": accumulation, "lora_dropout": 0,
                   "train_sampling_strategy": "random", "eval_strategy": "no",
                   "save_strategy": "no", "logging_steps": 1, "report_to": "none",
                   "disable_tqdm": True, "auto_resume": False}))
    started = time.perf_counter()
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    done, ranks = launch_observed(plan, workdir / f"{out.name}-ranks", env=env)
    launch_seconds = time.perf_counter() - started
    if done.returncode != 0 or not ranks:
        raise SystemExit(f"{name}: the launch failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    report = ranks[0]
    logged = [str(step) for step in sorted(int(step) for step in report["log_times"])]
    # Each step after the first: its seconds and tokens/s; the median of each resists the
    # stalls of a shared machine.
    steps = list(zip(logged, logged[1:], strict=False))
    seconds = [report["log_times"][b] - report["log_times"][a] for a, b in steps]
    rates = [(report["num_tokens"][b] - report["num_tokens"][a]) / s
             for (a, b), s in zip(steps, seconds, strict=True)]
    return {"name": name, "config": plan.config.path.name, "processes": processes,
            "threads_per_process": int({**plan.env, **env}["OMP_NUM_THREADS"]),
            "timed_steps": len(seconds), "seconds_per_step": statistics.median(seconds),
            "tokens_per_s": statistics.median(rates), "final_loss": report["losses"][logged[-1]],
            "launch_seconds": launch_seconds, "adapter": out}


def prompts(dataset: Path) -> list:
    """The chunk prompts (as `chunk_prompt` builds them) of the records' first questions."""
    from datasets import load_from_disk

    records = load_from_disk(str(dataset / "dataset"))["train"]
    seen, chosen = set(), []
    for record in records:
        if record["task"] == "chunk" and len(seen | {record["question_id"]}) <= PROMPT_QUESTIONS:
            seen.add(record["question_id"])
            chosen.append(record["prompt"])
    return chosen


def main() -> int:
    args = step_arguments(__doc__, 6, 2, "mode")
    steps = args.steps
    model = resolve_model(DEFAULT_MODEL)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-train-processes-") as tmp:
        workdir = Path(tmp)
        dataset = args.dataset or build_records(HOTPOT if HOTPOT.is_file() else SAMPLE,
                                                QUESTIONS, workdir / "data")
        results = [run(mode, dataset, steps, workdir) for mode in MODES]
        chunks = prompts(dataset)
        reference = p_yes(model, results[0]["adapter"], chunks)
        base = p_yes(model, None, chunks)
        for result in results:
            scored = p_yes(model, result["adapter"], chunks)
            result["max_p_yes_difference"] = max(abs(a - b) for a, b in zip(scored, reference,
                                                                             strict=True))
            result["final_loss_difference"] = abs(result["final_loss"]
                                                  - results[0]["final_loss"])
        trained = max(abs(a - b) for a, b in zip(reference, base, strict=True))
    one = results[0]["tokens_per_s"]
    print(f"SmolLM2-135M LoRA SFT on CPU ({os.cpu_count()} cores), recipe "
          f"smollm2_filter_cpu.yaml, global batch 8, {steps} timed steps per mode, "
          f"{len(chunks)} chunk prompts scored; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(f"{'mode':<13}{'config':<26}{'threads':>8}{'s/step':>8}{'tokens/s':>10}"
          f"{'vs 1':>6}{'max |dP(Yes)|':>15}{'final loss d':>14}{'launch s':>10}")
    for r in results:
        print(f"{r['name']:<13}{r['config']:<26}{r['processes']}x{r['threads_per_process']:<6}"
              f"{r['seconds_per_step']:>8.2f}{r['tokens_per_s']:>10.1f}"
              f"{r['tokens_per_s'] / one:>6.2f}{r['max_p_yes_difference']:>15.2e}"
              f"{r['final_loss_difference']:>14.2e}{r['launch_seconds']:>10.0f}")
    print(f"(training moved P(Yes) from the base model's by up to {trained:.3f})")
    print(json.dumps({
        "tokens_per_s": {r["name"]: round(r["tokens_per_s"], 1) for r in results},
        "ratio_to_one_process": {r["name"]: round(r["tokens_per_s"] / one, 3)
                                 for r in results},
        "max_p_yes_difference": {r["name"]: r["max_p_yes_difference"] for r in results},
        "final_loss_difference": {r["name"]: r["final_loss_difference"] for r in results},
        "p_yes_moved_by_training": round(trained, 4), "timed_steps": steps,
        "global_batch": 8}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
