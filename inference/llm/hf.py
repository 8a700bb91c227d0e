"""The `hf` backend: transformers in-process, batched with left padding, CPU or GPU.

Every prompt goes through the context guard (inference/llm/context_guard.py) before it runs: the
model's context is `context_length`, by default the model's own (its config's
`max_position_embeddings`). This module loads the model, batches and prefills prompts and
scores them; greedy replies then decode in inference/llm/greedy.py (rows leaving as they end,
prompt-lookup drafts, each reply kept in the prompt cache)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least
from sieverag.inference.core.types import (
    ContextOverflow,
    Conversation,
    Device,
    DType,
    check_device,
    check_device_present,
)
from sieverag.inference.llm import greedy, kv
from sieverag.inference.llm.backend_protocol import (
    GenerationSettings,
    Usage,
    UsageMeter,
    chat_prompt_text,
    check_continuations,
    check_labels,
    check_single_token_labels,
    cut_at_stop,
    labels_as_replies,
    marked_prompt_ids,
    metered,
)
from sieverag.inference.llm.chat_template import load_tokenizer
from sieverag.inference.llm.context_guard import (
    ContextGuard,
    FittedPrompt,
    check_context_settings,
    context_length_field,
    context_overflow_field,
)
from sieverag.inference.llm.decode_step import Decoder
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model
from sieverag.inference.llm.prompt_cache import KeptBatch, PromptCache
from sieverag.inference.llm.prompt_lookup import DEFAULT_DRAFT_TOKENS

# Prompt tokens per prefill pass. On CPU a wide pass is slower per token than a narrow one
# (its activations spill out of the caches). SmolLM2-135M, float32, 2 cores, Yes/No reads of
# 16 HotpotQA prompts of ~1,250 tokens / of 64 passage prompts of ~200 tokens, tokens/s:
# budget 512: 900 / 1,065; 1,024: 925 / 1,088; 2,048: 900 / 1,009; 4,096: 745 / 946; no
# budget (16 rows a pass): 311 / 688. Decoding, bandwidth-bound, still gains from many rows:
# greedy replies prefill in passes of this budget, then decode together.
PREFILL_TOKEN_BUDGET = 1024


@dataclass(frozen=True)
class HFBackendConfig:
    """How to load and batch an in-process transformers model."""

    model: str = field(default=DEFAULT_MODEL, metadata={"help": "embedded name or local folder"})
    dtype: DType = field(default="auto", metadata={"help": "auto: bfloat16 on GPU, float32 on CPU"})
    device: Device = field(default="auto", metadata={
        "help": "auto (cuda:0 when a GPU is present, else cpu), cpu, cuda or cuda:N"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    batch_tokens: int = field(default=PREFILL_TOKEN_BUDGET, metadata={
        "help": "prompt tokens per prefill pass (rows x the longest, padding included; a longer "
                "prompt runs alone); greedy replies of several passes then decode together"})
    adapter: str | None = field(default=None, metadata={"help": "PEFT LoRA adapter folder"})
    shared_prefix_min_tokens: int = field(default=32, metadata={
        "help": "a batch whose prompts share at least this many leading tokens computes them "
                "once and reuses their KV cache for every row; 0 turns this off"})
    prompt_cache_tokens: int = field(default=8192, metadata={
        "help": "keep the KV of the last generate call's prompts (and greedy replies), up to "
                "this many positions; a generate or label_logprobs call whose prompts extend "
                "them computes only the new tokens (MAIN-RAG's judge continuing the predictor's "
                "conversation, amber's memory agents); 0 turns this off"})
    draft_tokens: int = field(default=DEFAULT_DRAFT_TOKENS, metadata={
        "help": "greedy decoding of a single prompt checks up to this many tokens a step, "
                "drafted from the prompt and reply so far (prompt lookup: each kept token is "
                "still the model's own choice); 0 decodes one token a step"})
    context_length: int | None = context_length_field()
    context_overflow: ContextOverflow = context_overflow_field()

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        try:
            check_device(self.device)
        except ValueError as error:
            raise ConfigError(f"device: {error}") from None
        at_least(1, batch_size=self.batch_size, batch_tokens=self.batch_tokens)
        at_least(0, shared_prefix_min_tokens=self.shared_prefix_min_tokens,
                 prompt_cache_tokens=self.prompt_cache_tokens, draft_tokens=self.draft_tokens)
        check_context_settings(self.context_length, self.context_overflow)


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Leading tokens common to every sequence, leaving each at least one token of its own."""
    limit = min(len(s) for s in sequences) - 1
    first = sequences[0]
    length = 0
    while length < limit and all(s[length] == first[length] for s in sequences):
        length += 1
    return length


