"""The `accelerate launch` configs shipped with sieverag (`sieverag train --accelerate-config
NAME`); see README.md here. Installed as `sieverag.accelerate_configs`."""

from pathlib import Path

ACCELERATE_CONFIGS_DIR = Path(__file__).parent
# `--accelerate-config` names → files here (as `trl sft --accelerate_config` names them).
ACCELERATE_CONFIG_NAMES = {
    "cpu": "cpu.yaml",
    "single_gpu": "single_gpu.yaml",
    "multi_gpu": "multi_gpu.yaml",
    "zero2": "deepspeed_zero2.yaml",
    "zero2_cpu": "deepspeed_zero2_cpu.yaml",
    "zero3": "deepspeed_zero3.yaml",
}
