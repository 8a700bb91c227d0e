"""CXMI (FILCO, arXiv 2311.08377): how much a context raises the scorer's belief in the answer.

    CXMI(t) = max over gold aliases a of [ log p(a | t, q) − log p(a | q) ]

Each term is the summed token log-probability of the alias as the assistant's reply to the
`cxmi_with_context` / `cxmi_without_context` prompts (data_gen/prompts), so everything stays
in log space; the best alias is the one with the largest difference, and its two terms are
kept beside the score. The no-context term log p(a | q) is computed once per question and
reused for all its chunks and sentences.

Three implementations give the same scores:

* `SharedPrefixCXMI` (in-process transformers models): all of a question's prompts begin
  with the same tokens (instruction + question). That shared prefix is run once and its
  key/value cache reused for every context; only the tokens after it are computed, in
  batches. On CPU this is where the speed comes from: batching a long prefill gains little,
  not recomputing it gains a lot.
* `BatchedCXMI` (any `LLMBackend`, e.g. an OpenAI-compatible server): one batched
  `continuation_logprob` call per question, the no-context term once.
* `naive_cxmi`: the reference — two single-prompt passes per context and alias, nothing
  shared; kept for the tests and the benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import Cache

from sieverag.data_gen.templates import load_data_gen_template
from sieverag.inference.llm import kv
from sieverag.inference.llm.base import LLMBackend
from sieverag.inference.llm.context import FittedPrompt
from sieverag.inference.llm.hf import HFBackend, shared_prefix_length
from sieverag.inference.types import Conversation

AGENT = "cxmi"


@dataclass(frozen=True)
class CXMIScore:
    """CXMI of one context: the best alias's difference and both of its log-probs."""

    score: float
    alias: str
    logprob_with: float
    logprob_without: float


class CXMIScorer(Protocol):
    """Scores the contexts of one question on `backend` (whose meter counts the work)."""

    backend: LLMBackend

    def score(
        self, question: str, answers: Sequence[str], contexts: Sequence[str]
    ) -> list[CXMIScore]:
        """One `CXMIScore` per context, in order."""
        ...


def reader_prompts(
    question: str, contexts: Sequence[str]
) -> tuple[Conversation, list[Conversation]]:
    """The no-context prompt and one with-context prompt per context."""
    with_context = load_data_gen_template("cxmi_with_context")
    without_context = load_data_gen_template("cxmi_without_context")
    return (without_context.messages(question=question),
            [with_context.messages(question=question, context=c) for c in contexts])


def _check_answers(answers: Sequence[str]) -> list[str]:
    aliases = list(dict.fromkeys(a for a in answers if a.strip()))
    if not aliases:
        raise ValueError("CXMI needs at least one non-empty gold answer")
    return aliases


def _best_alias(aliases: Sequence[str], without: Sequence[float],
                with_context: Sequence[float]) -> CXMIScore:
    """Pick the alias with the largest log p(a|t,q) − log p(a|q)."""
    best = max(range(len(aliases)), key=lambda k: with_context[k] - without[k])
    return CXMIScore(score=with_context[best] - without[best], alias=aliases[best],
                     logprob_with=with_context[best], logprob_without=without[best])


def _flatten(question: str, aliases: Sequence[str],
             contexts: Sequence[str]) -> tuple[list[Conversation], list[str]]:
    """Prompts and replies: first the no-context ones (one per alias), then context-major."""
    no_context, with_context = reader_prompts(question, contexts)
    prompts = [no_context] * len(aliases) + [p for p in with_context for _ in aliases]
    return prompts, list(aliases) * (1 + len(contexts))


def _unflatten(aliases: Sequence[str], n_contexts: int,
               logprobs: Sequence[float]) -> list[CXMIScore]:
    k = len(aliases)
    without = logprobs[:k]
    return [_best_alias(aliases, without, logprobs[k * (1 + i): k * (2 + i)])
            for i in range(n_contexts)]


class BatchedCXMI:
    """CXMI on any backend: one batched `continuation_logprob` call per question."""

    def __init__(self, backend: LLMBackend) -> None:
        self.backend = backend

    def score(
        self, question: str, answers: Sequence[str], contexts: Sequence[str]
    ) -> list[CXMIScore]:
        aliases = _check_answers(answers)
        prompts, replies = _flatten(question, aliases, contexts)
        logprobs = self.backend.continuation_logprob(prompts, replies, agent=AGENT)
        return _unflatten(aliases, len(contexts), logprobs)