def model_context_length(model: torch.nn.Module, name: str) -> int:
    """The context length `model`'s config declares; `ConfigError` when it declares none."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(model.config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ConfigError(f"model {name!r} declares no context length in its config "
                      "(max_position_embeddings); set context_length")


def reply_token_ids(tokenizer: PreTrainedTokenizerBase, prompt_text: str,
                    prompt_ids: Sequence[int], reply: str) -> list[int]:
    """Token ids of `reply` as the model would emit it right after `prompt_text` (whose ids
    are `prompt_ids`): how every in-process scorer (this backend, the embedded server) reads
    a label or a continuation."""
    joint = tokenizer(prompt_text + reply, add_special_tokens=False)["input_ids"]
    if joint[: len(prompt_ids)] == list(prompt_ids) and len(joint) > len(prompt_ids):
        return joint[len(prompt_ids):]
    # The reply merged with the prompt's last token: fall back to tokenising it alone.
    return tokenizer(reply, add_special_tokens=False)["input_ids"]


def _pick_dtype(dtype: DType, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def load_causal_lm(
    model: str, dtype: DType = "auto", device: Device = "auto"
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load (once per process) a causal LM and its left-padding tokenizer, in eval mode.

    Requests that come to the same folder, precision and GPU share one load ("auto" and
    "cuda" are resolved first: on a one-GPU machine, auto, cuda and cuda:0 are one model);
    a GPU this machine lacks is a `ConfigError` (`check_device_present`)."""
    device_name = check_device_present(device)
    return _load_causal_lm(str(resolve_model(model)), _pick_dtype(dtype, device_name),
                           device_name)


@functools.cache
def _load_causal_lm(path: str, dtype: torch.dtype, device: str
                    ) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    lm.to(device).eval()
    return lm, tokenizer


class SharedBase:
    """One loaded base model and every LoRA adapter loaded onto it, for all the roles that run
    on it (generator, judge, scorer without adapter; filters with one).

    The adapters live in one PEFT wrapper around the base itself (no copy: LoRA layers are
    injected in place), each under its own name. Which one a call runs is switched per call
    (`running`); outside any call the adapter layers are off, so the base computes as loaded.
    Calls from several threads take turns (one lock), as they would on one device anyway."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.wrapper: torch.nn.Module | None = None  # the PeftModel, once an adapter is loaded
        self.lock = threading.RLock()
        self._active: str | None = None  # the adapter the layers run now (None: the base)
        self._lora_layers: list[torch.nn.Module] = []  # the wrapper's adapter layers

    def attach(self, adapter: str) -> str:
        """Load `adapter` (a folder) onto the base once; its PEFT name."""
        from peft import PeftModel
        from peft.tuners.tuners_utils import BaseTunerLayer

        folder = Path(adapter).resolve()
        # PEFT adapter names cannot contain dots, so a path hash names each adapter.
        name = "adapter_" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
        with self.lock:
            if self.wrapper is None:
                self.wrapper = PeftModel.from_pretrained(self.model, str(folder),
                                                         adapter_name=name)
                self.wrapper.eval()
            elif name not in self.wrapper.peft_config:
                self.wrapper.load_adapter(str(folder), adapter_name=name)
                self.wrapper.to(next(self.model.parameters()).device).eval()
            else:
                return name
            self._lora_layers = [module for module in self.wrapper.modules()
                                 if isinstance(module, BaseTunerLayer)]
            self._active = name
            self._switch(None)
        return name

    @contextlib.contextmanager
    def running(self, adapter: str | None) -> Iterator[None]:
        """Run with `adapter`'s layers on (None: all off, the plain base), then as before."""
        with self.lock:
            previous = self._active
            self._switch(adapter)
            try:
                yield
            finally:
                self._switch(previous)

    def _switch(self, adapter: str | None) -> None:
        """Turn the adapter layers to `adapter` (None: off).

        The served engine switches twice per forward pass, so this sets the two fields each
        LoRA layer's forward reads (`_active_adapter`, `_disable_adapters`) on layers listed
        once per attach. PEFT's own `set_adapter` / `disable_adapter_layers` walk every module
        and reset `requires_grad` on every adapter weight each time: ≈ 25 ms a switch on
        SmolLM2-135M, for weights that are never trained here (loaded for inference, frozen).
        `tests/inference/llm/test_shared_base.py` checks each role against it loaded alone."""
        if self.wrapper is None or adapter == self._active:
            return
        for layer in self._lora_layers:
            if adapter is not None:
                layer._active_adapter = [adapter]
            layer._disable_adapters = adapter is None
        if adapter is not None:
            self.wrapper.base_model.active_adapter = adapter
        self._active = adapter


