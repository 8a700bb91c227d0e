"""The settings of both serving engines, as validated dataclasses.

Each option is defined once: `ServedModelConfig` holds what both engines share, `LocalOptions` and
`VLLMOptions` what only one uses, `ProxyOptions` the embedded server's filtering proxy. An
engine's config is the shared part plus its own (`LocalServerConfig`, `VLLMLaunchConfig`);
`sieverag serve` (`serving.cli`) takes the shared part, the proxy's and both option sections as
flags. Kept apart from the engines so `sieverag --help`
imports nothing heavy (parsing `serve`'s flags imports MCF's config, the rerank endpoint's bar,
and with it torch, as every inference command's parsing does).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import field
from typing import Literal

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Device, DType
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL

LogLevel = Literal["critical", "error", "warning", "info", "debug"]
VLLMDType = Literal["auto", "float32", "bfloat16", "float16"]
# Where `make vllm` puts vLLM's own environment, and the variable that can point elsewhere.
VLLM_VENV = ".venv-vllm"
VLLM_PYTHON_ENV = "SIEVERAG_VLLM_PYTHON"
_CORE_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
PROXY_TIMEOUT_S = 120.0
DEFAULT_MAX_REQUEST_TOKENS = 200_000


@settings
class ServedModelConfig:
    """What a server serves and where: the settings both engines share."""

    model: str = field(default=DEFAULT_MODEL, metadata={
        "help": "base model: embedded name or local Hugging Face folder (vllm also takes a hub "
                "id); requests name it as given here"})
    adapters: tuple[str, ...] = field(default=(), metadata={
        "help": "LoRA adapters as NAME=PATH, comma-separated; PATH is a PEFT folder or a "
                "filter's name, and a bare PATH is served as <folder>-<hash8> from its content"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to bind (127.0.0.1: this machine only)"})
    port: int = field(default=8000, metadata={
        "help": "TCP port; 0 picks a free one (local engine only)"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "require `Authorization: Bearer <key>` on /v1 requests, the key read from this "
                "environment variable"})

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must name an embedded model, a local folder or a hub id, "
                              "got ''")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.api_key_env is not None and not self.api_key_env:
            raise ConfigError("api_key_env must name an environment variable, got ''")


def client_base_url(host: str, port: int) -> str:
    """The OpenAI base URL a client on this machine uses for a server bound to `host`:`port`,
    e.g. http://127.0.0.1:8000/v1: a wildcard bind ('0.0.0.0' or '') is reached on the
    loopback, an IPv6 address in brackets."""
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/v1"


@settings
class LocalOptions:
    """How the embedded server (`--engine local`) loads the model and batches requests."""

    max_batch_size: int = field(default=32, metadata={
        "help": "most sequences in flight at once (a decode step runs all of one model's)"})
    batch_window_ms: float = field(default=10.0, metadata={
        "help": "when idle, how long to wait for more requests after the first one"})
    dtype: DType = field(default="auto", metadata={
        "help": "auto: bfloat16 on GPU, float32 on CPU"})
    device: Device = field(default="auto", metadata={"help": "auto: cuda when available"})
    log_level: LogLevel = field(default="info", metadata={"help": "server log level"})
    access_log: bool = field(default=True, metadata={"help": "log one line per request"})
    max_concurrent_requests: int = field(default=512, metadata={
        "help": "most requests served at once (TEI's default); one more is answered 429 with "
                "Retry-After at once, not queued; a stream holds its place while it lasts"})
    max_request_bytes: int = field(default=8 * 1024 * 1024, metadata={
        "help": "largest request body in bytes (default 8 MiB); a larger one gets 413, refused "
                "by its Content-Length before it is read, or once a chunked body passes it"})
    max_prompts_per_request: int = field(default=64, metadata={
        "help": "most prompts in one /v1/completions request"})
    default_chat_max_tokens: int = field(default=1024, metadata={
        "help": "max_tokens of a chat request that gives none, lowered to the context the "
                "prompt leaves"})
    max_rerank_documents: int = field(default=100, metadata={
        "help": "most documents in one /v1/rerank request"})
    max_request_tokens: int = field(default=DEFAULT_MAX_REQUEST_TOKENS, metadata={
        "help": "most filter tokens one /v1/rerank, /v1/score or proxy request may use (the "
                "prompts of the windows the filter reads); a request over it gets 413 before "
                "any work (default: 100 documents read in 4 windows of the shipped filter's "
                "256 tokens, with room for their prompts)"})
    max_batch_tokens: int | None = field(default=None, metadata={
        "help": "most prompt tokens the engine prefills in one step, its sequences taken in "
                "turn from each request waiting, so a request sent while another's long work "
                "runs waits at most one step; default: 2048 on a GPU, 512 on CPU (where a "
                "step's time grows with its tokens)"})
    rerank: MCFConfig = field(default_factory=MCFConfig, metadata={
        "help": "/v1/rerank's filter rules, as MCF's (--mcf.*): the bar that decides `kept` "
                "(default MCF's: every document at or above the filter card's calibrated "
                "P(relevant) bar, and at least the best) and the sentence stage "
                "(sentence-stage: the default granularity of a request that names none)"})

    def __post_init__(self) -> None:
        at_least(1, max_batch_size=self.max_batch_size, max_batch_tokens=self.max_batch_tokens,
                 max_concurrent_requests=self.max_concurrent_requests,
                 max_request_bytes=self.max_request_bytes,
                 max_prompts_per_request=self.max_prompts_per_request,
                 default_chat_max_tokens=self.default_chat_max_tokens,
                 max_rerank_documents=self.max_rerank_documents,
                 max_request_tokens=self.max_request_tokens)
        if not self.batch_window_ms >= 0:  # NaN too
            raise ConfigError(f"batch_window_ms must be >= 0, got {self.batch_window_ms}")


@settings
class ServiceOptions:
    """How the embedded server is operated: its drain on SIGTERM and where its Prometheus
    metrics are served."""

    drain_timeout_s: float = field(default=30.0, metadata={
        "help": "on SIGTERM the server drains: new requests get 503 and /health turns "
                "unhealthy while the requests in flight finish, for at most this many seconds "
                "(those still running then are cancelled); then it exits 0"})
    metrics_port: int | None = field(default=None, metadata={
        "help": "serve the Prometheus metrics on this port of --host (no API key there) "
                "instead of at GET /metrics on the server's own port (under --api-key-env)"})

    def __post_init__(self) -> None:
        if not self.drain_timeout_s >= 0:  # NaN too
            raise ConfigError(f"drain_timeout_s must be >= 0 seconds, got "
                              f"{self.drain_timeout_s}")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in 1..65535, got {self.metrics_port}")


@settings
class ProxyOptions:
    """The filtering proxy (`--proxy-to`): the embedded server's /v1/chat/completions forwards
    to another OpenAI-compatible server, the documents a request marks filtered on the way."""

    proxy_to: str | None = field(default=None, metadata={
        "help": "the OpenAI base URL of the generator to forward /v1/chat/completions to (e.g. "
                "http://127.0.0.1:8001/v1); set, the chat endpoint is a proxy that filters the "
                "documents a request marks (README \"Use the filter in an existing "
                "application\")"})
    proxy_model: str | None = field(default=None, metadata={
        "help": "the `model` every forwarded request names; unset: the client's"})
    proxy_timeout: float = field(default=PROXY_TIMEOUT_S, metadata={
        "help": "seconds the upstream gets to answer (a stream: to start, then between "
                "chunks); past them the proxy answers 504"})
    proxy_filter: str | None = field(default=None, metadata={
        "help": "the served adapter (a NAME of --adapters) that filters; unset: the only one "
                f"given, or, when none is, the shipped filter, served as {DEFAULT_FILTER_NAME}"})
    proxy_api_key_env: str | None = field(default=None, metadata={
        "help": "send the upstream `Authorization: Bearer <key>`, the key read from this "
                "environment variable; unset: a client's Authorization header is forwarded "
                "when the proxy takes none itself (no --api-key-env)"})
    proxy_context_tokens: int | None = field(default=None, metadata={
        "help": "the context budget: the passages a request forwards hold at most this many "
                "tokens of the filter's tokenizer, the best context that fits (the kept ones "
                "whole, best first, while they fit, then the next one's kept sentences); a "
                "request's \"sieverag\": {\"context_tokens\": N} sets its own; unset: no "
                "budget"})

    def __post_init__(self) -> None:
        at_least(1, proxy_context_tokens=self.proxy_context_tokens)
        if self.proxy_to is None:
            given = [name for name in ("proxy_model", "proxy_filter", "proxy_api_key_env",
                                       "proxy_context_tokens")
                     if getattr(self, name) is not None]
            given += ["proxy_timeout"] if self.proxy_timeout != PROXY_TIMEOUT_S else []
            if given:
                flag = given[0].replace("_", "-")
                raise ConfigError(f"--{flag} needs --proxy-to (the generator to forward to)")
        elif not self.proxy_to.startswith(("http://", "https://")):
            raise ConfigError(f"proxy_to must be an http:// or https:// URL, got "
                              f"{self.proxy_to!r}")
        if not self.proxy_timeout > 0:
            raise ConfigError(f"proxy_timeout must be > 0 seconds, got {self.proxy_timeout}")
        for name in ("proxy_model", "proxy_filter", "proxy_api_key_env"):
            if getattr(self, name) == "":
                raise ConfigError(f"{name} must not be empty")


# `vllm serve` flags the launcher sets itself, each with the option that sets it.
_LAUNCHER_FLAGS = {
    "--host": "--host", "--port": "--port", "--served-model-name": "--model",
    "--enable-lora": "--adapters", "--lora-modules": "--adapters",
    "--max-lora-rank": "--adapters (the adapters' largest rank)",
    "--max-loras": "--adapters (their count)",
    "--tensor-parallel-size": "--vllm.tensor-parallel-size",
    "--gpu-memory-utilization": "--vllm.gpu-memory-utilization",
    "--max-model-len": "--vllm.max-model-len", "--max-logprobs": "--vllm.max-logprobs",
    "--enable-prefix-caching": "--vllm.prefix-caching",
    "--no-enable-prefix-caching": "--no-vllm.prefix-caching",
    "--api-key": "--api-key-env", "--model": "--model", "--dtype": "--vllm.dtype",
}


def vllm_extra_args(extra_args: str) -> list[str]:
    """`--vllm.extra-args` split as a shell splits it; a flag the launcher sets itself (in any
    spelling vLLM reads: `--max_model_len`, `--max-model-len=4096`) is refused, naming the
    option that sets it."""
    try:
        argv = shlex.split(extra_args)
    except ValueError as exc:
        raise ConfigError(f"--vllm.extra-args {extra_args!r} cannot be split ({exc}); quote "
                          "it as a shell would") from None
    for arg in argv:
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in _LAUNCHER_FLAGS:
            raise ConfigError(f"--vllm.extra-args sets {flag}, which the launcher sets from "
                              f"{_LAUNCHER_FLAGS[flag]}: use that instead")
    return argv


@settings
class VLLMOptions:
    """How `vllm serve` (`--engine vllm`) runs."""

    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs per model replica"})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "fraction of each GPU's memory vLLM may use"})
    max_model_len: int | None = field(default=None, metadata={
        "help": "context length cap; unset: the model's"})
    max_logprobs: int = field(default=20, metadata={
        "help": "most log-probs per token a request may ask for"})
    prefix_caching: bool = field(default=True, metadata={
        "help": "vLLM's automatic prefix caching (--enable-prefix-caching): the filter's and "
                "the judge's prompts share long instructions, computed once"})
    extra_args: str = field(default="", metadata={
        "help": "more `vllm serve` arguments, one string split as a shell splits it, e.g. "
                "'--enforce-eager --max-num-seqs 64'; a flag the launcher sets from another "
                "option is refused with that option's name"})
    dtype: VLLMDType = field(default="auto", metadata={
        "help": "weights and activations dtype (vLLM's --dtype); auto: the model's own on "
                "GPU, bfloat16 on CPU where the processor has it"})
    python: str | None = field(default=None, metadata={
        "help": "the Python of vLLM's environment (its bin/python); unset: "
                f"${VLLM_PYTHON_ENV}, then {VLLM_VENV}/ in the working folder or beside "
                "sieverag's checkout (`make vllm` makes it), then the Python of `vllm` on PATH"})
    cpu_kvcache_gib: int = field(default=2, metadata={
        "help": "CPU build: GiB of memory for the KV cache (VLLM_CPU_KVCACHE_SPACE)"})
    cpu_cores: str = field(default="auto", metadata={
        "help": "CPU build: the cores vLLM's threads run on (VLLM_CPU_OMP_THREADS_BIND): auto "
                "(vLLM's choice: one thread per physical core, one core kept for its "
                "scheduler), all (every core this process may use), or a list such as 0-7 or "
                "0,2,4"})
    startup_timeout_s: float = field(default=900.0, metadata={
        "help": "seconds to wait for /v1/models to answer"})
    stop_timeout_s: float = field(default=30.0, metadata={
        "help": "seconds a stopping vLLM gets before it is killed"})

    def __post_init__(self) -> None:
        at_least(1, tensor_parallel_size=self.tensor_parallel_size,
                 max_model_len=self.max_model_len, cpu_kvcache_gib=self.cpu_kvcache_gib)
        at_least(0, max_logprobs=self.max_logprobs)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")
        if not self.startup_timeout_s > 0 or not self.stop_timeout_s > 0:
            raise ConfigError(f"startup_timeout_s and stop_timeout_s must be > 0, got "
                              f"{self.startup_timeout_s} and {self.stop_timeout_s}")
        if self.cpu_cores not in ("auto", "all") and not _CORE_LIST.fullmatch(self.cpu_cores):
            raise ConfigError(f"cpu_cores must be auto, all or a list of cores such as 0-7 or "
                              f"0,2,4, got {self.cpu_cores!r}")
        if self.python is not None and not self.python:
            raise ConfigError("python must be the path of vLLM's environment's Python, got ''")
        vllm_extra_args(self.extra_args)  # refused now, not when vLLM starts

    @property
    def extra_argv(self) -> list[str]:
        """`extra_args` as vLLM's argv entries."""
        return vllm_extra_args(self.extra_args)


@settings
class LocalServerConfig(ServiceOptions, ProxyOptions, LocalOptions, ServedModelConfig):
    """What the embedded server serves and how; validated on construction."""

    def __post_init__(self) -> None:
        ServedModelConfig.__post_init__(self)
        LocalOptions.__post_init__(self)
        ProxyOptions.__post_init__(self)
        ServiceOptions.__post_init__(self)
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ConfigError(f"metrics_port must differ from port, both {self.port}")


@settings
class VLLMLaunchConfig(VLLMOptions, ServedModelConfig):
    """How to run `vllm serve`; validated on construction."""

    def __post_init__(self) -> None:
        ServedModelConfig.__post_init__(self)
        VLLMOptions.__post_init__(self)
        if self.port == 0:  # vLLM binds the port it is given; the launcher must know it
            raise ConfigError("port must be in 1..65535 for vllm, got 0")
