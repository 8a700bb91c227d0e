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
* `BatchedCXMI` (any `LLMBackend`, e.g. an OpenAI-compatible server: `label
  --scorer-endpoint URL[,URL...]`, prompt log-probs by /completions with echo, spread over
  the replicas): one batched
  `continuation_logprob` call per question, the no-context term once.
* `naive_cxmi`: the reference — two single-prompt passes per context and alias, nothing
  shared; kept for the tests and the benchmark.

`score_many` scores several questions in one call (`label --concurrency N`): their sequences
fill the same batches (in-process, each row behind its own question's prefix cache; served,
one request list), and the scores come back split per question, equal to `score`'s to float
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import Cache

from sieverag.data_gen.templates import load_data_gen_template
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm import kv
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.llm.context_guard import FittedPrompt
from sieverag.inference.llm.hf import HFBackend, shared_prefix_length

AGENT = "cxmi"
# Padded tokens in one in-process forward pass: on CPU a few hundred are as efficient as any
# more (larger activations fall out of cache); a GPU wants thousands (`--scorer-batch-tokens`).
DEFAULT_BATCH_TOKENS = 512


@dataclass(frozen=True)
class CXMIScore:
    """CXMI of one context: the best alias's difference and both of its log-probs."""

    score: float
    alias: str
    logprob_with: float
    logprob_without: float


@dataclass(frozen=True)
class CXMIQuestion:
    """One question's part of a `score_many` call: its gold answers and the texts to score."""

    question: str
    answers: Sequence[str]
    contexts: Sequence[str]


class CXMIScorer(Protocol):
    """Scores the contexts of questions on `backend` (whose meter counts the work)."""

    backend: LLMBackend

    def score(
        self, question: str, answers: Sequence[str], contexts: Sequence[str]
    ) -> list[CXMIScore]:
        """One `CXMIScore` per context, in order."""
        ...

    def score_many(self, questions: Sequence[CXMIQuestion]) -> list[list[CXMIScore]]:
        """`score` of each question, in order, computed in one call."""
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


def _split(values: Sequence[float], sizes: Sequence[int]) -> list[list[float]]:
    """`values` cut into consecutive runs of `sizes`."""
    runs, position = [], 0
    for size in sizes:
        runs.append(list(values[position:position + size]))
        position += size
    return runs


Groups = Sequence[tuple[Sequence[Conversation], Sequence[str]]]  # (prompts, replies) each


class _CXMIScorer:
    """What both scorers share: a question's (or many questions') prompts and replies, and the
    best alias per context from their log-probabilities (`grouped_logprobs`, each scorer's
    own)."""

    def score(
        self, question: str, answers: Sequence[str], contexts: Sequence[str]
    ) -> list[CXMIScore]:
        return self.score_many([CXMIQuestion(question, answers, contexts)])[0]

    def score_many(self, questions: Sequence[CXMIQuestion]) -> list[list[CXMIScore]]:
        aliases = [_check_answers(q.answers) for q in questions]
        flat = [_flatten(q.question, a, q.contexts)
                for q, a in zip(questions, aliases, strict=True)]
        return [_unflatten(a, len(q.contexts), logprobs) for q, a, logprobs in zip(
            questions, aliases, self.grouped_logprobs(flat), strict=True)]

    def grouped_logprobs(self, groups: Groups) -> list[list[float]]:
        raise NotImplementedError


