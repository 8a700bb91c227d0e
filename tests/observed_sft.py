"""`sieverag.training.sft` as `accelerate launch` runs it, observed from inside every rank,
and the filter score of what it saved.

    accelerate launch --config_file CONFIG tests/observed_sft.py --report-dir DIR \
        [--kill-after-save STEP] [--unsafe-save-dir DIR] -- RECIPE ARGS...

`launch_observed` runs a `sieverag train` launch plan (`training.cli.train.plan_launch`) this way;
`p_yes` scores chunk prompts with the filter (base model plus adapter) through the hf backend.

Each rank writes DIR/rank-R.json: the world size its trainer saw, how many adapter cards it
wrote, how many times DeepSpeed gathered ZeRO-3's sharded weights into a state dict, whether
it ran a wandb run, and (rank 0) the logged losses and the wall time of every logged step.
`--kill-after-save STEP` SIGKILLs every rank once the checkpoint of STEP is saved (a crash
after a checkpoint); `--unsafe-save-dir` has rank 0 save the adapter at the end of training
with PEFT's own `save_pretrained`, which does not gather ZeRO-3's shards (the empty-adapter
trap). Used by tests/training/test_train_multiprocess.py and
tests/benchmarks/bench_train_processes.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import TrainerCallback

if TYPE_CHECKING:
    from sieverag.training.cli.train import LaunchPlan

RANK = int(os.environ.get("RANK", "0"))
SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]


class Observer(TrainerCallback):
    """Records what a rank saw; kills the run or saves unsafely when asked."""

    def __init__(self, report: dict, kill_after_save: int | None,
                 unsafe_save_dir: str | None) -> None:
        self.report = report
        self.kill_after_save = kill_after_save
        self.unsafe_save_dir = unsafe_save_dir

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, D102
        self.report["world_size"] = args.world_size
        self.report["train_batch_size"] = args.per_device_train_batch_size * \
            args.gradient_accumulation_steps * args.world_size

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, D102
        if logs and "loss" in logs:
            self.report["losses"][str(state.global_step)] = logs["loss"]
            self.report["log_times"][str(state.global_step)] = time.perf_counter()
            self.report["num_tokens"][str(state.global_step)] = logs.get("num_tokens")

    def on_save(self, args, state, control, **kwargs):  # noqa: ANN001, D102
        if state.global_step == self.kill_after_save:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()  # every rank has written its part of the checkpoint
            write_report(self.report)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, D102
        if self.unsafe_save_dir and state.is_world_process_zero:
            model.save_pretrained(self.unsafe_save_dir)


def count_calls(owner: object, name: str, report: dict, key: str) -> None:
    """Wrap `owner.name` so that each call adds one to `report[key]`."""
    original = getattr(owner, name)

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        report[key] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def write_report(report: dict) -> None:
    folder = Path(report["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{RANK}.json").write_text(json.dumps(report), encoding="utf-8")


def launch_observed(plan: LaunchPlan, report_dir: Path, *flags: str,
                    env: Mapping[str, str] | None = None, timeout_s: float = 600,
                    ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run `plan` with this script in place of `-m sieverag.training.sft`; returns the
    finished launch (output captured) and the ranks' reports, by rank."""
    module = plan.argv.index("sieverag.training.sft")
    argv = [*plan.argv[:module - 1], str(SCRIPT), "--report-dir", str(report_dir), *flags,
            "--", *plan.argv[module + 1:]]
    launch_env = {**plan.env, **(env or {}),
                  "PYTHONPATH": os.pathsep.join([str(ROOT), plan.env.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, cwd=ROOT, env=launch_env, capture_output=True, text=True,
                          timeout=timeout_s)
    reports = [json.loads(p.read_text(encoding="utf-8"))
               for p in sorted(report_dir.glob("rank-*.json"))]
    return done, reports


def p_yes(model: str | Path, adapter: str | Path | None,
          prompts: Sequence[list[dict[str, str]]]) -> list[float]:
    """The filter's P(Yes) on chunk `prompts` (base `model` with `adapter`, or none), float32
    on the CPU, through the hf backend."""
    from sieverag.inference.filters.filter_format import (
        IRRELEVANT,
        RELEVANT,
        p_relevant,
        relevance_log_odds,
    )
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    backend = HFBackend(HFBackendConfig(model=str(model), adapter=adapter and str(adapter),
                                        dtype="float32", device="cpu"))
    scores = backend.label_logprobs(list(prompts), [RELEVANT, IRRELEVANT])
    return [p_relevant(relevance_log_odds(s)) for s in scores]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report-dir", required=True)
    parser.add_argument("--kill-after-save", type=int)
    parser.add_argument("--unsafe-save-dir")
    ours, recipe_args = parser.parse_known_args()
    recipe_args = [a for a in recipe_args if a != "--"]
    report = {"dir": ours.report_dir, "rank": RANK, "card_writes": 0, "zero3_gathers": 0,
              "losses": {}, "log_times": {}, "num_tokens": {}}

    from sieverag.training.sft import adapter, trainer

    count_calls(adapter, "write_adapter_metadata", report, "card_writes")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        from deepspeed.runtime.engine import DeepSpeedEngine

        count_calls(DeepSpeedEngine, "_zero3_consolidated_16bit_state_dict", report,
                    "zero3_gathers")
    code = trainer.main(recipe_args, callbacks=[
        Observer(report, ours.kill_after_save, ours.unsafe_save_dir)])
    wandb = sys.modules.get("wandb")
    report["wandb_run"] = bool(wandb is not None and wandb.run is not None)
    write_report(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
