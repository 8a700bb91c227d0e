"""Backends by kind: a spec in a run config → one LLMBackend object per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import field
from typing import Literal

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import ContextOverflow, Device, DType
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.llm.context_guard import (
    check_context_settings,
    context_length_field,
    context_overflow_field,
)
from sieverag.inference.llm.hf import PREFILL_TOKEN_BUDGET, HFBackend, HFBackendConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, EMBEDDED_MODELS, resolve_model
from sieverag.inference.llm.prompt_lookup import DEFAULT_DRAFT_TOKENS

BackendKind = Literal["hf", "openai"]


@settings
class BackendSpec:
    """One model role: in-process (`model` [+ `adapter`], run by transformers) or served
    (`endpoint` + the served `model` name, any OpenAI-compatible server)."""

    model: str | None = field(default=None, metadata={
        "help": f"in-process: embedded name or local folder (default {DEFAULT_MODEL}); served: "
                "the model name the server knows (e.g. an adapter's name), required"})
    endpoint: str | None = field(default=None, metadata={
        "help": "served: the server's base URL, e.g. http://127.0.0.1:8000/v1 (unset: "
                "in-process)"})
    adapter: str | None = field(default=None, metadata={
        "help": "in-process: a PEFT LoRA adapter folder, or a filter's name "
                "(`sieverag filter list`)"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "served: environment variable holding the API key"})
    chat_template_model: str | None = field(default=None, metadata={
        "help": "served: local tokenizer folder or embedded name rendering chat prompts for "
                "scoring"})
    missing_label_logprob: Literal["exact", "topk_min"] = field(default="exact", metadata={
        "help": "served: a label absent from the server's top-k log-probs: exact (scored as "
                "the whole reply; needs chat_template_model) or topk_min (the smallest top-k "
                "log-prob, an upper bound)"})
    dtype: DType = field(default="auto", metadata={
        "help": "in-process weights dtype (auto: bf16 on GPU, fp32 on CPU)"})
    device: Device = field(default="auto", metadata={
        "help": "in-process: auto (cuda:0 when a GPU is present, else cpu), cpu, cuda or cuda:N; "
                "roles on one base model, dtype and device share one copy of its weights"})
    batch_size: int = field(default=16, metadata={"help": "in-process: prompts per forward pass"})
    batch_tokens: int = field(default=PREFILL_TOKEN_BUDGET, metadata={
        "help": "in-process: prompt tokens per prefill pass (rows x the longest, padding "
                f"included; default {PREFILL_TOKEN_BUDGET}, tuned on 2 CPU cores: a GPU "
                "takes more)"})
    draft_tokens: int = field(default=DEFAULT_DRAFT_TOKENS, metadata={
        "help": "in-process: greedy decoding of one prompt checks up to this many tokens a "
                "step, drafted from the prompt and reply so far (0: one token a step)"})
    max_concurrency: int = field(default=8, metadata={"help": "served: requests in flight"})
    context_length: int | None = context_length_field()
    context_overflow: ContextOverflow = context_overflow_field()

    def __post_init__(self) -> None:
        if self.model is None:
            if self.endpoint is not None:
                raise ConfigError(f"a model served at {self.endpoint} needs its name there: set "
                                  "`model` (e.g. --models.filter.model smollm2-filter)")
            object.__setattr__(self, "model", DEFAULT_MODEL)
        if self.endpoint is not None and self.adapter is not None:
            raise ConfigError(
                f"adapter {self.adapter!r} is for an in-process model; a served adapter is "
                "named by `model` (the name the server gives it)")
        if self.endpoint is None and self.missing_label_logprob != "exact":
            raise ConfigError(
                f"missing_label_logprob {self.missing_label_logprob!r} applies to a served model "
                "(one with `endpoint`); an in-process model scores every label exactly, so "
                "leave it unset")
        at_least(1, batch_size=self.batch_size, batch_tokens=self.batch_tokens,
                 max_concurrency=self.max_concurrency)
        at_least(0, draft_tokens=self.draft_tokens)
        check_context_settings(
            self.context_length, self.context_overflow,
            counts_tokens=self.endpoint is None or self.chat_template_model is not None,
            where=f" for the model served at {self.endpoint}")

    @property
    def kind(self) -> BackendKind:
        """`openai` when served, `hf` when in-process."""
        return "openai" if self.endpoint else "hf"


def _build_hf(spec: BackendSpec) -> LLMBackend:
    return HFBackend(HFBackendConfig(model=spec.model, dtype=spec.dtype, device=spec.device,
                                     batch_size=spec.batch_size,
                                     batch_tokens=spec.batch_tokens, adapter=spec.adapter,
                                     draft_tokens=spec.draft_tokens,
                                     context_length=spec.context_length,
                                     context_overflow=spec.context_overflow))


def _build_openai(spec: BackendSpec) -> LLMBackend:
    from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

    template_model = spec.chat_template_model
    if template_model in EMBEDDED_MODELS:  # an embedded name means its converted folder
        template_model = str(resolve_model(template_model))
    return OpenAIBackend(OpenAIBackendConfig(
        base_url=spec.endpoint or "", model=spec.model, api_key_env=spec.api_key_env,
        max_concurrency=spec.max_concurrency, chat_template_model=template_model,
        context_length=spec.context_length, context_overflow=spec.context_overflow,
        missing_label_logprob=spec.missing_label_logprob,
    ))


BACKEND_BUILDERS: dict[str, Callable[[BackendSpec], LLMBackend]] = {
    "hf": _build_hf,
    "openai": _build_openai,
}


@functools.cache
def build_backend(spec: BackendSpec) -> LLMBackend:
    """The backend for `spec`; equal specs share one backend (and one loaded model)."""
    return BACKEND_BUILDERS[spec.kind](spec)
