"""Backends by kind: a spec in a run config → one LLMBackend object per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sieverag.inference.errors import ConfigError
from sieverag.inference.llm.base import LLMBackend
from sieverag.inference.llm.hf import Device, DType, HFBackend, HFBackendConfig
from sieverag.inference.llm.models import DEFAULT_MODEL, EMBEDDED_MODELS, resolve_model

BackendKind = Literal["hf", "openai"]


@dataclass(frozen=True)
class BackendSpec:
    """Which model answers, and where it runs (in-process `hf`, or a served `openai` endpoint)."""

    kind: BackendKind = field(default="hf", metadata={"help": "hf (in-process) or openai (server)"})
    model: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "embedded name or local folder (hf); served name (openai)"})
    endpoint: str | None = field(
        default=None, metadata={"help": "base URL, e.g. http://127.0.0.1:8000/v1"})
    api_key_env: str | None = field(default=None, metadata={"help": "env var holding the API key"})
    chat_template_model: str | None = field(
        default=None,
        metadata={"help": "openai: local tokenizer that renders chat prompts for scoring"})
    dtype: DType = field(default="auto", metadata={"help": "hf: auto, float32, bfloat16, float16"})
    device: Device = field(default="auto", metadata={"help": "hf: auto, cpu, cuda"})
    batch_size: int = field(default=16, metadata={"help": "hf: prompts per forward pass"})
    adapter: str | None = field(default=None, metadata={"help": "hf: PEFT LoRA adapter folder"})
    max_concurrency: int = field(default=8, metadata={"help": "openai: requests in flight"})

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_BUILDERS:
            raise ConfigError(f"backend kind must be one of {sorted(BACKEND_BUILDERS)}, "
                              f"got {self.kind!r}")
        if self.kind == "openai" and not self.endpoint:
            raise ConfigError("an openai backend needs an endpoint (e.g. http://127.0.0.1:8000/v1)")
        if self.batch_size < 1 or self.max_concurrency < 1:
            raise ConfigError("batch_size and max_concurrency must be >= 1")


def _build_hf(spec: BackendSpec) -> LLMBackend:
    return HFBackend(HFBackendConfig(model=spec.model, dtype=spec.dtype, device=spec.device,
                                     batch_size=spec.batch_size, adapter=spec.adapter))


def _build_openai(spec: BackendSpec) -> LLMBackend:
    from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

    template_model = spec.chat_template_model
    if template_model in EMBEDDED_MODELS:  # an embedded name means its converted folder
        template_model = str(resolve_model(template_model))
    return OpenAIBackend(OpenAIBackendConfig(
        base_url=spec.endpoint or "", model=spec.model, api_key_env=spec.api_key_env,
        max_concurrency=spec.max_concurrency, chat_template_model=template_model,
    ))


BACKEND_BUILDERS: dict[str, Callable[[BackendSpec], LLMBackend]] = {
    "hf": _build_hf,
    "openai": _build_openai,
}


@functools.cache
def build_backend(spec: BackendSpec) -> LLMBackend:
    """The backend for `spec`; equal specs share one backend (and one loaded model)."""
    return BACKEND_BUILDERS[spec.kind](spec)
