"""The `openai` LLM backend: any OpenAI-compatible server (vLLM, the embedded server, a hosted API).

How each operation of the `LLMBackend` protocol maps onto the server:

* `generate` — POST /chat/completions, one request per conversation.
* `label_logprobs` — POST /chat/completions with max_tokens=1, logprobs and top_logprobs=K.
  Each label is read from the top-k list of the first generated token: a top-k token matches
  a label when it equals it after stripping whitespace and the SentencePiece '▁' / BPE 'Ġ'
  word markers, and several matches ("Yes", " Yes") are combined with logsumexp. A label
  absent from the top-k is, by default (`missing_label_logprob="exact"`), scored exactly as the
  whole reply with `continuation_logprob`, one extra request per missing (prompt, label) pair;
  that needs `chat_template_model`, and without it such a label is a `ConfigError`. "topk_min"
  (the smallest returned top-k log-prob, an upper bound) or a fixed number sets a floor instead.
  A label the model emits as more than one token cannot be read from one token's top-k: when
  `chat_template_model` names a tokenizer, such labels are scored with `continuation_logprob`
  instead (the /completions endpoint with echo); without one, every label counts as one token.
* `continuation_logprob` — the conversation is rendered to text with the local chat template
  (generation prompt added), the continuation appended, and POST /completions with echo=true
  returns the log-prob of every prompt token; the tokens starting inside the continuation
  (by `text_offset`) are summed. max_tokens=1 is sent because some vLLM versions reject 0;
  the one generated token starts after the continuation, so it is never counted.
* `marked_label_logprobs` — the conversation is rendered with the local chat template and
  sent to POST /completions as token ids (`marked_prompt_ids`: what `HFBackend` reads), with
  echo=true, max_tokens=1 and logprobs=K: each prompt token's top-k then the generated
  token's. A mark's labels are read from the top-k of the token after it, the assistant's
  from the generated token's, each label as its one token (by id where the server keys the
  top-k by id, vLLM's `return_tokens_as_token_ids`, else by the token's decoded text).

With `context_length` set (and `chat_template_model`, whose tokenizer counts the tokens),
every prompt goes through the context guard (inference/llm/context_guard.py) before it is sent;
without it prompts are sent as they are, and a server refuses one over its context with its
own error (vLLM and the embedded server: HTTP 400), reported as the one-line error below.

Requests go through `OpenAITransport` (inference/llm/openai_transport.py): the `openai` SDK's
async client, at most `max_concurrency` in flight on a private event-loop thread, paced by
`rpm`, `tpm` and the server's rate-limit headers, retried (`max_retries`, `backoff_s`, for at
most `patience_s` seconds); a server that stays down is a `BackendUnavailableError`, a request
it refuses a `SieveragError` with its own message; `token_field` and a refused `temperature`
adapt requests to servers that want `max_completion_tokens` (reasoning models). A retried
request is one call: its usage is counted once, from the reply that succeeded. `chat`
returns each reply with its usage (`ReplyUsage`: prompt, completion, reasoning and cached
tokens), for callers that account for every reply (the labelling ledger). The
key comes from `api_key_env`; with none, no Authorization header is sent (and OPENAI_API_KEY
is never read: a key meant for OpenAI must not reach another server).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from sieverag.inference.core.errors import ConfigError, SieveragError
from sieverag.inference.core.types import ContextOverflow, Conversation
from sieverag.inference.llm.backend_protocol import (
    GenerationSettings,
    UsageMeter,
    chat_prompt_text,
    check_continuations,
    check_labels,
    check_single_token_labels,
    cut_at_stop,
    marked_prompt_ids,
    metered,
)
from sieverag.inference.llm.context_guard import (
    ContextGuard,
    check_context_settings,
    context_length_field,
    context_overflow_field,
)
from sieverag.inference.llm.openai_transport import Endpoint, OpenAITransport, TokenField

_DEFAULT_SETTINGS = GenerationSettings()
_WORD_MARKERS = "▁Ġ"  # SentencePiece and byte-level BPE spellings of a leading space


@dataclass(frozen=True)
class OpenAIBackendConfig:
    """Where the server is and how to talk to it; validated on construction."""

    base_url: str = field(metadata={"help": "Server base URL, e.g. http://127.0.0.1:8000/v1."})
    model: str = field(metadata={"help": "Model name as the server serves it."})
    api_key_env: str | None = field(default=None, metadata={
        "help": "Environment variable holding the API key, sent as a bearer token."})
    max_concurrency: int = field(default=8, metadata={"help": "Most requests in flight."})
    timeout_s: float = field(default=60.0, metadata={"help": "Seconds to wait for one reply."})
    max_retries: int | None = field(default=4, metadata={
        "help": "Retries after the first attempt (None: as many as patience_s allows)."})
    backoff_s: float = field(default=0.5, metadata={
        "help": "First retry delay; doubles on each retry (at most 60 s), with jitter. "
                "Retry-After wins."})
    patience_s: float = field(default=120.0, metadata={
        "help": "Seconds a request keeps retrying a failing server (429, 5xx, timeouts, "
                "dropped connections) before the call fails."})
    rpm: int | None = field(default=None, metadata={
        "help": "Requests a minute at most, shared by every request in flight (None: only "
                "the server's rate-limit headers pace)."})
    tpm: int | None = field(default=None, metadata={
        "help": "Tokens a minute at most (prompt estimated, plus the reply allowed), shared "
                "by every request in flight."})
    token_field: TokenField = field(default="auto", metadata={
        "help": "Reply-length field of a chat request: max_tokens, max_completion_tokens, or "
                "auto (max_tokens until the server refuses it naming max_completion_tokens)."})
    top_logprobs: int = field(default=20, metadata={
        "help": "Top-k log-probs asked for when reading labels (OpenAI allows at most 20)."})
    missing_label_logprob: float | Literal["exact", "topk_min"] = field(default="exact", metadata={
        "help": "Log-prob of a label absent from the top-k: 'exact' (scored as the whole "
                "reply with continuation_logprob; needs chat_template_model), 'topk_min' (the "
                "smallest returned log-prob, an upper bound) or a fixed value <= 0."})
    chat_template_model: str | None = field(default=None, metadata={
        "help": "Local tokenizer folder whose chat template renders prompts for "
                "/completions (needed by continuation_logprob, marked_label_logprobs, "
                "multi-token labels and labels scored exactly)."})
    context_length: int | None = context_length_field()
    context_overflow: ContextOverflow = context_overflow_field()

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if not self.model:
            raise ValueError("model must name the model the server serves, got ''")
        if self.api_key_env is not None and not self.api_key_env:
            raise ValueError("api_key_env must name an environment variable or be None, got ''")
        for name, value, least in (("max_concurrency", self.max_concurrency, 1),
                                   ("max_retries", self.max_retries, 0),
                                   ("top_logprobs", self.top_logprobs, 1),
                                   ("rpm", self.rpm, 1), ("tpm", self.tpm, 1)):
            if value is None and name in ("max_retries", "rpm", "tpm"):
                continue
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        for name, value in (("timeout_s", self.timeout_s), ("patience_s", self.patience_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.token_field not in get_args(TokenField):
            raise ValueError(f"token_field must be one of {get_args(TokenField)}, got "
                             f"{self.token_field!r}")
        if not self.backoff_s >= 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s!r}")
        floor = self.missing_label_logprob
        if floor not in ("exact", "topk_min") and (isinstance(floor, (bool, str))
                                                   or not floor <= 0 or math.isinf(floor)):
            raise ValueError("missing_label_logprob must be 'exact', 'topk_min' or a finite "
                             f"number <= 0, got {floor!r}")
        if self.chat_template_model is not None and not self.chat_template_model:
            raise ValueError("chat_template_model must be a folder path or None, got ''")
        check_context_settings(self.context_length, self.context_overflow,
                               counts_tokens=self.chat_template_model is not None,
                               error=ValueError)


@dataclass(frozen=True)
class ReplyUsage:
    """The tokens one reply counted: `completion_tokens` include the `reasoning_tokens` (as
    OpenAI counts and bills them), `prompt_tokens` the `cached_tokens` (read from the
    server's prompt cache, billed at its own price)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def of(cls, reply: Any) -> ReplyUsage:
        """The usage an OpenAI-format reply reports (zeros where it reports none)."""
        usage = reply.get("usage") if isinstance(reply, dict) else None
        if not isinstance(usage, dict):
            return cls()

        def count(part: Any, name: str) -> int:
            value = part.get(name) if isinstance(part, dict) else None
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        return cls(count(usage, "prompt_tokens"), count(usage, "completion_tokens"),
                   count(usage.get("completion_tokens_details"), "reasoning_tokens"),
                   count(usage.get("prompt_tokens_details"), "cached_tokens"))


@dataclass(frozen=True)
class ChatReply:
    """One chat reply's text (stop strings cut off) and its usage."""

    text: str
    usage: ReplyUsage


class OpenAIBackend:
    """An `LLMBackend` served by an OpenAI-compatible HTTP server."""

    def __init__(self, config: OpenAIBackendConfig, meter: UsageMeter | None = None) -> None:
        self.config = config
        self.meter = UsageMeter() if meter is None else meter
        self._transport = OpenAITransport(
            base_url=config.base_url, model=config.model, key=server_key(config.api_key_env),
            max_concurrency=config.max_concurrency, timeout_s=config.timeout_s,
            max_retries=config.max_retries, backoff_s=config.backoff_s,
            patience_s=config.patience_s, rpm=config.rpm, tpm=config.tpm,
            token_field=config.token_field)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._guard: ContextGuard | None = None

    @property
    def model_name(self) -> str:
        return self.config.model

    @metered
    def generate(
        self,
        prompts: Sequence[Conversation],
        settings: GenerationSettings = _DEFAULT_SETTINGS,
        *,
        agent: str = "generator",
    ) -> list[str]:
        """One reply per conversation, in order, with stop strings cut off."""
        return [reply.text for reply in self.chat(prompts, settings, agent=agent)]

    @metered
    def chat(
        self,
        prompts: Sequence[Conversation],
        settings: GenerationSettings = _DEFAULT_SETTINGS,
        *,
        agent: str = "generator",
    ) -> list[ChatReply]:
        """`generate`, each reply with its own usage."""
        prompts, dropped = self._fit(prompts, settings.max_new_tokens, agent=agent)
        payloads = [self.chat_request(prompt, settings) for prompt in prompts]
        replies = self._post_all("chat/completions", payloads, agent, dropped)
        return [ChatReply(cut_at_stop(self._dig(reply, "choices", 0, "message").get("content")
                                      or "", settings.stop), ReplyUsage.of(reply))
                for reply in replies]

    @property
    def adaptations(self) -> list[str]:
        """What the requests learned to leave out or rename for this server, in order."""
        return self._transport.adaptations

    def waiting(self) -> str | None:
        """What holds the requests back now ("rate limited: resuming in 42 s"), or None."""
        return self._transport.waiting()

    @metered
    def label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[dict[str, float]]:
        """For each conversation, {label: log P(label as the assistant's next output)}.

        Single-token labels come from the first token's top-k; one absent from it is scored
        as `missing_label_logprob` says (exactly, by `continuation_logprob`, or a floor).
        Multi-token labels, detectable only with `chat_template_model`, come from
        `continuation_logprob` too. Raises `ConfigError` when a label must be scored exactly
        and `chat_template_model` is unset.
        """
        check_labels("label_logprobs", labels)
        multi_token = [label for label in labels if self._token_count(label) > 1]
        single_token = [label for label in labels if label not in multi_token]
        scores: list[dict[str, float]] = [{} for _ in prompts]
        if single_token:
            fitted, dropped = self._fit(prompts, 1, agent=agent, reserved_for="label token")
            payloads = [self._chat_payload(prompt, max_tokens=1, temperature=0.0, logprobs=True,
                                           top_logprobs=self.config.top_logprobs)
                        for prompt in fitted]
            replies = self._post_all("chat/completions", payloads, agent, dropped)
            for score, reply in zip(scores, replies, strict=True):
                score.update(self._read_labels(reply, single_token))
        # Left unscored: every multi-token label, and under "exact" each top-k miss; only
        # these (prompt, label) pairs are sent again, as whole replies.
        unscored = [(index, label) for index, score in enumerate(scores)
                    for label in labels if label not in score]
        if unscored:
            if self.config.chat_template_model is None:
                raise self._exact_needs_tokenizer(unscored, len(prompts))
            values = self.continuation_logprob([prompts[index] for index, _ in unscored],
                                               [label for _, label in unscored], agent=agent)
            for (index, label), value in zip(unscored, values, strict=True):
                scores[index][label] = value
        return [{label: score[label] for label in labels} for score in scores]

    @metered
    def continuation_logprob(
        self, prompts: Sequence[Conversation], continuations: Sequence[str], *,
        agent: str = "scorer",
    ) -> list[float]:
        """For each (conversation, reply) pair, the summed log-prob of the reply's tokens."""
        check_continuations(prompts, continuations)
        # Room for the continuation and the one token the request generates.
        reserved = ([self._token_count(c) + 1 for c in continuations]
                    if self.config.context_length is not None else 0)
        prompts, dropped = self._fit(prompts, reserved, agent=agent,
                                     reserved_for="continuation tokens")
        rendered = [self._render(prompt) for prompt in prompts]
        payloads = [{"model": self.config.model, "prompt": text + continuation, "max_tokens": 1,
                     "temperature": 0.0, "echo": True, "logprobs": 1}
                    for text, continuation in zip(rendered, continuations, strict=True)]
        replies = self._post_all("completions", payloads, agent, dropped)
        return [self._sum_span(reply, len(text), len(text) + len(continuation))
                for reply, text, continuation in zip(replies, rendered, continuations,
                                                      strict=True)]

    @metered
    def marked_label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[list[dict[str, float]]]:
        """For each conversation: {label: log P(label)} at each `LABEL_MARK` in its text, in
        order, then one more as the assistant's next output (len = marks + 1), from one
        POST /completions per conversation.

        The conversation, rendered by `chat_template_model`'s chat template (`ConfigError`
        when unset), is sent as the token ids `marked_prompt_ids` gives, so the server reads
        what `HFBackend` reads. Labels must be one token each (`ValueError`). Each read is the
        label token's own entry in the top-k, never a variant's: " Yes" is likely where a
        sentence ends, "Yes" after the assistant prefix, and `label_logprobs`'s rule of
        adding them up would read other numbers than `HFBackend` mid-text. The entry is found
        by the token's id where the server keys the top-k so (vLLM honours the
        `return_tokens_as_token_ids` sent), else by its decoded text, as the embedded server
        and vLLM spell a byte-level BPE token. A label absent from a top-k gets
        `missing_label_logprob`'s floor ("topk_min": the k-th best log-prob); under "exact"
        it is scored exactly, one more request per missing (read, label) pair: the prompt up
        to the read with the label token appended, echoed.
        """
        check_labels("marked_label_logprobs", labels)
        tokenizer = self._load_tokenizer("marked_label_logprobs")
        # Room for the generated token; under "exact", for a label appended before it too.
        reserved = 2 if self.config.missing_label_logprob == "exact" else 1
        fitted, dropped = self._fit(prompts, reserved, agent=agent, reserved_for="label token")
        if not fitted:
            return []
        texts = [self._chat_text(prompt) for prompt in fitted]
        # The whole rendered text, BOS included: a server adds nothing to a token-id prompt.
        marked = [marked_prompt_ids(tokenizer, text) for text in texts]
        # Imported here, as the tokenizer is: generate-only use should not load torch. Labels
        # are tokenised as HFBackend tokenises them, after the first prompt.
        from sieverag.inference.llm.hf import reply_token_ids

        label_ids = [reply_token_ids(tokenizer, texts[0], marked[0][0], label)
                     for label in labels]
        check_single_token_labels(labels, label_ids)
        # A Metaspace (SentencePiece) token's text is spelled with its leading space by vLLM
        # and without by its decoding: keyed by id, vLLM's top-k needs no spelling.
        keys = {label: (f"token_id:{ids[0]}", tokenizer.decode(ids))
                for label, ids in zip(labels, label_ids, strict=True)}
        payloads = [{"model": self.config.model, "prompt": ids, "max_tokens": 1,
                     "temperature": 0.0, "echo": True, "logprobs": self.config.top_logprobs,
                     "return_tokens_as_token_ids": True}
                    for ids, _ in marked]
        replies = self._post_all("completions", payloads, agent, dropped)
        # The echoed table's entry i is the distribution token i was drawn from: a mark after
        # token p reads entry p + 1, the assistant's reply the generated token's.
        reads = [[*(p + 1 for p in positions), len(ids)] for ids, positions in marked]
        scores = [[self._read_echoed(reply, index, keys) for index in row]
                  for reply, row in zip(replies, reads, strict=True)]
        unscored = [(row, read, label) for row, score_row in enumerate(scores)
                    for read, score in enumerate(score_row) for label in labels
                    if label not in score]
        if unscored:
            token = {label: ids[0] for label, ids in zip(labels, label_ids, strict=True)}
            exact = self._post_all("completions", [
                {"model": self.config.model,
                 "prompt": marked[row][0][:reads[row][read]] + [token[label]], "max_tokens": 1,
                 "temperature": 0.0, "echo": True, "logprobs": 1}
                for row, read, label in unscored], agent)
            for (row, read, label), reply in zip(unscored, exact, strict=True):
                scores[row][read][label] = self._dig(reply, "choices", 0, "logprobs",
                                                     "token_logprobs", reads[row][read])
        return [[{label: score[label] for label in labels} for score in score_row]
                for score_row in scores]

    def close(self) -> None:
        """Close the connections and stop the private event loop (a later call restarts it)."""
        self._transport.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def chat_request(self, prompt: Conversation,
                     settings: GenerationSettings = _DEFAULT_SETTINGS) -> dict[str, Any]:
        """The /chat/completions body `chat` sends for `prompt`, as this server wants it
        (`token_field`, and what its refusals taught so far), for callers that send it another
        way: a Batch API line."""
        return self._transport.adapted("chat/completions", self._chat_payload(
            prompt, max_tokens=settings.max_new_tokens, temperature=settings.temperature,
            stop=settings.stop))

    def _chat_payload(self, prompt: Conversation, *, stop: Sequence[str] = (),
                      **options: Any) -> dict[str, Any]:
        payload = {"model": self.config.model, "messages": list(prompt), **options}
        if stop:
            payload["stop"] = list(stop)
        return payload

    def _fit(self, prompts: Sequence[Conversation], reserved: int | Sequence[int], *,
             agent: str, reserved_for: str = "new tokens") -> tuple[list[Conversation], list[int]]:
        """The prompts as they will be sent, and the tokens cut from each: through the context
        guard when `context_length` is set, else as they are."""
        guard = self._context_guard()
        if guard is None:
            return list(prompts), [0] * len(prompts)
        fitted = guard.fit(prompts, reserved, agent=agent, reserved_for=reserved_for)
        return [f.conversation for f in fitted], [f.tokens_dropped for f in fitted]

    @property
    def context_guard(self) -> ContextGuard | None:
        """The context guard prompts go through; None when `context_length` is unset (the
        server refuses a prompt too long)."""
        return self._context_guard()

    def _context_guard(self) -> ContextGuard | None:
        """The context guard over `context_length` (made once); None when that is unset."""
        if self.config.context_length is None:
            return None
        tokenizer = self._load_tokenizer()
        with self._lock:
            if self._guard is None:
                self._guard = ContextGuard(tokenizer, self._chat_text, self.config.context_length,
                                           self.config.context_overflow, model=self.config.model)
            return self._guard

    def _post_all(self, endpoint: Endpoint, payloads: list[dict[str, Any]], agent: str,
                  dropped: Sequence[int] = ()) -> list[Any]:
        """Send every payload to `endpoint` concurrently; the SDK's replies in payload order;
        usage recorded for agent (with the prompt tokens the context guard `dropped` from
        each)."""
        replies = self._transport.post_all(endpoint, payloads)
        usages = [(reply.get("usage") or {}) if isinstance(reply, dict) else {}
                  for reply in replies]
        self.meter.record(agent, len(replies), sum(u.get("prompt_tokens", 0) for u in usages),
                          sum(u.get("completion_tokens", 0) for u in usages),
                          truncated_prompts=sum(1 for d in dropped if d),
                          tokens_dropped=sum(dropped))
        return replies

    def _dig(self, reply: Any, *path: str | int) -> Any:
        """reply[path[0]][path[1]]...; a clear error where the server's reply lacks a field."""
        node = reply
        for key in path:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                node = None
            if node is None:
                where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)
                raise SieveragError(
                    f"the LLM server at {self.config.base_url} sent a reply without {where[1:]}; "
                    "is it OpenAI-compatible, with log-prob support where needed?")
        return node

    def _read_labels(self, reply: Any, labels: Sequence[str]) -> dict[str, float]:
        """Label log-probs from the first generated token's top-k list; a label absent from it
        gets the floor, or is left out under "exact" (to be scored as a whole reply)."""
        first = self._dig(reply, "choices", 0, "logprobs", "content", 0)
        top = [(self._dig(entry, "token"), self._dig(entry, "logprob"))
               for entry in self._dig(first, "top_logprobs")]
        chosen = (self._dig(first, "token"), self._dig(first, "logprob"))
        if chosen not in top:
            top.append(chosen)
        floor = self._floor(min(lp for _, lp in top))
        scores = {}
        for label in labels:
            matches = [logprob for token, logprob in top
                       if token.strip().lstrip(_WORD_MARKERS).strip() == label.strip()]
            if matches:
                scores[label] = _logsumexp(matches)
            elif floor is not None:
                scores[label] = floor
        return scores

    def _read_echoed(self, reply: Any, index: int,
                     keys: Mapping[str, tuple[str, str]]) -> dict[str, float]:
        """Label log-probs from token `index`'s top-k in a /completions reply's legacy table,
        each label's entry found by its token's `keys` (its id key, then its text); a label
        absent from it gets the floor, or is left out under "exact" (to be scored exactly)."""
        entry = self._dig(reply, "choices", 0, "logprobs", "top_logprobs", index)
        # The entry holds the token drawn there too, below the k best when not among them.
        best = sorted(entry.values(), reverse=True)[:self.config.top_logprobs]
        floor = self._floor(best[-1])
        scores = {}
        for label, (by_id, by_text) in keys.items():
            value = entry.get(by_id, entry.get(by_text))
            if value is not None:
                scores[label] = value
            elif floor is not None:
                scores[label] = floor
        return scores

    def _floor(self, lowest: float) -> float | None:
        """The log-prob of a label absent from a top-k list whose k-th best is `lowest`, as
        `missing_label_logprob` sets it; None under "exact" (it is scored exactly)."""
        floor = self.config.missing_label_logprob
        if floor == "exact":
            return None
        return lowest if floor == "topk_min" else float(floor)

    def _exact_needs_tokenizer(self, unscored: Sequence[tuple[int, str]],
                               n_prompts: int) -> ConfigError:
        """The error for labels absent from the top-k when no tokenizer can score them exactly."""
        missing = list(dict.fromkeys(label for _, label in unscored))
        n_missing = len({index for index, _ in unscored})
        return ConfigError(
            f"label(s) {', '.join(map(repr, missing))} are not among the top "
            f"{self.config.top_logprobs} log-probs model {self.config.model!r} returned for the "
            f"first reply token ({n_missing} of {n_prompts} prompt(s)), and scoring them exactly "
            "(missing_label_logprob='exact') needs a tokenizer: set chat_template_model to the "
            "served model's local tokenizer folder to score them exactly, or set "
            "missing_label_logprob to 'topk_min' or a number <= 0 to accept a floor")

    def _sum_span(self, reply: Any, start: int, end: int) -> float:
        """Sum of the echoed token log-probs whose text offset lies in [start, end)."""
        logprobs = self._dig(reply, "choices", 0, "logprobs")
        pairs = zip(self._dig(logprobs, "token_logprobs"), self._dig(logprobs, "text_offset"),
                    strict=True)
        # The first echoed token has no log-prob (nothing precedes it): None, never counted.
        return sum(lp for lp, offset in pairs if start <= offset < end and lp is not None)

    def _chat_text(self, conversation: Conversation) -> str:
        """The chat-templated prompt as the model reads it, generation prompt included."""
        return chat_prompt_text(self._load_tokenizer(), conversation)

    def _render(self, conversation: Conversation) -> str:
        """The prompt text to send to /completions."""
        tokenizer = self._load_tokenizer()
        text = self._chat_text(conversation)
        bos = tokenizer.bos_token
        # The server adds BOS itself when its tokenizer does; sending it too would double it.
        if bos and text.startswith(bos) and tokenizer.bos_token_id in tokenizer("").input_ids:
            text = text[len(bos):]
        return text

    def _token_count(self, label: str) -> int:
        if self.config.chat_template_model is None:
            return 1
        return len(self._load_tokenizer().encode(label, add_special_tokens=False))

    def _load_tokenizer(self, operation: str = "continuation_logprob") -> Any:
        """The served model's tokenizer (`chat_template_model`), loaded once; `ConfigError`
        when it is unusable, or unset (naming `operation`, which needs it)."""
        folder = self.config.chat_template_model
        if folder is None:
            raise ConfigError(
                f"{operation} on the openai backend needs chat_template_model: the local "
                "tokenizer folder of the served model, whose chat template renders prompts")
        with self._lock:
            if self._tokenizer is None:
                if not Path(folder).is_dir():
                    raise ConfigError(f"chat_template_model {folder} is not a folder; give the "
                                      "local tokenizer folder of the served model")
                # Imported here: generate-only use of this backend should not pay for it.
                from sieverag.inference.llm.chat_template import load_tokenizer

                try:
                    # Its own chat template, else sieverag's fallback (as the server's).
                    self._tokenizer = load_tokenizer(folder)
                except (OSError, ValueError) as exc:
                    raise ConfigError(f"cannot load a tokenizer from chat_template_model "
                                      f"{folder}: {exc}") from exc
            return self._tokenizer


def server_key(api_key_env: str | None) -> str | None:
    """The API key a served role sends: the value of the environment variable `api_key_env`;
    None without one (no Authorization header). A variable named but unset is a
    `ConfigError` naming it."""
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise ConfigError(f"environment variable {api_key_env} (api_key_env) is not set; "
                          "export the server's API key there or unset api_key_env")
    return key


def _logsumexp(values: Sequence[float]) -> float:
    peak = max(values)
    if math.isinf(peak):
        return peak
    return peak + math.log(sum(math.exp(v - peak) for v in values))