# The `SharedBase` of each loaded base model (by identity: `_load_causal_lm` keeps them alive).
_SHARED_BASES: dict[int, SharedBase] = {}
_SHARED_BASES_LOCK = threading.Lock()


def shared_base(model: torch.nn.Module) -> SharedBase:
    """The one `SharedBase` of a loaded base model."""
    with _SHARED_BASES_LOCK:
        shared = _SHARED_BASES.get(id(model))
        if shared is None:
            shared = _SHARED_BASES[id(model)] = SharedBase(model)
        return shared


def attach_adapter(base: torch.nn.Module, adapter: str) -> tuple[torch.nn.Module, str]:
    """The PEFT model over `base` (no copy) with `adapter` loaded (once), and the adapter's
    name; run it inside `shared_base(base).running(name)`."""
    shared = shared_base(base)
    name = shared.attach(adapter)
    return shared.wrapper, name


def _in_adapter_scope(operation: Callable) -> Callable:
    """Run a backend operation inside its `adapter_scope`."""

    @functools.wraps(operation)
    def scoped(self: HFBackend, *args, **kwargs):
        with self.adapter_scope():
            return operation(self, *args, **kwargs)

    return scoped


class HFBackend:
    """LLMBackend on an in-process transformers model (see inference/llm/backend_protocol.py)."""

    def __init__(self, config: HFBackendConfig = HFBackendConfig()) -> None:
        self.config = config
        self.base_model, self.tokenizer = load_causal_lm(config.model, config.dtype, config.device)
        self.shared = shared_base(self.base_model)
        self.model, self.adapter_name = self.base_model, None
        if config.adapter is not None:
            self.model, self.adapter_name = attach_adapter(self.base_model, config.adapter)
        self.device = next(self.model.parameters()).device
        self.decoder = Decoder(self.model)  # greedy decoding's steps
        self.meter = UsageMeter()
        self.prompt_cache = PromptCache(config.prompt_cache_tokens)
        self.context_guard = ContextGuard(
            self.tokenizer, self.render,
            config.context_length or model_context_length(self.base_model, config.model),
            config.context_overflow, model=self.model_name)

    @property
    def model_name(self) -> str:
        return self.config.model if self.config.adapter is None else self.config.adapter

    def adapter_scope(self) -> contextlib.AbstractContextManager[None]:
        """Run with this backend's own adapter on, or with none for a base role (roles on one
        base share its weights and switch per call: `SharedBase`)."""
        return self.shared.running(self.adapter_name)

    # ----- prompt rendering and tokenisation -----

    def render(self, conversation: Conversation) -> str:
        """The chat-templated prompt text, ending with the assistant prefix."""
        return chat_prompt_text(self.tokenizer, conversation)

    def prompt_ids(self, conversation: Conversation) -> list[int]:
        return self.tokenizer(self.render(conversation), add_special_tokens=False)["input_ids"]

    def fit(self, prompts: Sequence[Conversation], reserved: int | Sequence[int], *,
            agent: str, reserved_for: str = "new tokens") -> list[FittedPrompt]:
        """The prompts as they will run: through the context guard (inference/llm/context_guard.py),
        with `reserved` tokens left after each."""
        return self.context_guard.fit(prompts, reserved, agent=agent, reserved_for=reserved_for)

    def record_usage(self, agent: str, fitted: Sequence[FittedPrompt], tokens: Sequence[int],
                     completion_tokens: Sequence[int] | None = None) -> None:
        """Meter one call prompt by prompt: each prompt's `tokens` read, `completion_tokens`
        written (none when not given) and the cut the guard made (so a call that serves
        several questions gives each its own counts)."""
        written = completion_tokens if completion_tokens is not None else [0] * len(fitted)
        self.meter.record_rows(agent, [
            Usage(1, read, wrote, 1 if f.tokens_dropped else 0, f.tokens_dropped)
            for f, read, wrote in zip(fitted, tokens, written, strict=True)])

    def reply_ids(self, prompt_text: str, prompt_ids: list[int], reply: str) -> list[int]:
        """Token ids of `reply` as the model would emit it right after `prompt_text`."""
        return reply_token_ids(self.tokenizer, prompt_text, prompt_ids, reply)

    def _batches(self, sequences: Sequence[list[int]], *, rows_only: bool = False
                 ) -> Iterator[list[int]]:
        """Indices of `sequences` grouped into batches of similar length (less padding), in
        ascending length: at most `batch_size` rows and (unless `rows_only`) `batch_tokens`
        padded tokens, at least one row."""
        budget = None if rows_only else self.config.batch_tokens
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        batch: list[int] = []
        for index in order:  # ascending: the newest row is the batch's longest
            if batch and (len(batch) == self.config.batch_size or (
                    budget is not None and (len(batch) + 1) * len(sequences[index]) > budget)):
                yield batch
                batch = []
            batch.append(index)
        if batch:
            yield batch

    def _shared_prefix(self, sequences: Sequence[list[int]], prefix_limit: int | None = None
                       ) -> tuple[int, DynamicCache | None]:
        """The leading tokens all `sequences` share (at most `prefix_limit`) and their KV cache,
        run once at batch size 1; (0, None) when they share fewer than
        `shared_prefix_min_tokens`."""
        shared = shared_prefix_length(sequences) if len(sequences) > 1 else 0
        if prefix_limit is not None:
            shared = min(shared, prefix_limit)
        minimum = self.config.shared_prefix_min_tokens
        if minimum == 0 or shared < minimum:
            return 0, None
        return shared, kv.prefill(self.model, sequences[0][:shared], self.device)

    def _batch_inputs(self, sequences: Sequence[list[int]], prefix_limit: int | None = None,
                      prefix: tuple[int, DynamicCache | None] | None = None
                      ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Model inputs for one batch, and the full (prefix + padded) ids of every row.

        Where the rows share a long enough prefix (system prompt, question, ...), it is run
        once at batch size 1 and its KV cache is repeated for every row; the rows' own tokens
        then follow it, left-padded, so the pads sit between prefix and suffix, masked out.
        Scores agree with the plain padded batch to float rounding (tested). `prefix_limit`
        caps the prefix (continuation scoring keeps the reply out of it); `prefix` is one
        `_shared_prefix` already run for these rows (and others: a call's passes share it)."""
        shared, cache = prefix if prefix is not None else self._shared_prefix(sequences,
                                                                                prefix_limit)
        pad = self.tokenizer.pad_token_id
        if cache is None:
            inputs = kv.left_pad(sequences, pad, device=self.device)
            return inputs, inputs["input_ids"]
        prefix_mask = torch.ones((len(sequences), shared), dtype=torch.long, device=self.device)
        inputs = kv.continue_inputs([s[shared:] for s in sequences], pad,
                                    kv.expand_cache(cache, len(sequences)), prefix_mask)
        prefix_ids = torch.tensor([sequences[0][:shared]], dtype=torch.long, device=self.device)
        return inputs, torch.cat([prefix_ids.expand(len(sequences), -1), inputs["input_ids"]],
                                 dim=1)

    # ----- the three operations -----

    @_in_adapter_scope
    @torch.inference_mode()
    @metered
    def generate(
        self,
        prompts: Sequence[Conversation],
        settings: GenerationSettings = GenerationSettings(),
        *,
        agent: str = "generator",
    ) -> list[str]:
        fitted = self.fit(prompts, settings.max_new_tokens, agent=agent)
        encoded = [f.ids for f in fitted]
        replies: list[str] = [""] * len(prompts)
        completion_tokens = [0] * len(prompts)
        eos_ids = self._stop_token_ids()
        # Greedy prompts that extend the last call's prompts (amber's memory agents: each
        # continues the conversation before it) run only their new tokens.
        previous = self.prompt_cache.batches
        extending = self.prompt_cache.lookup(encoded) if settings.temperature == 0 else {}
        self.prompt_cache.clear()
        fresh = [i for i in range(len(encoded)) if i not in extending]
        sampled = settings.temperature > 0
        # Greedy rows decode together in batches of rows only, each prefilled in passes of
        # `batch_tokens` (`_greedy_rows`); sampled ones run through `generate` a batch at a time.
        fresh_batches = self._batches_of(encoded, fresh, rows_only=not sampled)
        for batch, continued in itertools.chain(
                self._continuation_batches(encoded, extending, previous),
                ((b, None) for b in fresh_batches)):
            rows = [encoded[i] for i in batch]
            if continued is not None:
                new_tokens = self._greedy(continued, settings, eos_ids, rows)
            elif sampled:
                new_tokens = self._sample(*self._batch_inputs(rows), settings, eos_ids, rows)
            else:
                new_tokens = self._greedy_rows(rows, settings, eos_ids)
            for tokens, index in zip(new_tokens, batch, strict=True):
                completion_tokens[index] = len(tokens)
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                replies[index] = cut_at_stop(text, settings.stop)
        self.record_usage(agent, fitted, list(map(len, encoded)), completion_tokens)
        return replies

    def _greedy(self, inputs: dict[str, torch.Tensor], settings: GenerationSettings,
                eos_ids: Sequence[int], rows: Sequence[list[int]]) -> list[list[int]]:
        """Greedy decoding of one batch from its model inputs (one prefill pass)."""
        return self._decode(*self._prefill(inputs, rows), settings, eos_ids, rows)

    def _prefill(self, inputs: dict[str, torch.Tensor], rows: Sequence[list[int]]
                 ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prefill pass: its growing cache (kept in the prompt cache first), attention
        mask, each row's last position and last logits."""
        output = self.model(**inputs, use_cache=True, logits_to_keep=1)
        cache = output.cache
        self.prompt_cache.keep(rows, cache, inputs["attention_mask"])
        kv.make_growing(cache)  # each step then writes its column in place
        return (cache, inputs["attention_mask"], inputs["position_ids"][:, -1:],
                output.logits[:, -1, :])

    def _greedy_rows(self, rows: Sequence[list[int]], settings: GenerationSettings,
                     eos_ids: Sequence[int]) -> list[list[int]]:
        """Greedy decoding of `rows` (ascending length): prefilled in passes of at most
        `batch_tokens` padded tokens (`_batches`), then decoded together from their caches
        joined into one (`kv.join_all`); a model whose cache cannot be joined decodes each
        pass's rows on their own."""
        passes = [[rows[i] for i in batch] for batch in self._batches(rows)]
        # A prefix every row shares (MAIN-RAG's Agent-1: system prompt and question) is run
        # once for all passes; otherwise each pass looks for its own.
        prefix = self._shared_prefix(rows) if len(passes) > 1 else (0, None)
        prefilled = [self._prefill(self._batch_inputs(
            part, prefix=prefix if prefix[1] is not None else None)[0], part) for part in passes]
        if len(prefilled) > 1 and all(kv.is_growing(p[0]) for p in prefilled):
            cache, mask = kv.join_all([p[0] for p in prefilled], [p[1] for p in prefilled])
            positions = torch.cat([p[2] for p in prefilled])
            logits = torch.cat([p[3] for p in prefilled])
            return self._decode(cache, mask, positions, logits, settings, eos_ids, rows)
        return [tokens for part, state in zip(passes, prefilled, strict=True)
                for tokens in self._decode(*state, settings, eos_ids, part)]

    def _decode(self, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor,
                logits: torch.Tensor, settings: GenerationSettings, eos_ids: Sequence[int],
                rows: Sequence[list[int]]) -> list[list[int]]:
        """Greedy decoding of prefilled rows (inference/llm/greedy.py) on this backend's decoder
        and adapter; the replies are kept in its prompt cache."""
        return greedy.decode(
            lambda ids, at, attended: self.decoder(ids, at, attended, cache,
                                                   adapter=self.adapter_name),
            cache, mask, positions, logits, rows, settings, eos_ids, tokenizer=self.tokenizer,
            draft_tokens=self.config.draft_tokens, prompt_cache=self.prompt_cache)

    def _sample(self, inputs: dict[str, torch.Tensor], full_ids: torch.Tensor,
                settings: GenerationSettings, eos_ids: Sequence[int],
                rows: Sequence[list[int]]) -> list[list[int]]:
        """Sampled decoding of one batch with transformers' generate: each row's new tokens
        up to its first EOS."""
        prompt_mask = inputs["attention_mask"]
        # generate takes every id (it skips those already in the cache) and derives the
        # positions from the mask itself.
        inputs = {**inputs, "input_ids": full_ids}
        inputs.pop("position_ids")
        output = self.model.generate(
            **inputs,
            max_new_tokens=settings.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=list(eos_ids),
            stop_strings=list(settings.stop) or None,
            tokenizer=self.tokenizer if settings.stop else None,
            top_p=None, top_k=None,
            return_dict_in_generate=True,
            do_sample=True, temperature=settings.temperature,
        )
        self.prompt_cache.keep(rows, output.cache, prompt_mask)
        new_tokens = output.sequences[:, full_ids.shape[1]:].tolist()
        return [row[:next((n for n, t in enumerate(row) if t in eos_ids), len(row))]
                for row in new_tokens]

    @_in_adapter_scope
    @torch.inference_mode()
    @metered
    def label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[dict[str, float]]:
        check_labels("label_logprobs", labels)
        fitted = self.fit(prompts, 1, agent=agent, reserved_for="label token")
        texts = [f.text for f in fitted]
        encoded = [f.ids for f in fitted]
        label_ids = [[self.reply_ids(t, ids, label) for label in labels]
                     for t, ids in zip(texts, encoded, strict=True)]
        if any(len(ids) != 1 for row in label_ids for ids in row):
            return labels_as_replies(self, prompts, labels, agent=agent)
        results: list[dict[str, float]] = [{} for _ in prompts]
        extending = self.prompt_cache.lookup(encoded)
        fresh = [i for i in range(len(encoded)) if i not in extending]
        fresh_batches = ((b, self._batch_inputs([encoded[i] for i in b])[0])
                         for b in self._batches_of(encoded, fresh))
        # Chained generators: one batch's inputs (and selected cache) alive at a time.
        for batch, inputs in itertools.chain(self._continuation_batches(encoded, extending),
                                             fresh_batches):
            logits = self.model(**inputs, logits_to_keep=1).logits[:, -1, :]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, index in enumerate(batch):
                results[index] = {label: logprobs[row, label_ids[index][k][0]].item()
                                  for k, label in enumerate(labels)}
        self.record_usage(agent, fitted, list(map(len, encoded)))
        return results

    @_in_adapter_scope
    @torch.inference_mode()
    @metered
    def marked_label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[list[dict[str, float]]]:
        check_labels("marked_label_logprobs", labels)
        if not prompts:
            return []
        fitted = self.fit(prompts, 1, agent=agent, reserved_for="label token")
        marked = [marked_prompt_ids(self.tokenizer, f.text) for f in fitted]
        encoded = [ids for ids, _ in marked]
        label_ids = [self.reply_ids(fitted[0].text, encoded[0], label) for label in labels]
        check_single_token_labels(labels, label_ids)
        wanted = torch.tensor([ids[0] for ids in label_ids], device=self.device)
        results: list[list[dict[str, float]]] = [[] for _ in prompts]
        for batch in self._batches(encoded):
            spots = [[*marked[i][1], len(encoded[i]) - 1] for i in batch]
            # The shared prefix ends before the first read position: logits come only from
            # the tokens this batch runs.
            inputs, full_ids = self._batch_inputs([encoded[i] for i in batch],
                                                  prefix_limit=min(s[0] for s in spots))
            run_start = full_ids.shape[1] - inputs["input_ids"].shape[1]
            # Rows are left-padded: position p of a row's ids is column width - len(row) + p.
            columns = [[full_ids.shape[1] - len(encoded[i]) + p - run_start for p in row_spots]
                       for i, row_spots in zip(batch, spots, strict=True)]
            keep = sorted({c for row in columns for c in row})
            where = {c: k for k, c in enumerate(keep)}
            logits = self.model(**inputs, logits_to_keep=torch.tensor(keep, device=self.device)
                                ).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)[..., wanted]
            for row, (index, row_columns) in enumerate(zip(batch, columns, strict=True)):
                results[index] = [dict(zip(labels, logprobs[row, where[c]].tolist(), strict=True))
                                  for c in row_columns]
        self.record_usage(agent, fitted, list(map(len, encoded)))
        return results

    def _batches_of(self, sequences: Sequence[list[int]], indices: Sequence[int], *,
                    rows_only: bool = False) -> Iterator[list[int]]:
        """`_batches` over a subset of `sequences` (indices into the whole list)."""
        for batch in self._batches([sequences[i] for i in indices], rows_only=rows_only):
            yield [indices[j] for j in batch]

    def _continuation_batches(self, sequences: Sequence[list[int]],
                              extending: dict[int, tuple[int, int]],
                              kept_batches: Sequence[KeptBatch] | None = None,
                              ) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
        """(indices, model inputs) for the sequences that extend prompts kept by the last
        generate call (`kept_batches`, default the prompt cache's): one batch per kept batch,
        only the new tokens run (lazily, so one selected cache is alive at a time)."""
        kept_batches = self.prompt_cache.batches if kept_batches is None else kept_batches
        groups: dict[int, list[int]] = {}
        for index, (kept_batch, _) in extending.items():
            groups.setdefault(kept_batch, []).append(index)
        for kept_batch, batch in groups.items():
            kept = kept_batches[kept_batch]
            batch.sort(key=lambda i: extending[i][1])  # kept row order: often no reordering
            rows = [extending[i][1] for i in batch]
            cache, prefix_mask = kept.select(rows, self.model.config)
            suffixes = [sequences[i][len(kept.rows[r]):] for i, r in zip(batch, rows, strict=True)]
            self.prompt_cache.reused_tokens += sum(len(kept.rows[r]) for r in rows)
            yield batch, kv.continue_inputs(suffixes, self.tokenizer.pad_token_id, cache,
                                            prefix_mask)

    @_in_adapter_scope
    @torch.inference_mode()
    @metered
    def continuation_logprob(
        self, prompts: Sequence[Conversation], continuations: Sequence[str], *,
        agent: str = "scorer",
    ) -> list[float]:
        check_continuations(prompts, continuations)
        fitted = self.fit(prompts, self.continuation_lengths(continuations), agent=agent,
                          reserved_for="continuation tokens")
        texts = [f.text for f in fitted]
        prompt_ids = [f.ids for f in fitted]
        reply_ids = [self.reply_ids(t, ids, c)
                     for t, ids, c in zip(texts, prompt_ids, continuations, strict=True)]
        sequences = [p + r for p, r in zip(prompt_ids, reply_ids, strict=True)]
        scores = [0.0] * len(prompts)
        for batch in self._batches(sequences):
            longest_reply = max(len(reply_ids[i]) for i in batch)
            # Only the last positions predict reply tokens: project just those to the vocabulary.
            # The prefix stops before each prompt's last token, which predicts the reply.
            inputs, _ = self._batch_inputs(
                [sequences[i] for i in batch],
                prefix_limit=min(len(prompt_ids[i]) for i in batch) - 1)
            logits = self.model(**inputs, logits_to_keep=longest_reply + 1).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, index in enumerate(batch):
                reply = reply_ids[index]
                if not reply:
                    continue
                # Positions -len(reply)-1 .. -2 predict the reply's tokens.
                steps = logprobs[row, -len(reply) - 1:-1, :]
                target = torch.tensor(reply, device=steps.device).unsqueeze(1)
                scores[index] = steps.gather(1, target).sum().item()
        self.record_usage(agent, fitted, list(map(len, sequences)))
        return scores

    def continuation_lengths(self, continuations: Sequence[str]) -> list[int]:
        """Tokens of each continuation (tokenised alone), the room it needs after its prompt."""
        if not continuations:
            return []
        return [len(ids) for ids in
                self.tokenizer(list(continuations), add_special_tokens=False)["input_ids"]]

    def _stop_token_ids(self) -> list[int]:
        return kv.eos_token_ids(self.model, self.tokenizer)

