"""What `sieverag train` launches, and whether it fits this machine.

A shipped `--accelerate-config` name follows the machine (`ddp`, `zero2`, `zero3`: the GPU
file where CUDA is, the CPU file elsewhere; see `sieverag.accelerate_configs`). Before
anything is launched, the config, the process count and the recipe's precision are checked
against the machine (`check_launch`): a config that cannot run here is one `ConfigError`
saying what to change, not a traceback from every rank.

Inside each launched rank, `process_defaults` gives the recipe parser the TrainingArguments
defaults a machine without CUDA needs, so the same script and the same configs' launchers
(torchrun, DeepSpeed's) run on CPUs as on GPUs.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.accelerate_configs import ACCELERATE_CONFIGS, ACCELERATE_CONFIGS_DIR
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import read_yaml_mapping

PRECISIONS = ("no", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Machine:
    """What a launch needs to know of the machine it runs on."""

    cuda_devices: int
    cpu_cores: int
    cpu_bf16: bool
    """The CPU computes in bf16 natively (AVX512-BF16 or AMX on x86, oneDNN's bf16 elsewhere)."""

    @classmethod
    def detect(cls) -> Machine:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        return cls(cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
                   cpu_cores=cores, cpu_bf16=_cpu_has_bf16())


def _cpu_has_bf16() -> bool:
    import torch

    if platform.machine().lower() in ("x86_64", "amd64"):
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True)
class LaunchConfig:
    """The facts of an accelerate config file that decide where and how it runs."""

    path: Path
    name: str
    """The `--accelerate-config` value it came from (a shipped name or the file)."""
    distributed_type: str
    use_cpu: bool
    mixed_precision: str
    num_processes: int
    num_machines: int
    zero_stage: int | None
    """DeepSpeed's ZeRO stage; None when the config does not launch DeepSpeed."""

    @property
    def deepspeed(self) -> bool:
        return self.distributed_type == "DEEPSPEED"


def shipped_names() -> str:
    return ", ".join(ACCELERATE_CONFIGS)


def resolve_accelerate_config(name: str, machine: Machine) -> Path:
    """A shipped name's file for this machine (its GPU file where CUDA is, else its CPU
    file), else `name` as a config file."""
    shipped = ACCELERATE_CONFIGS.get(name)
    if shipped is None:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"accelerate config {name!r} is neither a shipped config "
                              f"({shipped_names()}) nor a file")
        return path
    file = shipped.gpu if machine.cuda_devices else shipped.cpu
    if file is None:
        raise ConfigError(f"accelerate config {name} needs CUDA GPUs and this machine has none: "
                          f"use --accelerate-config {_cpu_alternative(name)}")
    return ACCELERATE_CONFIGS_DIR / file


def _cpu_alternative(name: str) -> str:
    """The shipped name that runs on the CPU what `name` runs on GPUs."""
    return {"multi_gpu": "ddp (2 CPU processes)",
            "zero3_2x8": "zero3 (2 CPU processes of one machine)"}.get(name, "cpu")


def read_launch_config(path: Path, name: str | None = None) -> LaunchConfig:
    """Read an accelerate config file's launch facts, each checked (errors name the file)."""
    values = read_yaml_mapping(path)
    source = f"accelerate config {path}"
    precision = str(values.get("mixed_precision", "no")).lower()
    if precision not in PRECISIONS:
        raise ConfigError(f"{source}: mixed_precision must be one of {', '.join(PRECISIONS)}, "
                          f"got {values.get('mixed_precision')!r}")
    counts = {}
    for key in ("num_processes", "num_machines"):
        value = values.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{source}: {key} must be an integer >= 1, got {value!r}")
        counts[key] = value
    deepspeed = values.get("deepspeed_config") or {}
    distributed_type = str(values.get("distributed_type", "NO")).upper()
    return LaunchConfig(
        path=path, name=name or str(path), distributed_type=distributed_type,
        use_cpu=values.get("use_cpu") is True, mixed_precision=precision,
        num_processes=counts["num_processes"], num_machines=counts["num_machines"],
        zero_stage=deepspeed.get("zero_stage") if distributed_type == "DEEPSPEED" else None)


