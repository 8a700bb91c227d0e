"""Two machines of 8 GPUs (`--accelerate-config zero3_2x8`): `sieverag train --dry-run` on
node 0 and node 1 builds the launch each machine runs, and accelerate's own launcher reads it
(its argument parser, its checks, its DeepSpeed preparation and torchrun's configuration,
everything but starting the processes) as two nodes of 8 processes meeting at the main
machine, with the 8B ZeRO-3 recipe. No second machine is needed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sft_runs import write_filter_dataset

from sieverag.inference.core.errors import ConfigError
from sieverag.training.cli.train import TrainCommand, plan_launch, run_train
from sieverag.training.sft.launch import Machine

MAIN_IP = "10.1.2.3"
EIGHT_GPUS = Machine(cuda_devices=8, cpu_cores=64, cpu_bf16=True)


@pytest.fixture
def gpu_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """What a node of 8 bf16 GPUs answers when the bf16 recipe is parsed; the dataset."""
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: EIGHT_GPUS))
    return write_filter_dataset(tmp_path / "data")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command(dataset: Path, **node: object) -> TrainCommand:
    return TrainCommand(recipe="llama3_8b_filter_zero3", accelerate_config="zero3_2x8",
                        overrides={"dataset_path": dataset}, **node)


def as_accelerate_reads_it(argv: list[str]):
    """accelerate launch's reading of `argv`, up to the torchrun configuration it would run
    (`accelerate.commands.launch.launch_command`'s DeepSpeed branch and `deepspeed_launcher`,
    without the last call, which starts the processes)."""
    import torch.distributed.run as torchrun
    from accelerate.commands.launch import (
        _filter_args,
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils import prepare_deepspeed_cmd_env

    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    args = launch_command_parser().parse_args(argv[3:])
    args, defaults, precision_from_config = _validate_launch_command(args)
    assert args.use_deepspeed and not args.cpu
    args.deepspeed_fields_from_accelerate_config = ",".join(
        [*defaults.deepspeed_config, *(["mixed_precision"] if precision_from_config else [])])
    _, environment = prepare_deepspeed_cmd_env(args)
    filtered = _filter_args(args, torchrun.get_args_parser(),
                            ["--training_script", args.training_script,
                             "--training_script_args", args.training_script_args])
    config, program, program_args = torchrun.config_from_args(filtered)
    return args, environment, config, program, program_args


def test_each_node_launches_as_accelerate_expects(gpu_node: Path, capsys) -> None:
    port = free_port()
    for rank in (0, 1):
        node = {"machine_rank": rank, "main_process_ip": MAIN_IP, "main_process_port": port}
        plan = plan_launch(command(gpu_node, **node), EIGHT_GPUS)
        assert plan.processes == 16 and plan.effective_batch == 4 * 1 * 16
        args, environment, config, program, program_args = as_accelerate_reads_it(plan.argv)
        assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 16, rank)
        assert (args.main_process_ip, args.main_process_port) == (MAIN_IP, port)
        assert args.deepspeed_multinode_launcher == "standard"
        # torchrun: 2 nodes of 8 processes, this one of the given rank, meeting at node 0.
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 8)
        assert config.rdzv_backend == "static" and config.rdzv_configs["rank"] == rank
        assert config.rdzv_endpoint == f"{MAIN_IP}:{port}"
        assert environment["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert environment["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
        assert environment["ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"] == "true"
        assert environment["ACCELERATE_MIXED_PRECISION"] == "bf16"
        # torchrun runs `python -u -m sieverag.training.sft --config RECIPE ...` per process.
        assert program_args[:5] == ["-u", "-m", "sieverag.training.sft", "--config",
                                    plan.argv[plan.argv.index("--config") + 1]]
        assert program_args[4].endswith("llama3_8b_filter_zero3.yaml")
        assert run_train(command(gpu_node, dry_run=True, **node)) == 0
        said = capsys.readouterr().out
        assert said.startswith("would launch (--dry-run): ") and f"--machine_rank {rank}" in said


@pytest.mark.parametrize(("node", "message"), [
    ({}, "give each machine the same command with its --machine-rank"),
    ({"machine_rank": 2, "main_process_ip": MAIN_IP}, "--machine-rank must be 0 to 1"),
    ({"machine_rank": 0, "main_process_ip": MAIN_IP, "main_process_port": 70000},
     "--main-process-port must be 1 to 65535"),
])
def test_a_node_without_its_place_is_refused(gpu_node: Path, node: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_launch(command(gpu_node, **node), EIGHT_GPUS)


def test_a_one_machine_config_refuses_node_flags(gpu_node: Path) -> None:
    with pytest.raises(ConfigError, match="runs on one .num_machines: 1."):
        plan_launch(TrainCommand(recipe="llama3_8b_filter_zero3", accelerate_config="zero3",
                                 machine_rank=1, main_process_ip=MAIN_IP,
                                 overrides={"dataset_path": gpu_node}), EIGHT_GPUS)
