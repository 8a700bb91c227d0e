"""The model behind the embedded server: base weights, LoRA adapters by served name, tokenizer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Device, DType
from sieverag.inference.llm.hf import SharedBase, load_causal_lm, shared_base
from sieverag.inference.llm.kv import eos_token_ids
from sieverag.serving.adapters import Adapter
from sieverag.serving.errors import AdapterError


@dataclass
class ServedModel:
    """One base model plus its adapters; `activated(name)` selects what a forward pass runs.

    The adapters live on the process's one copy of the base model (`hf.SharedBase`: the
    generator, judge and filter roles of this process run on the same weights), so a pass
    takes its turn on that model with its adapter's layers on, or all off for the base."""

    name: str
    base: torch.nn.Module  # the loaded base model (its adapter layers, if any, are off for it)
    tokenizer: PreTrainedTokenizerBase
    adapters: dict[str, str]  # served adapter name -> PEFT adapter name
    max_model_len: int
    eos_token_ids: frozenset[int]
    shared: SharedBase = field(repr=False)

    @property
    def model(self) -> torch.nn.Module:
        """The PEFT model holding every adapter; the base when this server serves none."""
        return self.shared.wrapper if self.adapters else self.base

    @property
    def names(self) -> list[str]:
        """Every name a request may give as `model`: the base first, then the adapters."""
        return [self.name, *self.adapters]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def activated(self, name: str) -> Iterator[torch.nn.Module]:
        """Context giving the module that computes as `name`, holding the shared base's turn:
        the base model with every adapter layer off for the base, the PEFT model with that
        adapter's layers on for an adapter."""
        key = self.adapter_key(name)
        with self.shared.running(key):
            yield self.base if key is None else self.model

    def adapter_key(self, name: str) -> str | None:
        """The PEFT adapter name behind served name `name`; None for the base."""
        return None if name == self.name else self.adapters[name]


def load_served_model(
    model: str, adapters: Sequence[Adapter], dtype: DType = "auto", device: Device = "auto"
) -> ServedModel:
    """Load the base model (shared per process) and attach the adapters to it."""
    base, tokenizer = load_causal_lm(model, dtype, device)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"model {model!r} has no fast (tokenizers) tokenizer; the embedded "
                          "server needs one for token offsets: serve it with --engine vllm")
    max_model_len = getattr(base.config, "max_position_embeddings", None)
    if not isinstance(max_model_len, int):
        raise ConfigError(f"model {model!r} config has no max_position_embeddings; cannot tell "
                          "its context length")
    shared = shared_base(base)
    names = {}
    for adapter in adapters:
        with _loading(adapter):
            names[adapter.name] = shared.attach(adapter.path)
    return ServedModel(model, base, tokenizer, names, max_model_len,
                       frozenset(eos_token_ids(base, tokenizer)), shared)


@contextmanager
def _loading(adapter: Adapter) -> Iterator[None]:
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise AdapterError(f"cannot load adapter {adapter.name!r} from {adapter.path} onto the "
                           f"base model: {exc}; was it trained on this base model?") from exc