class SharedPrefixCXMI:
    """CXMI on an in-process transformers model, reusing the question's prefix KV cache.

    Token sequences are built exactly as `HFBackend.continuation_logprob` builds them; the
    prefix is the longest run of tokens all of the question's sequences share (stopping
    before the shortest prompt's last token, so every reply is predicted from the
    per-context part). Per-context parts are left-padded into batches, with attention
    masked on the padding and positions continuing from the prefix.
    """

    def __init__(self, backend: HFBackend, batch_size: int | None = None,
                 batch_tokens: int = 512) -> None:
        self.backend = backend
        self.batch_size = batch_size or backend.config.batch_size
        self.batch_tokens = batch_tokens

    def score(
        self, question: str, answers: Sequence[str], contexts: Sequence[str]
    ) -> list[CXMIScore]:
        aliases = _check_answers(answers)
        prompts, replies = _flatten(question, aliases, contexts)
        return _unflatten(aliases, len(contexts), self.continuation_logprob(prompts, replies))

    def _encode(self, fitted: Sequence[FittedPrompt],
                replies: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Full token sequences and each one's reply length, as the hf backend makes them."""
        reply_ids = [self.backend.reply_ids(f.text, f.ids, r)
                     for f, r in zip(fitted, replies, strict=True)]
        return ([f.ids + r for f, r in zip(fitted, reply_ids, strict=True)],
                [len(r) for r in reply_ids])

    @torch.inference_mode()
    def continuation_logprob(self, prompts: Sequence[Conversation],
                             replies: Sequence[str]) -> list[float]:
        """Summed reply log-probs, like `HFBackend.continuation_logprob`, prefix computed once
        (the prompts fitted to the context by the backend's guard first)."""
        fitted = self.backend.fit(prompts, self.backend.continuation_lengths(replies),
                                  agent=AGENT, reserved_for="continuation tokens")
        sequences, reply_lengths = self._encode(fitted, replies)
        shortest_prompt = min(len(s) - n for s, n in zip(sequences, reply_lengths, strict=True))
        prefix_length = min(shared_prefix_length(sequences), shortest_prompt - 1)
        prefix_cache = None
        if prefix_length > 0:
            prefix_cache = kv.prefill(self.backend.model, sequences[0][:prefix_length],
                                      self.backend.device)
        suffixes = [s[prefix_length:] for s in sequences]
        scores = [0.0] * len(sequences)
        for batch in self._batches(suffixes):
            batch_scores = self._score_batch(
                [suffixes[i] for i in batch], [reply_lengths[i] for i in batch],
                prefix_cache, prefix_length)
            for index, value in zip(batch, batch_scores, strict=True):
                scores[index] = value
        self.backend.record_usage(AGENT, fitted, list(map(len, sequences)))
        return scores

    def _batches(self, suffixes: Sequence[list[int]]) -> list[list[int]]:
        """Indices grouped by length, at most `batch_size` rows and `batch_tokens` padded tokens.

        On CPU a batch of a few hundred tokens is as efficient as any larger one; bigger
        ones only slow down (their activations fall out of cache).
        """
        batches: list[list[int]] = []
        for index in sorted(range(len(suffixes)), key=lambda i: len(suffixes[i])):
            batch = batches[-1] if batches else None
            if (batch is None or len(batch) >= self.batch_size
                    or (len(batch) + 1) * len(suffixes[index]) > self.batch_tokens):
                batches.append([index])
            else:
                batch.append(index)
        return batches

    def _score_batch(self, suffixes: list[list[int]], reply_lengths: list[int],
                     prefix_cache: Cache | None, prefix_length: int) -> list[float]:
        backend = self.backend
        rows = len(suffixes)
        # Positions continue from the prefix and skip the padding between prefix and suffix;
        # each batch gets its own copy of the prefix cache (a forward pass appends to it).
        inputs = kv.continue_inputs(
            suffixes, backend.tokenizer.pad_token_id,
            None if prefix_cache is None else kv.expand_cache(prefix_cache, rows),
            torch.ones((rows, prefix_length), dtype=torch.long, device=backend.device))
        longest_reply = max(reply_lengths)
        logits = backend.model(**inputs, use_cache=prefix_cache is not None,
                               logits_to_keep=longest_reply + 1).logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        scores = []
        for row, (suffix, n_reply) in enumerate(zip(suffixes, reply_lengths, strict=True)):
            if not n_reply:
                scores.append(0.0)
                continue
            # Positions -n-1 .. -2 predict the reply's n tokens.
            steps = logprobs[row, -n_reply - 1:-1, :]
            target = torch.tensor(suffix[-n_reply:], device=steps.device).unsqueeze(1)
            scores.append(steps.gather(1, target).sum().item())
        return scores


def naive_cxmi(
    backend: LLMBackend, question: str, answers: Sequence[str], contexts: Sequence[str]
) -> list[CXMIScore]:
    """Reference CXMI: per context and alias, two single-prompt passes; nothing is shared."""
    aliases = _check_answers(answers)
    no_context, with_context = reader_prompts(question, contexts)
    scores = []
    for prompt in with_context:
        pairs = [(backend.continuation_logprob([prompt], [a], agent=AGENT)[0],
                  backend.continuation_logprob([no_context], [a], agent=AGENT)[0])
                 for a in aliases]
        scores.append(_best_alias(aliases, [w for _, w in pairs], [c for c, _ in pairs]))
    return scores


def cxmi_scorer(backend: LLMBackend) -> CXMIScorer:
    """The fastest scorer the backend allows: shared-prefix on `HFBackend`, else batched."""
    return SharedPrefixCXMI(backend) if isinstance(backend, HFBackend) else BatchedCXMI(backend)
