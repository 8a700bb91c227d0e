"""LLM backends behind one protocol (`LLMBackend`: generate, label_logprobs,
continuation_logprob): `hf` in-process transformers and `openai_backend` for any
OpenAI-compatible server (its requests sent by `openai_transport`). `build_backend(BackendSpec)`
makes one; `resolve_model` finds embedded models; `context_guard.ContextGuard` fits every prompt to
the model's context (cut or refused)."""

from sieverag.inference.llm.backend_protocol import (
           GenerationSettings,
           LLMBackend,
           Usage,
           UsageMeter,
)
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend

__all__ = ["BackendSpec", "GenerationSettings", "LLMBackend", "Usage", "UsageMeter",
           "build_backend"]
