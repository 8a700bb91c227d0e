"""The model behind the embedded server: base weights, LoRA adapters by served name, tokenizer."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Device, DType
from sieverag.inference.llm.hf import load_causal_lm
from sieverag.inference.llm.kv import eos_token_ids
from sieverag.serving.adapters import Adapter
from sieverag.serving.errors import AdapterError


@dataclass
class ServedModel:
    """One base model plus its adapters; `activated(name)` selects what a forward pass runs."""

    name: str
    model: torch.nn.Module  # the PEFT model holding every adapter; the base when there is none
    base: torch.nn.Module  # the plain base model (no adapter layer in its path)
    tokenizer: PreTrainedTokenizerBase
    adapters: dict[str, str]  # served adapter name -> PEFT adapter name
    max_model_len: int
    eos_token_ids: frozenset[int]
    _active: str | None = field(default=None, init=False, repr=False)  # the adapter set last

    @property
    def names(self) -> list[str]:
        """Every name a request may give as `model`: the base first, then the adapters."""
        return [self.name, *self.adapters]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def activated(self, name: str) -> AbstractContextManager[torch.nn.Module]:
        """Context giving the module that computes as `name`: the plain base model for the
        base (PEFT's `disable_adapter` would cost more than a decode step: it walks every
        module on entry and exit), the PEFT model with that adapter set for an adapter."""
        if name == self.name:
            return nullcontext(self.base)
        if self._active != name:  # setting it walks every module: only on a change
            self.model.set_adapter(self.adapters[name])
            self._active = name
        return nullcontext(self.model)

    def adapter_key(self, name: str) -> str | None:
        """The PEFT adapter name behind served name `name`; None for the base."""
        return None if name == self.name else self.adapters[name]


def load_served_model(
    model: str, adapters: Sequence[Adapter], dtype: DType = "auto", device: Device = "auto"
) -> ServedModel:
    """Load the base model (shared per process) and, when adapters are given, a PEFT copy."""
    base, tokenizer = load_causal_lm(model, dtype, device)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"model {model!r} has no fast (tokenizers) tokenizer; the embedded "
                          "server needs one for token offsets: serve it with --engine vllm")
    max_model_len = getattr(base.config, "max_position_embeddings", None)
    if not isinstance(max_model_len, int):
        raise ConfigError(f"model {model!r} config has no max_position_embeddings; cannot tell "
                          "its context length")
    served = ServedModel(model, base, base, tokenizer, {}, max_model_len,
                         frozenset(eos_token_ids(base, tokenizer)))
    if adapters:
        served.model = _with_adapters(base, adapters)
        served.adapters = {a.name: f"adapter_{i}" for i, a in enumerate(adapters)}
    return served


def _with_adapters(base: torch.nn.Module, adapters: Sequence[Adapter]) -> torch.nn.Module:
    from peft import PeftModel

    first, *others = adapters
    # PEFT adapter names are module keys, so served names (which may hold '.') are not used.
    with _loading(first):
        # A private copy: LoRA layers injected into the process-wide cached model would change
        # what every other user of that model in this process computes.
        lm = PeftModel.from_pretrained(copy.deepcopy(base), first.path, adapter_name="adapter_0")
    for index, adapter in enumerate(others, start=1):
        with _loading(adapter):
            lm.load_adapter(adapter.path, adapter_name=f"adapter_{index}")
    return lm.to(next(base.parameters()).device).eval()


@contextmanager
def _loading(adapter: Adapter) -> Iterator[None]:
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise AdapterError(f"cannot load adapter {adapter.name!r} from {adapter.path} onto the "
                           f"base model: {exc}; was it trained on this base model?") from exc