class BatchedCXMI(_CXMIScorer):
    """CXMI on any backend: one batched `continuation_logprob` call per `score` or
    `score_many`. Given several backends (replicas of one served scorer, sharing one usage
    meter), a call's sequences are cut into one contiguous part per replica, the parts
    scored at the same time, and the replica that takes the first part goes round-robin from
    call to call, so calls smaller than the replicas still spread over all of them."""

    def __init__(self, backend: LLMBackend, *replicas: LLMBackend) -> None:
        self.backend = backend
        self.backends = [backend, *replicas]
        self._turn = 0

    def grouped_logprobs(self, groups: Groups) -> list[list[float]]:
        prompts = [p for prompts, _ in groups for p in prompts]
        replies = [r for _, replies in groups for r in replies]
        count = min(len(self.backends), len(prompts)) or 1
        size = -(-len(prompts) // count)  # ceil
        parts = [(self.backends[(self._turn + i) % len(self.backends)], i * size,
                  (i + 1) * size) for i in range(count)]
        self._turn = (self._turn + count) % len(self.backends)
        if count == 1:
            logprobs = parts[0][0].continuation_logprob(prompts, replies, agent=AGENT)
        else:
            with ThreadPoolExecutor(count, thread_name_prefix="cxmi-replica") as pool:
                futures = [pool.submit(backend.continuation_logprob, prompts[start:end],
                                       replies[start:end], agent=AGENT)
                           for backend, start, end in parts]
                logprobs = [value for future in futures for value in future.result()]
        return _split(logprobs, [len(p) for p, _ in groups])


@dataclass
class _Prepared:
    """One question's sequences for `SharedPrefixCXMI`, and its prefix run once."""

    fitted: list[FittedPrompt]
    sequences: list[list[int]]
    reply_lengths: list[int]
    prefix_length: int
    prefix_cache: Cache | None


class SharedPrefixCXMI(_CXMIScorer):
    """CXMI on an in-process transformers model, reusing the question's prefix KV cache.

    Token sequences are built exactly as `HFBackend.continuation_logprob` builds them; the
    prefix is the longest run of tokens all of the question's sequences share (stopping
    before the shortest prompt's last token, so every reply is predicted from the
    per-context part). Per-context parts are left-padded into batches, with attention
    masked on the padding and positions continuing from the prefix.
    """

    def __init__(self, backend: HFBackend, batch_size: int | None = None,
                 batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        self.backend = backend
        self.batch_size = batch_size or backend.config.batch_size
        self.batch_tokens = batch_tokens

    def _encode(self, fitted: Sequence[FittedPrompt],
                replies: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Full token sequences and each one's reply length, as the hf backend makes them."""
        reply_ids = [self.backend.reply_ids(f.text, f.ids, r)
                     for f, r in zip(fitted, replies, strict=True)]
        return ([f.ids + r for f, r in zip(fitted, reply_ids, strict=True)],
                [len(r) for r in reply_ids])

    def continuation_logprob(self, prompts: Sequence[Conversation],
                             replies: Sequence[str]) -> list[float]:
        """Summed reply log-probs, like `HFBackend.continuation_logprob`, prefix computed once
        (the prompts fitted to the context by the backend's guard first)."""
        return self.grouped_logprobs([(prompts, replies)])[0]

    @torch.inference_mode()
    def grouped_logprobs(self, groups: Groups) -> list[list[float]]:
        """`continuation_logprob` of each (prompts, replies) group, the groups' rows batched
        together, each row behind its own group's prefix cache."""
        # The scorer's own adapter (none: the plain base), whatever other roles share its base.
        with self.backend.adapter_scope():
            return self._grouped_logprobs(groups)

    def _grouped_logprobs(self, groups: Groups) -> list[list[float]]:
        prepared = [self._prepare(prompts, replies) for prompts, replies in groups]
        rows = [(g, i) for g, p in enumerate(prepared) for i in range(len(p.sequences))]
        suffixes = [prepared[g].sequences[i][prepared[g].prefix_length:] for g, i in rows]
        # A cache that is not plain keys and values (linear attention) cannot be stacked row by
        # row: such a model batches each group's rows alone.
        stackable = all(p.prefix_cache is None or kv.cache_layers(p.prefix_cache) is not None
                        for p in prepared)
        scores = [[0.0] * len(p.sequences) for p in prepared]
        for batch in self._batches(suffixes, None if stackable else [g for g, _ in rows]):
            cache, prefix_mask = self._batch_prefix([prepared[rows[r][0]] for r in batch])
            batch_scores = self._score_batch(
                [suffixes[r] for r in batch],
                [prepared[rows[r][0]].reply_lengths[rows[r][1]] for r in batch],
                cache, prefix_mask)
            for r, value in zip(batch, batch_scores, strict=True):
                group, index = rows[r]
                scores[group][index] = value
        for p in prepared:
            self.backend.record_usage(AGENT, p.fitted, list(map(len, p.sequences)))
        return scores

    def _prepare(self, prompts: Sequence[Conversation], replies: Sequence[str]) -> _Prepared:
        """A group's prompts fitted and encoded, and the prefix all its sequences share run
        once (stopping before the shortest prompt's last token, which predicts a reply)."""
        fitted = self.backend.fit(prompts, self.backend.continuation_lengths(replies),
                                  agent=AGENT, reserved_for="continuation tokens")
        sequences, reply_lengths = self._encode(fitted, replies)
        shortest_prompt = min(len(s) - n for s, n in zip(sequences, reply_lengths, strict=True))
        prefix_length = min(shared_prefix_length(sequences), shortest_prompt - 1)
        prefix_cache = None
        if prefix_length > 0:
            prefix_cache = kv.prefill(self.backend.model, sequences[0][:prefix_length],
                                      self.backend.device)
        return _Prepared(fitted, sequences, reply_lengths, prefix_length, prefix_cache)

    def _batch_prefix(self, owners: Sequence[_Prepared]) -> tuple[Cache | None, torch.Tensor]:
        """The prefix cache of a batch whose row i belongs to group `owners[i]`, and its
        attention mask: one group's prefix repeated, or each row's own prefix left-padded
        with masked zeros to the longest (positions then continue from each row's own)."""
        rows, device = len(owners), self.backend.device
        if all(owner is owners[0] for owner in owners):
            owner = owners[0]
            mask = torch.ones((rows, owner.prefix_length), dtype=torch.long, device=device)
            cache = (None if owner.prefix_cache is None
                     else kv.expand_cache(owner.prefix_cache, rows))
            return cache, mask
        width = max(owner.prefix_length for owner in owners)
        mask = torch.zeros((rows, width), dtype=torch.long, device=device)
        for row, owner in enumerate(owners):
            mask[row, width - owner.prefix_length:] = 1
        if width == 0:
            return None, mask
        layers_of = [None if o.prefix_cache is None else kv.cache_layers(o.prefix_cache)
                     for o in owners]
        reference = next(layers for layers in layers_of if layers is not None)
        stacked = []
        for layer, (keys, values) in enumerate(reference):
            stacked.append((
                torch.cat([_left_pad_columns(None if layers is None else layers[layer][0],
                                             keys, width) for layers in layers_of]),
                torch.cat([_left_pad_columns(None if layers is None else layers[layer][1],
                                             values, width) for layers in layers_of])))
        return kv.cache_from_layers(stacked, self.backend.model.config), mask

    def _batches(self, suffixes: Sequence[list[int]],
                 groups: Sequence[int] | None = None) -> list[list[int]]:
        """Indices grouped by length, at most `batch_size` rows and `batch_tokens` padded tokens;
        with `groups` (each suffix's group), a batch holds one group's rows only.

        On CPU a batch of a few hundred tokens is as efficient as any larger one; bigger
        ones only slow down (their activations fall out of cache).
        """
        batches: list[list[int]] = []
        open_batch: dict[int, list[int]] = {}  # the batch still filling, per group
        for index in sorted(range(len(suffixes)), key=lambda i: len(suffixes[i])):
            key = 0 if groups is None else groups[index]
            batch = open_batch.get(key)
            if (batch is None or len(batch) >= self.batch_size
                    or (len(batch) + 1) * len(suffixes[index]) > self.batch_tokens):
                batch = open_batch[key] = [index]
                batches.append(batch)
            else:
                batch.append(index)
        return batches

    def _score_batch(self, suffixes: list[list[int]], reply_lengths: list[int],
                     cache: Cache | None, prefix_mask: torch.Tensor) -> list[float]:
        backend = self.backend
        # Positions continue from each row's prefix and skip the padding between prefix and
        # suffix; `cache` is the batch's own (a forward pass appends to it).
        inputs = kv.continue_inputs(suffixes, backend.tokenizer.pad_token_id, cache, prefix_mask)
        longest_reply = max(reply_lengths)
        logits = backend.model(**inputs, use_cache=cache is not None,
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


def _left_pad_columns(tensor: torch.Tensor | None, like: torch.Tensor,
                      width: int) -> torch.Tensor:
    """`tensor` (keys or values of one row: [1, heads, positions, size]) left-padded with
    zeros to `width` positions; None (a row without prefix): all zeros, shaped as `like`."""
    if tensor is None:
        return like.new_zeros((1, like.shape[1], width, like.shape[3]))
    missing = width - tensor.shape[-2]
    if not missing:
        return tensor
    return torch.cat([tensor.new_zeros((*tensor.shape[:-2], missing, tensor.shape[-1])),
                      tensor], dim=-2)


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


def cxmi_scorer(backend: LLMBackend, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> CXMIScorer:
    """The fastest scorer the backend allows: shared-prefix on `HFBackend` (batches of at
    most `batch_tokens` padded tokens), else batched."""
    if isinstance(backend, HFBackend):
        return SharedPrefixCXMI(backend, batch_tokens=batch_tokens)
    return BatchedCXMI(backend)
