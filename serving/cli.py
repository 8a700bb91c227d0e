"""`sieverag serve`: the embedded server (`--engine local`) or vLLM (`--engine vllm`).

Registered with the `sieverag` command line through the `sieverag.commands` entry point;
the engines are imported only when `serve` runs, so other commands start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from sieverag.inference.errors import ConfigError
from sieverag.inference.llm.models import DEFAULT_MODEL
from sieverag.serving.config import LocalServerConfig, VLLMLaunchConfig

# Options of one engine only: flag -> config field.
_LOCAL_ONLY = {"--max-batch-size": "max_batch_size", "--batch-window-ms": "batch_window_ms",
               "--dtype": "dtype", "--device": "device"}
_VLLM_ONLY = {"--tensor-parallel-size": "tensor_parallel_size",
              "--gpu-memory-utilization": "gpu_memory_utilization",
              "--max-model-len": "max_model_len", "--max-logprobs": "max_logprobs",
              "--vllm-bin": "vllm_bin", "--startup-timeout": "startup_timeout_s"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve", help="serve a model and its LoRA adapters over an OpenAI-compatible API",
        description="Serve a base model and LoRA adapters (each selected by its name in the "
        "request's `model` field) over an OpenAI-compatible API: the embedded server "
        "(transformers + PEFT, CPU or GPU) or vLLM as a managed subprocess (GPU).")
    parser.add_argument("--engine", choices=("local", "vllm"), default="local",
                        help="local: the embedded server; vllm: run `vllm serve` "
                        "(default local)")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"base model: embedded name, local Hugging Face folder (or, with "
                        f"vllm, a hub id); requests name it as given (default {DEFAULT_MODEL})")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                        help="a PEFT LoRA adapter folder served as NAME; a bare PATH is named "
                        "<folder>-<hash8> from its content (repeat for several adapters)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="require `Authorization: Bearer <key>` on /v1 requests, the key "
                        "read from environment variable VAR")

    local = parser.add_argument_group("--engine local")
    local.add_argument("--max-batch-size", type=int, metavar="N",
                       help=_help(LocalServerConfig, "max_batch_size"))
    local.add_argument("--batch-window-ms", type=float, metavar="M",
                       help=_help(LocalServerConfig, "batch_window_ms"))
    local.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                       help=_help(LocalServerConfig, "dtype"))
    local.add_argument("--device", choices=("auto", "cpu", "cuda"),
                       help=_help(LocalServerConfig, "device"))

    vllm = parser.add_argument_group("--engine vllm")
    vllm.add_argument("--tensor-parallel-size", type=int, metavar="N",
                      help=_help(VLLMLaunchConfig, "tensor_parallel_size"))
    vllm.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                      help=_help(VLLMLaunchConfig, "gpu_memory_utilization"))
    vllm.add_argument("--max-model-len", type=int, metavar="N",
                      help=_help(VLLMLaunchConfig, "max_model_len"))
    vllm.add_argument("--max-logprobs", type=int, metavar="N",
                      help=_help(VLLMLaunchConfig, "max_logprobs"))
    vllm.add_argument("--vllm-bin", metavar="PATH", help=_help(VLLMLaunchConfig, "vllm_bin"))
    vllm.add_argument("--startup-timeout", type=float, metavar="S",
                      help=_help(VLLMLaunchConfig, "startup_timeout_s"))
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    common = {"model": args.model, "adapters": tuple(args.adapter), "host": args.host,
              "port": args.port, "api_key_env": args.api_key_env}
    if args.engine == "local":
        _refuse_options(args, _VLLM_ONLY, "vllm")
        from sieverag.serving.local_server import LocalServer

        logging.getLogger(__name__).info("loading %s ...", args.model)
        LocalServer(LocalServerConfig(**common, **_given(args, _LOCAL_ONLY))).run()
        return 0
    _refuse_options(args, _LOCAL_ONLY, "local")
    from sieverag.serving.vllm_launcher import VLLMServer

    return VLLMServer(VLLMLaunchConfig(**common, **_given(args, _VLLM_ONLY))).run()


def _given(args: argparse.Namespace, options: dict[str, str]) -> dict[str, Any]:
    """Config fields for the engine options given on the command line (others: defaults)."""
    return {name: getattr(args, _dest(flag)) for flag, name in options.items()
            if getattr(args, _dest(flag)) is not None}


def _refuse_options(args: argparse.Namespace, options: dict[str, str], engine: str) -> None:
    given = [flag for flag in options if getattr(args, _dest(flag)) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} only apply to --engine {engine}")


def _dest(flag: str) -> str:
    """The argparse destination of a flag: --max-batch-size -> max_batch_size."""
    return flag.removeprefix("--").replace("-", "_")


def _help(config: type, name: str) -> str:
    """A config field's help text, with its default where it has one."""
    spec = next(f for f in dataclasses.fields(config) if f.name == name)
    text = spec.metadata["help"]
    return text if spec.default is None else f"{text} (default {spec.default})"
