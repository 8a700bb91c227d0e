"""The `LLMBackend` protocol on the embedded server's own engine, so inference's filters run
inside the server: batched with every other request, on the served model or adapter a
request names.

Each operation computes what `HFBackend` computes on the same model: prompts are rendered by
the chat template and tokenised as it does, labels and replies tokenised by the one
`reply_token_ids`; `label_logprobs` reads the labels' log-probs at the first new position
(`SequenceRequest.label_token_ids`), `marked_label_logprobs` there and at every mark, from the
prompt log-probs' pass (`SequenceRequest.label_positions`), `continuation_logprob` sums the
reply's prompt log-probs, `generate` decodes as the engine decodes chat requests. Prompts
are not cut to fit: the caller checks their sizes first (`encode` gives their tokens), and
the engine refuses none.

One instance serves one HTTP request, from the worker thread that runs the filter: each call
blocks on the engine's futures, its sequences queued under the request's owner (the engine
takes them in turn with other requests'); `cancel()` (from the event loop, when the client
goes away) cancels those in flight and refuses later calls.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import CancelledError, Future

from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import (
    LABEL_MARK,
    GenerationSettings,
    UsageMeter,
    chat_prompt_text,
    check_continuations,
    check_labels,
    check_single_token_labels,
    labels_as_replies,
    marked_prompt_ids,
    metered,
)
from sieverag.inference.llm.hf import reply_token_ids
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.sequence_types import SequenceRequest, SequenceResult

_DEFAULT_SETTINGS = GenerationSettings()


class EngineBackend:
    """An `LLMBackend` that runs `model` (a served name) on `engine`."""

    def __init__(self, engine: BatchingEngine, model: str, *, owner: Hashable | None = None
                 ) -> None:
        """`owner`: whose turn the engine queues this backend's sequences for (the rounds of
        one request share one); None: this backend's own."""
        if model not in engine.served.names:
            raise ValueError(f"unknown model {model!r}; served: {engine.served.names}")
        self.engine = engine
        self.model = model
        self.owner: Hashable = self if owner is None else owner
        self.tokenizer = engine.served.tokenizer
        self.meter = UsageMeter()
        # rendered prompt -> the ids the model reads and its label marks' positions
        self._read: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._in_flight: list[Future[SequenceResult]] = []
        self._lock = threading.Lock()
        self._cancelled = False

    @property
    def model_name(self) -> str:
        return self.model

    def render(self, conversation: Conversation) -> str:
        """The chat-templated prompt text, ending with the assistant prefix."""
        return chat_prompt_text(self.tokenizer, conversation)

    def read_ids(self, conversation: Conversation
                 ) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
        """The prompt's text, the token ids the model reads for it and the positions of its
        label marks (`marked_prompt_ids`: none in a prompt without marks); remembered, so
        planning a round (`round_plan`), checking a prompt's size and then running it
        tokenise it once."""
        text = self.render(conversation)
        read = self._read.get(text)
        if read is None:
            ids, positions = marked_prompt_ids(self.tokenizer, text)
            read = self._read[text] = (tuple(ids), tuple(positions))
        return text, *read

    def encode(self, conversation: Conversation) -> tuple[str, tuple[int, ...]]:
        """The prompt's text and token ids (the template holds its own special tokens). A
        prompt without label marks is tokenised as `read_ids` tokenises it, and remembered."""
        text = self.render(conversation)
        if LABEL_MARK in text:
            return text, tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return text, self.read_ids(conversation)[1]

    @metered
    def generate(
        self,
        prompts: Sequence[Conversation],
        settings: GenerationSettings = _DEFAULT_SETTINGS,
        *,
        agent: str = "generator",
    ) -> list[str]:
        """One reply per conversation, in order, with stop strings cut off."""
        encoded = [self.encode(prompt)[1] for prompt in prompts]
        results = self._run([SequenceRequest(
            model=self.model, prompt_ids=ids, max_tokens=settings.max_new_tokens,
            temperature=settings.temperature, stop=settings.stop) for ids in encoded])
        self.meter.record(agent, len(prompts), sum(map(len, encoded)),
                          sum(len(r.token_ids) for r in results))
        return [r.text for r in results]

    @metered
    def label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[dict[str, float]]:
        """For each conversation, {label: log P(label as the assistant's next output)}; a
        label of more than one token is scored as a whole reply (`continuation_logprob`)."""
        check_labels("label_logprobs", labels)
        encoded = [self.encode(prompt) for prompt in prompts]
        label_ids = [[reply_token_ids(self.tokenizer, text, ids, label) for label in labels]
                     for text, ids in encoded]
        if any(len(ids) != 1 for row in label_ids for ids in row):
            return labels_as_replies(self, prompts, labels, agent=agent)
        results = self._run([SequenceRequest(
            model=self.model, prompt_ids=ids, max_tokens=0,
            label_token_ids=tuple(label[0] for label in row))
            for (_, ids), row in zip(encoded, label_ids, strict=True)])
        self.meter.record(agent, len(prompts), sum(len(ids) for _, ids in encoded), 0)
        return [dict(zip(labels, r.label_logprobs, strict=True)) for r in results]

    @metered
    def marked_label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[list[dict[str, float]]]:
        """For each conversation: {label: log P(label)} at each `LABEL_MARK` in its text, in
        order, then one more as the assistant's next output (len = marks + 1), from one
        prefill of the ids `marked_prompt_ids` gives. Labels must be one token each
        (`ValueError`)."""
        check_labels("marked_label_logprobs", labels)
        read = [self.read_ids(prompt) for prompt in prompts]
        marked = [(ids, positions) for _, ids, positions in read]
        if not marked:
            return []
        # Tokenised as HFBackend tokenises them: after the first prompt.
        label_ids = [reply_token_ids(self.tokenizer, read[0][0], list(marked[0][0]), label)
                     for label in labels]
        check_single_token_labels(labels, label_ids)
        wanted = tuple(ids[0] for ids in label_ids)
        results = self._run([SequenceRequest(
            model=self.model, prompt_ids=tuple(ids), max_tokens=0,
            prompt_logprobs=bool(positions), label_token_ids=wanted,
            label_positions=tuple(positions)) for ids, positions in marked])
        self.meter.record(agent, len(prompts), sum(len(ids) for ids, _ in marked), 0)
        return [[dict(zip(labels, read, strict=True))
                 for read in (*result.marked_label_logprobs, result.label_logprobs)]
                for result in results]

    @metered
    def continuation_logprob(
        self, prompts: Sequence[Conversation], continuations: Sequence[str], *,
        agent: str = "scorer",
    ) -> list[float]:
        """For each (conversation, reply) pair, the summed log-prob of the reply's tokens."""
        check_continuations(prompts, continuations)
        encoded = [self.encode(prompt) for prompt in prompts]
        replies = [reply_token_ids(self.tokenizer, text, ids, reply)
                   for (text, ids), reply in zip(encoded, continuations, strict=True)]
        sequences = [(*ids, *reply) for (_, ids), reply in zip(encoded, replies, strict=True)]
        results = self._run([SequenceRequest(model=self.model, prompt_ids=ids, max_tokens=0,
                                             prompt_logprobs=True) for ids in sequences])
        self.meter.record(agent, len(prompts), sum(map(len, sequences)), 0)
        # The reply's tokens are the last prompt tokens; each entry scores its own token.
        return [sum(entry.logprob for entry in result.prompt_logprobs[-len(reply):])
                if reply else 0.0 for result, reply in zip(results, replies, strict=True)]

    def cancel(self) -> None:
        """Cancel the sequences in flight; every later call raises `CancelledError`."""
        with self._lock:
            self._cancelled = True
            futures, self._in_flight = self._in_flight, []
        self.engine.cancel(futures)

    def _run(self, requests: list[SequenceRequest]) -> list[SequenceResult]:
        """Submit every request, then wait for all of them (results in order)."""
        futures: list[Future[SequenceResult]] = []
        try:
            with self._lock:
                if self._cancelled:
                    raise CancelledError
                self._in_flight = futures
                futures.extend(self.engine.submit(request, owner=self.owner)
                               for request in requests)
            return [future.result() for future in futures]
        except BaseException:
            self.engine.cancel(futures)  # one failed or was cancelled: none is wanted now
            raise
        finally:
            with self._lock:
                self._in_flight = []