def check_launch(config: LaunchConfig, processes: int, bf16: bool, fp16: bool,
                 machine: Machine) -> None:
    """Refuse, with one `ConfigError` saying what to change, a launch that cannot run here:
    several processes of a one-process config, a CUDA config without CUDA, more processes
    than GPUs or CPU cores, a config's bf16 or
    fp16 under a recipe without it, bf16 on a CPU without it or under DeepSpeed on a CPU,
    fp16 on a CPU."""
    where = f"accelerate config {config.name}"
    if config.distributed_type == "NO" and processes > 1:
        raise ConfigError(f"{where} runs one process (distributed_type: NO), not {processes}: "
                          "use --accelerate-config ddp, zero2 or zero3 for several")
    per_machine = -(-processes // config.num_machines)
    recipe_precision = "bf16" if bf16 else "fp16" if fp16 else "no"
    if not config.use_cpu:
        if machine.cuda_devices == 0:
            raise ConfigError(
                f"{where} runs on CUDA GPUs (use_cpu: false) and this machine has none: use "
                "--accelerate-config cpu, ddp, zero2 or zero3 (shipped names pick their CPU "
                "file here), or set use_cpu: true and mixed_precision: 'no' in the file")
        if per_machine > machine.cuda_devices:
            raise ConfigError(
                f"{where} launches {per_machine} processes on this machine, one per GPU, and "
                f"it has {machine.cuda_devices}: use --num-processes {machine.cuda_devices}")
    else:
        if per_machine > machine.cpu_cores:
            raise ConfigError(
                f"{where} launches {per_machine} processes and this machine has "
                f"{machine.cpu_cores} CPU core(s): use --num-processes {machine.cpu_cores} "
                "or fewer (each process needs a core of its own)")
        if "fp16" in (config.mixed_precision, recipe_precision):
            raise ConfigError(f"{where} runs on the CPU, which does not train in fp16: set "
                              "mixed_precision: 'no' in the config and fp16: false in the recipe")
        if "bf16" in (config.mixed_precision, recipe_precision):
            if not machine.cpu_bf16:
                raise ConfigError(
                    f"this CPU has no bf16 instructions (AVX512-BF16 or AMX), so {where} cannot "
                    "train in bf16 here: train in float32 (mixed_precision: 'no' in the config, "
                    "--overrides bf16=false)")
            if config.deepspeed:
                change = "--overrides bf16=false" if config.mixed_precision == "no" else \
                    "mixed_precision: 'no' in the config and --overrides bf16=false"
                raise ConfigError(
                    f"{where} runs DeepSpeed on the CPU, which trains in float32 only "
                    "(transformers takes bf16 on a CPU only with use_cpu, which turns DeepSpeed "
                    f"off): set {change}, or use --accelerate-config ddp or cpu for bf16")
    # transformers takes the config's precision when the recipe names none: it would autocast
    # a float32 recipe (and DeepSpeed would refuse it: `bf16.enabled=True vs hf bf16=False`).
    # A recipe's bf16 or fp16 over a float32 config is the recipe's to decide.
    if config.mixed_precision in ("bf16", "fp16") and config.mixed_precision != recipe_precision:
        raise ConfigError(
            f"{where} sets mixed_precision: {config.mixed_precision} and the recipe has "
            f"{config.mixed_precision}: false: add --overrides {config.mixed_precision}=true, or "
            "pick a config with mixed_precision: 'no'")


def node_arguments(config: LaunchConfig, machine_rank: int | None,
                   main_process_ip: str | None, main_process_port: int | None) -> list[str]:
    """accelerate launch's flags that place this machine in a launch over several machines
    (`num_machines` > 1 in the config): its rank (0 on the main machine, which the others
    reach at `main_process_ip`:`main_process_port`); none for a one-machine config, which
    refuses them. Every machine runs the same command but for its rank."""
    given = {"--machine-rank": machine_rank, "--main-process-ip": main_process_ip,
             "--main-process-port": main_process_port}
    where = f"accelerate config {config.name}"
    machines = config.num_machines
    if machines == 1:
        named = [flag for flag, value in given.items() if value is not None]
        if named:
            raise ConfigError(f"{', '.join(named)} place a machine in a launch over several "
                              f"machines, and {where} runs on one (num_machines: 1): use a "
                              "multi-node config such as zero3_2x8")
        return []
    if machine_rank is None or not main_process_ip:
        raise ConfigError(f"{where} runs on {machines} machines: give each machine the same "
                          f"command with its --machine-rank (0 to {machines - 1}; 0 on the main "
                          "machine) and the main machine's --main-process-ip")
    if not 0 <= machine_rank < machines:
        raise ConfigError(f"--machine-rank must be 0 to {machines - 1} ({where} runs on "
                          f"{machines} machines), got {machine_rank}")
    flags = ["--machine_rank", str(machine_rank), "--main_process_ip", main_process_ip]
    if main_process_port is not None:
        if not 1 <= main_process_port <= 65535:
            raise ConfigError(f"--main-process-port must be 1 to 65535, got {main_process_port}")
        flags += ["--main_process_port", str(main_process_port)]
    return flags


def launch_environment(config: LaunchConfig, processes: int, machine: Machine,
                       environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a launch runs in: a CPU config stays on the CPU (no CUDA device is
    visible, DeepSpeed's CPU accelerator) and each process gets its share of the cores
    (torchrun would give each one thread) unless OMP_NUM_THREADS is set."""
    env = dict(environ)
    if config.use_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DS_ACCELERATOR"] = "cpu"
        per_machine = -(-processes // config.num_machines)
        env.setdefault("OMP_NUM_THREADS", str(max(1, machine.cpu_cores // per_machine)))
    return env


def process_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """TrainingArguments defaults for this process on a machine without CUDA (a recipe or a
    flag still overrides them); none where CUDA is.

    accelerate counts a run's processes through the backend it is given. A DeepSpeed rank
    given none believes it is alone, so transformers sizes DeepSpeed's train_batch_size for
    one process and DeepSpeed refuses it (`1 != 1 * 1 * 2`): it gets gloo (`use_cpu` would
    turn DeepSpeed off). Any other rank gets `use_cpu`: without it a torchrun rank on a
    CPU-only machine trains alone, and transformers takes bf16 on a CPU only with it.
    """
    import torch

    if torch.cuda.is_available():
        return {}
    if environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return {"ddp_backend": "gloo"}
    return {"use_cpu": True}


def skip_unused_deepspeed_ops(environ: Mapping[str, str] = os.environ) -> None:
    """In a DeepSpeed rank without CUDA, keep DeepSpeed from compiling its CPU shared-memory
    all-reduce when it starts (1-2 minutes on 2 cores, on every fresh machine): only
    tensor-parallel inference uses that op (`inference_all_reduce`); ZeRO training reduces
    and gathers through torch.distributed (gloo)."""
    import torch

    if torch.cuda.is_available() or \
            environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return
    import deepspeed.ops

    # DeepSpeed keeps this dict for the process and builds only the ops it marks compatible.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
