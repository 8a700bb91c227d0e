"""`sieverag serve`: the embedded server (`--engine local`) or vLLM (`--engine vllm`); and
`sieverag index serve`: one retrieval index over HTTP (`serving.retrieval`).

The command's settings are the served model (`ServedModelConfig`) plus one section of options per
engine (`--local.*`, `--vllm.*`); the engines are imported only when `serve` runs, so other
commands start fast.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import field
from typing import Literal

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import narrow, settings
from sieverag.serving.config import (
    LocalOptions,
    LocalServerConfig,
    ProxyOptions,
    ServedModelConfig,
    ServiceOptions,
    VLLMLaunchConfig,
    VLLMOptions,
)
from sieverag.serving.retrieval.config import RetrievalServerConfig

Engine = Literal["local", "vllm"]

# Each engine's options section and the config it completes.
ENGINE_CONFIGS: dict[str, tuple[type, type]] = {
    "local": (LocalOptions, LocalServerConfig),
    "vllm": (VLLMOptions, VLLMLaunchConfig),
}


@settings
class ServeCommand(ServiceOptions, ProxyOptions, ServedModelConfig):
    """Serve a base model and LoRA adapters (each selected by its name in the request's
    `model` field) over an OpenAI-compatible API: the embedded server (transformers + PEFT,
    CPU or GPU) or vLLM as a managed subprocess (its CPU or GPU build). With --proxy-to, the
    embedded server's chat endpoint forwards to another server, filtering the documents a
    request marks."""

    engine: Engine = field(default="local", metadata={
        "help": "local: the embedded server; vllm: vLLM (`make vllm` installs it)"})
    local: LocalOptions | None = field(default=None, metadata={
        "help": "options of --engine local (unset: their defaults)"})
    vllm: VLLMOptions | None = field(default=None, metadata={
        "help": "options of --engine vllm (unset: their defaults)"})

    def __post_init__(self) -> None:
        ServedModelConfig.__post_init__(self)
        ProxyOptions.__post_init__(self)
        ServiceOptions.__post_init__(self)


def engine_config(command: ServeCommand) -> LocalServerConfig | VLLMLaunchConfig:
    """The chosen engine's config: the served model plus that engine's options; options of
    the other engine are refused."""
    for engine in ENGINE_CONFIGS:
        if engine != command.engine and getattr(command, engine) is not None:
            raise ConfigError(f"--{engine}.* options only apply to --engine {engine} (this "
                              f"is --engine {command.engine})")
    options_cls, config_cls = ENGINE_CONFIGS[command.engine]
    options = getattr(command, command.engine) or options_cls()
    served = dataclasses.asdict(narrow(command, ServedModelConfig))
    if command.engine == "local":
        return config_cls(**served, **dataclasses.asdict(options),
                          **dataclasses.asdict(narrow(command, ProxyOptions)),
                          **dataclasses.asdict(narrow(command, ServiceOptions)))
    if command.proxy_to is not None:
        raise ConfigError("--proxy-to needs --engine local: the proxy filters on the embedded "
                          "server (point it at vLLM as the upstream instead)")
    if narrow(command, ServiceOptions) != ServiceOptions():
        raise ConfigError("--drain-timeout-s and --metrics-port apply to --engine local: vLLM "
                          "serves its own /metrics on its port, and --vllm.stop-timeout-s "
                          "bounds its stop")
    return config_cls(**served, **dataclasses.asdict(options))


def run_serve(command: ServeCommand) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop."""
    config = engine_config(command)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    if isinstance(config, LocalServerConfig):
        from sieverag.serving.local_server import LocalServer

        logging.getLogger(__name__).info("loading %s ...", config.model)
        LocalServer(config).run()
        return 0
    from sieverag.serving.vllm.launcher import VLLMServer

    return VLLMServer(config).run()


def run_index_serve(config: RetrievalServerConfig) -> int:
    """`sieverag index serve`: load the index, serve it until SIGINT/SIGTERM; 0 after a clean
    stop."""
    from sieverag.serving.retrieval.server import RetrievalServer, load_served_index

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    RetrievalServer(load_served_index(config), config).run()
    return 0
