"""The `accelerate launch` configs shipped with sieverag (`sieverag train --accelerate-config
NAME`); see README.md here. Installed as `sieverag.accelerate_configs`."""

from dataclasses import dataclass
from pathlib import Path

ACCELERATE_CONFIGS_DIR = Path(__file__).parent


@dataclass(frozen=True)
class ShippedConfig:
    """One `--accelerate-config` name: the file it launches on a machine with CUDA GPUs and
    the one on a CPU-only machine (None: that kind of machine cannot run it)."""

    gpu: str | None
    cpu: str | None


# `--accelerate-config` names → files here (as `trl sft --accelerate_config` names them).
# ddp, zero2 and zero3 follow the machine: their CPU files differ from the GPU ones only in
# precision (float32), process count and `use_cpu`, so the same launcher, the same DeepSpeed
# settings and the same training script run on both.
ACCELERATE_CONFIGS = {
    "cpu": ShippedConfig("cpu.yaml", "cpu.yaml"),
    "single_gpu": ShippedConfig("single_gpu.yaml", None),
    "ddp": ShippedConfig("multi_gpu.yaml", "ddp_cpu.yaml"),
    "multi_gpu": ShippedConfig("multi_gpu.yaml", None),
    "zero2": ShippedConfig("deepspeed_zero2.yaml", "deepspeed_zero2_cpu.yaml"),
    "zero3": ShippedConfig("deepspeed_zero3.yaml", "deepspeed_zero3_cpu.yaml"),
    "ddp_cpu": ShippedConfig("ddp_cpu.yaml", "ddp_cpu.yaml"),
    "zero2_cpu": ShippedConfig("deepspeed_zero2_cpu.yaml", "deepspeed_zero2_cpu.yaml"),
    "zero3_cpu": ShippedConfig("deepspeed_zero3_cpu.yaml", "deepspeed_zero3_cpu.yaml"),
    # Two machines of 8 GPUs: `sieverag train --machine-rank R --main-process-ip IP` on each.
    "zero3_2x8": ShippedConfig("deepspeed_zero3_2x8.yaml", None),
}
