"""The embedded server's engine: one worker thread owns the model and batches every request.

Requests arrive on a queue from the HTTP handlers. When the worker is idle it waits for the
first one, then up to `batch_window_s` for more (at most `max_batch_size` sequences in all).
Each step takes new sequences in turn from every owner waiting (an owner is one HTTP
request: all the filter windows of a rerank request, all the prompts of a completions
request), one of each in a round, round after round, until their prompts pass
`max_batch_tokens` (a lone longer prompt goes alone): so a small request sent while a large
one's windows wait runs in the next step, after at most the step under way, however many
windows the large one still has. They are prefilled together (left-padded, grouped by served
model name, shortest first, in passes within that budget, a slice of positions at a time:
between two slices of a pass, the sequences other requests queued meanwhile are prefilled
first, once per request a pass, so a short request waits for one slice of a long prompt)
and then join the running batch of their model: continuous batching, so each decode step
runs every live sequence of one model as one forward pass, and a request that arrives
mid-generation waits one step rather than for the whole batch to finish.
Results are delivered through `concurrent.futures.Future`s; a streamed request also gets each
token as it is chosen (`TokenEvent`, handed to its listener on the worker thread). A cancelled
future (`cancel`, when a client goes away) takes its sequence out of the queue or its running
batch before the worker's next forward pass; a forward pass under way whose every sequence is
cancelled stops at its next decoder layer.

The turn order and the prefill packing are `scheduling`'s; the request, token and result
types `sequence_types`'.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sieverag.inference.llm import kv
from sieverag.inference.llm.backend_protocol import first_stop
from sieverag.inference.llm.call_batching import drain_queue
from sieverag.inference.llm.decode_step import Decoder
from sieverag.serving.engine.decode_batch import RunningBatch
from sieverag.serving.engine.sampling import Sampling, choose_tokens
from sieverag.serving.engine.scheduling import (
    CPU_PREFILL_TOKEN_BUDGET,
    PREFILL_TOKEN_BUDGET,
    OwnerTurns,
    by_model,
    owner_of,
    prefill_chunks,
    slice_positions,
)
from sieverag.serving.engine.sequence_types import (
    EngineClosedError,
    FinishReason,
    SequenceRequest,
    SequenceResult,
    TokenEvent,
    TokenListener,
    TokenLogprob,
)
from sieverag.serving.engine.served_model import ServedModel
from sieverag.serving.observability.metrics import EngineMetrics, QueueDepth

logger = logging.getLogger(__name__)

class _Abandoned(Exception):
    """Every sequence of the forward pass under way was cancelled: the pass stops here."""


@dataclass
class EngineStats:
    """How many sequences each forward pass ran, by kind (batch size -> passes), and how many
    sequences were dropped unfinished because their future was cancelled."""

    prefill_batch_sizes: Counter[int] = field(default_factory=Counter)
    decode_batch_sizes: Counter[int] = field(default_factory=Counter)
    cancelled: int = 0


@dataclass(eq=False)  # compared and hashed by identity: the engine keeps a set of them
class _Sequence:
    """A request in flight, owned by the worker thread."""

    request: SequenceRequest
    future: Future[SequenceResult]
    sampling: Sampling
    listener: TokenListener | None = None
    owner: Hashable | None = None  # whose turn it waits for; None: its own
    position: int = 0  # position id of the token fed next
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    label_logprobs: tuple[float, ...] = ()
    marked_label_logprobs: list[tuple[float, ...]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # when its prefill pass started; None: waiting


class BatchingEngine:
    """Runs `ServedModel` for concurrent requests on one worker thread, batched."""

    def __init__(self, served: ServedModel, *, max_batch_size: int = 32,
                 batch_window_s: float = 0.01, max_batch_tokens: int | None = None) -> None:
        """`max_batch_tokens`: the prompt tokens a step prefills (None: PREFILL_TOKEN_BUDGET
        on a GPU, CPU_PREFILL_TOKEN_BUDGET on CPU)."""
        if max_batch_size < 1 or batch_window_s < 0:
            raise ValueError(f"max_batch_size must be >= 1 and batch_window_s >= 0, got "
                             f"{max_batch_size} and {batch_window_s}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.served = served
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.max_batch_tokens = max_batch_tokens or (
            PREFILL_TOKEN_BUDGET if served.device.type == "cuda" else CPU_PREFILL_TOKEN_BUDGET)
        self.stats = EngineStats()
        self.metrics = EngineMetrics()
        self._queue: queue.SimpleQueue[_Sequence | None] = queue.SimpleQueue()
        self._waiting: OwnerTurns[_Sequence] = OwnerTurns()  # not started, by owner
        self._running: dict[str, RunningBatch[_Sequence]] = {}
        self._held: set[_Sequence] = set()  # submitted and not yet let go; guarded by _lock
        self._pass_rows: Sequence[_Sequence] = ()  # the sequences of the forward pass under way
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        # Each decode step's runner, by model: the base's, and the PEFT model's (every
        # adapter's); `Decoder` writes the step out where the model allows it.
        self._decoders = {id(m): Decoder(m) for m in (served.base, served.model)}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="sieverag-engine", daemon=True)

    # ----- lifecycle -----

    def start(self) -> None:
        """Run one tiny forward pass per served name (fails early on a broken model), then
        start the worker thread."""
        probe = torch.tensor([[self.served.tokenizer.eos_token_id or 0] * 2],
                             device=self.served.device)
        with torch.inference_mode():
            for name in self.served.names:
                cache = kv.growing_cache(self.served.model.config, self.served.name)
                with self.served.activated(name) as model:
                    model(input_ids=probe, cache=cache, use_cache=True, logits_to_keep=1)
        # The PEFT model wraps the base's own layers (`hf.SharedBase`): one hook per layer.
        self._hooks = [layer.register_forward_pre_hook(_AbandonCheck(self, index))
                       for index, layer in enumerate(_decoder_layers(self.served.base))]
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Sequences submitted and not yet let go: queued, waiting to start or running. A
        cancelled one counts until the worker drops it (before its next forward pass)."""
        with self._lock:
            return len(self._held)

    def queue_depth(self) -> QueueDepth:
        """Sequences waiting to be prefilled (with their prompt tokens) and running now; safe
        from any thread."""
        with self._lock:
            held = list(self._held)
        waiting = [s for s in held if s.started_at is None]
        return QueueDepth(len(waiting), sum(len(s.request.prompt_ids) for s in waiting),
                          len(held) - len(waiting))

    def close(self) -> None:
        """Stop the worker; requests not yet finished fail with `EngineClosedError`."""
        with self._lock:
            self._closed = True
            self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join()
        for hook in self._hooks:  # the model may outlive this engine (a shared base model)
            hook.remove()
        self._fail_everything(EngineClosedError("the server is shutting down"))

    def submit(self, request: SequenceRequest, listener: TokenListener | None = None, *,
               owner: Hashable | None = None) -> Future[SequenceResult]:
        """Queue one sequence; the future resolves when it finishes. `listener`, when given,
        gets each token as it is chosen, on the worker thread, before the future resolves.
        `owner`: whose turn it waits for (the sequences of one HTTP request share one; None:
        its own)."""
        if request.model not in self.served.names:
            raise ValueError(f"unknown model {request.model!r}; served: {self.served.names}")
        generator = None
        if request.seed is not None:
            generator = torch.Generator(device=self.served.device).manual_seed(request.seed)
        sequence = _Sequence(request, Future(),
                             Sampling(request.temperature, request.top_p, generator), listener,
                             owner)
        with self._lock:
            if self._closed:
                raise EngineClosedError("the server is shutting down")
            self._held.add(sequence)
            self._queue.put(sequence)
        return sequence.future

    def cancel(self, futures: Iterable[Future[SequenceResult]]) -> None:
        """Give up the sequences behind `futures` (from `submit`) that have not finished: each
        leaves the queue or its running batch before the worker's next forward pass, so at
        most the pass already under way computes it. Safe from any thread; finished futures
        are left as they are."""
        for future in futures:
            future.cancel()

    # ----- the worker loop -----

    def _work(self) -> None:
        try:
            with torch.inference_mode():
                while not self._closed:
                    self._step()
        except Exception:
            # A fault outside any one batch: refuse new work rather than leave clients hanging.
            logger.exception("the engine stopped")
            with self._lock:
                self._closed = True
            self._fail_everything(EngineClosedError("the model worker stopped on an internal "
                                                    "error; see the server log"))

    def _step(self) -> None:
        """Start what waits (prefill), then advance every running batch by one token."""
        self._prefill_all(self._take_new(), yielding=True)
        for name in list(self._running):
            rows = list(self._running[name].rows)
            try:
                self._decode_step(name)
            except Exception as exc:
                self._running.pop(name, None)
                self._abandon(rows, exc)

    def _fail_everything(self, error: Exception) -> None:
        with self._lock:  # queued, waiting, running, or between them when the worker failed
            leftovers = list(self._held)
        self._running.clear()
        self._waiting.clear()
        self._fail(leftovers, error)

    def _abandon(self, sequences: Sequence[_Sequence], error: Exception) -> None:
        logger.error("a batch of %d sequence(s) failed", len(sequences), exc_info=error)
        self._fail(sequences, error)

    def _fail(self, sequences: Sequence[_Sequence], error: BaseException) -> None:
        self._let_go(sequences)  # first: a client that has its answer finds nothing in flight
        for sequence in sequences:
            try:
                sequence.future.set_exception(error)
            except InvalidStateError:
                pass  # already resolved or cancelled

    def _let_go(self, sequences: Iterable[_Sequence]) -> None:
        with self._lock:
            self._held.difference_update(sequences)

    def _keep_wanted(self, sequences: Sequence[_Sequence]) -> list[int]:
        """The indices of `sequences` whose futures are not cancelled; lets go of the others."""
        wanted: list[int] = []
        dropped: list[_Sequence] = []
        for index, sequence in enumerate(sequences):
            if sequence.future.cancelled():
                dropped.append(sequence)
            else:
                wanted.append(index)
        if dropped:
            self._let_go(dropped)
            self.stats.cancelled += len(dropped)
        return wanted

    @contextmanager
    def _abandonable(self, rows: Sequence[_Sequence]) -> Iterator[None]:
        """The forward passes inside stop (`_Abandoned`) once all of `rows` are cancelled."""
        self._pass_rows = rows
        try:
            yield
        finally:
            self._pass_rows = ()

    def _before_layer(self, index: int) -> None:
        """Called before decoder layer `index` of every forward pass: raises `_Abandoned` when
        every sequence of the worker's pass under way is cancelled. Another thread's pass (the
        base model is shared in-process) is left alone."""
        rows = self._pass_rows
        if (rows and threading.current_thread() is self._thread
                and all(s.future.cancelled() for s in rows)):
            raise _Abandoned

    def _take_new(self) -> list[_Sequence]:
        """Sequences to start now, in turn from each owner waiting (`OwnerTurns.take`): wait
        (with the batch window) only when nothing runs or waits."""
        if not self._running and not self._waiting:
            first = self._queue.get()
            if first is None:
                return []
            self._waiting.add(first)
            deadline = time.monotonic() + self.batch_window_s
            while len(self._waiting) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is None:
                    return []
                self._waiting.add(item)
        if not self._drain_queue():
            return []
        self._waiting.keep(self._keep_wanted)  # cancelled ones leave first
        room = self.max_batch_size - sum(len(batch) for batch in self._running.values())
        return self._waiting.take(room, self.max_batch_tokens)

    def _drain_queue(self) -> bool:
        """Move what was submitted into `_waiting`, without waiting; False once the engine is
        closing (the sentinel is put back for `_take_new`)."""
        if drain_queue(self._queue, self._waiting.add):
            return True
        self._queue.put(None)
        return False

    def _prefill(self, name: str, chunk: list[_Sequence], *, yielding: bool = True) -> None:
        """Run the prompts of `chunk` together, pick each first token, keep the live rows.

        The prompts go through the model a slice of positions at a time (`slice_positions`);
        rows that asked for prompt log-probs get them (and their label positions' reads) slice
        by slice, so only one slice's logits exist at once. Between two slices, other
        requests' sequences queued meanwhile are prefilled first (`yielding`: `_serve_others`),
        so a short request waits for one slice of a long prompt, not for all of it."""
        self.stats.prefill_batch_sizes[len(chunk)] += 1
        self.metrics.batch_size.labels("prefill").observe(len(chunk))
        started = time.monotonic()
        for sequence in chunk:
            sequence.started_at = started
            self.metrics.queue_time.observe(started - sequence.submitted_at)
        prompts = [s.request.prompt_ids for s in chunk]
        width = max(map(len, prompts))
        inputs = kv.left_pad(prompts, self.served.tokenizer.pad_token_id or 0,
                             device=self.served.device)
        scored = [row for row, s in enumerate(chunk) if s.request.prompt_logprobs]
        entries: dict[int, list[TokenLogprob | None]] = {row: [None] for row in scored}
        marked = [row for row in scored if chunk[row].request.label_positions]
        cache = kv.growing_cache(self.served.model.config, self.served.name)
        positions = slice_positions(self.served.device)
        served: set[Hashable] = {owner_of(s) for s in chunk}  # owners this pass yields to once
        try:
            for start in range(0, width, positions):
                stop = min(start + positions, width)
                with self._abandonable(chunk), self.served.activated(name) as model:
                    logits = model(
                        input_ids=inputs["input_ids"][:, start:stop],
                        attention_mask=inputs["attention_mask"][:, :stop],
                        position_ids=inputs["position_ids"][:, start:stop],
                        cache=cache, use_cache=True, logits_to_keep=0 if scored else 1,
                    ).logits
                for row in scored:  # logits at position p score the token at p + 1
                    first = max(start, width - len(prompts[row]))
                    last = min(stop, width - 1)
                    if first < last:
                        entries[row].extend(_prompt_logprobs(
                            logits[row, first - start:last - start],
                            inputs["input_ids"][row, first + 1:last + 1].tolist(),
                            chunk[row].request.top_logprobs))
                for row in marked:  # a row's position p sits in column width - len + p
                    request = chunk[row].request
                    padding = width - len(prompts[row])
                    columns = [padding + p - start for p in request.label_positions
                               if start <= padding + p < stop]
                    if columns:
                        logprobs = torch.log_softmax(logits[row, columns].float(), dim=-1)
                        chunk[row].marked_label_logprobs.extend(map(
                            tuple, logprobs[:, list(request.label_token_ids)].tolist()))
                if yielding and stop < width:
                    self._serve_others(len(chunk), served)
        except _Abandoned:
            self._keep_wanted(chunk)  # every client left: let them all go
            return
        self.metrics.prompt_tokens.inc(sum(map(len, prompts)))
        for row, sequence in enumerate(chunk):
            sequence.position = len(prompts[row])
            if row in entries:
                sequence.prompt_logprobs = tuple(entries[row])
        live = self._advance(chunk, logits[:, -1, :], first=True)
        if live:
            batch = RunningBatch(chunk, cache, inputs["attention_mask"])
            batch.keep(live)
            if name in self._running:
                self._running[name].extend(batch)
            else:
                self._running[name] = batch

    def _serve_others(self, rows: int, served: set[Hashable]) -> None:
        """Between two slices of a pass of `rows` sequences: prefill the sequences that
        requests (owners) not yet `served` during it have queued, in turn and within
        `max_batch_tokens`, each pass run whole (no pass waits inside another's); each such
        owner is served once a pass, so none runs its whole request ahead of the pass."""
        if not self._drain_queue():
            return
        others = {owner for owner in self._waiting if owner not in served}
        if not others:
            return
        room = (self.max_batch_size - rows
                - sum(len(batch) for batch in self._running.values()))
        taken = self._waiting.take(room, self.max_batch_tokens, others)
        served.update(owner_of(s) for s in taken)
        self._prefill_all(taken, yielding=False)

    def _prefill_all(self, taken: list[_Sequence], *, yielding: bool) -> None:
        """Prefill `taken`, model by model, in the chunks the batch limits allow (`_prefill`,
        `yielding` to other requests between slices or not); a chunk loses the sequences whose
        clients went away meanwhile, and a bad chunk fails alone."""
        for name, group in by_model(taken).items():
            for chunk in prefill_chunks(group, self.max_batch_size, len(self.served.tokenizer),
                                        self.max_batch_tokens):
                # A long prefill of an earlier chunk gives clients time to go away.
                chunk = [chunk[i] for i in self._keep_wanted(chunk)]
                if not chunk:
                    continue
                try:
                    self._prefill(name, chunk, yielding=yielding)
                except Exception as exc:  # the server must outlive one bad batch
                    self._abandon(chunk, exc)

    def _decode_step(self, name: str) -> None:
        """Feed every live row of `name` its last token, as one forward pass (rows whose
        futures were cancelled leave the batch first)."""
        batch = self._running[name]
        wanted = self._keep_wanted(batch.rows)
        if not wanted:
            del self._running[name]
            return
        batch.keep(wanted)
        self.stats.decode_batch_sizes[len(batch)] += 1
        self.metrics.batch_size.labels("decode").observe(len(batch))
        device = self.served.device
        ids = torch.tensor([[s.tokens[-1]] for s in batch.rows], device=device)
        positions = torch.tensor([[s.position] for s in batch.rows], device=device)
        batch.grow_mask()
        try:
            with self._abandonable(batch.rows), self.served.activated(name) as model:
                logits = self._decoders[id(model)](
                    ids, positions, batch.attention_mask, batch.cache,
                    adapter=self.served.adapter_key(name), before_layer=self._before_layer
                )[:, -1, :]
        except _Abandoned:  # every client left mid-step: the batch (and its cache) goes
            self._keep_wanted(batch.rows)
            del self._running[name]
            return
        for sequence in batch.rows:
            sequence.position += 1
        live = self._advance(batch.rows, logits, first=False)
        if live:
            batch.keep(live)
        else:
            del self._running[name]

    def _advance(self, rows: list[_Sequence], logits: torch.Tensor, *, first: bool) -> list[int]:
        """Choose each row's next token from `logits`; finish rows that are done.

        Returns the indices of the rows still generating. With `first`, rows that asked for
        label log-probs get them, and rows that asked for no tokens at all (max_tokens=0)
        finish before a token is chosen.
        """
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = choose_tokens(logprobs, [s.sampling for s in rows])
        chosen_logprobs = logprobs.gather(
            1, torch.tensor(chosen, device=logprobs.device).unsqueeze(1)).squeeze(1).tolist()
        top = _top_k(logprobs, max(s.request.top_logprobs for s in rows))
        live: list[int] = []
        for index, sequence in enumerate(rows):
            if first and sequence.request.label_token_ids:
                sequence.label_logprobs = tuple(
                    logprobs[index, list(sequence.request.label_token_ids)].tolist())
            if first and sequence.request.max_tokens == 0:
                sequence.finish_reason = "length"
            else:
                k = sequence.request.top_logprobs
                entry = TokenLogprob(chosen[index], chosen_logprobs[index], top[index][:k])
                sequence.tokens.append(chosen[index])
                sequence.logprobs.append(entry)
                self.metrics.generation_tokens.inc()
                self._check_finished(sequence)
                if sequence.listener is not None:
                    sequence.listener(TokenEvent(entry, sequence.finish_reason is not None,
                                                 sequence.prompt_logprobs))
            if sequence.finish_reason is not None:
                self._resolve(sequence)
            else:
                live.append(index)
        return live

    def _check_finished(self, sequence: _Sequence) -> None:
        request = sequence.request
        if sequence.tokens[-1] in self.served.eos_token_ids:
            sequence.finish_reason = "stop"
            return
        if request.stop:
            text = self._decode(sequence.tokens)
            at = first_stop(text, request.stop)
            if at is not None:
                sequence.finish_reason, sequence.text = "stop", text[:at]
                return
        if len(sequence.tokens) >= request.max_tokens:
            sequence.finish_reason = "length"

    def _resolve(self, sequence: _Sequence) -> None:
        if sequence.text is None:
            tokens = sequence.tokens
            if tokens and tokens[-1] in self.served.eos_token_ids:
                tokens = tokens[:-1]
            sequence.text = self._decode(tokens)
        assert sequence.finish_reason is not None
        result = SequenceResult(tuple(sequence.tokens), sequence.text, sequence.finish_reason,
                                tuple(sequence.logprobs), sequence.prompt_logprobs,
                                sequence.label_logprobs, tuple(sequence.marked_label_logprobs))
        if sequence.started_at is not None:
            self.metrics.inference_time.observe(time.monotonic() - sequence.started_at)
        self._let_go([sequence])  # first: a client that has its answer finds nothing in flight
        try:
            sequence.future.set_result(result)
        except InvalidStateError:
            pass  # cancelled by its client meanwhile: nobody is waiting for it

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.served.tokenizer.decode(tokens, skip_special_tokens=True)


class _AbandonCheck:
    """A decoder layer's pre-hook: the engine's `_before_layer` for that layer. A copy of the
    model (`copy.deepcopy`, made while the engine runs) gets a hook that does nothing: it is
    not this engine's model."""

    def __init__(self, engine: BatchingEngine, index: int) -> None:
        self.engine, self.index = engine, index

    def __call__(self, module: torch.nn.Module, args: object) -> None:
        self.engine._before_layer(self.index)

    def __deepcopy__(self, memo: dict) -> Callable[[torch.nn.Module, object], None]:
        return _no_check


def _no_check(module: torch.nn.Module, args: object) -> None:
    """The pre-hook a copied model keeps in place of `_AbandonCheck`."""


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer's decoder layers (a class named `...DecoderLayer`, as transformers
    names them); none found means passes stop only between passes."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def _prompt_logprobs(logits: torch.Tensor, targets: Sequence[int], k: int
                     ) -> list[TokenLogprob]:
    """Log-prob of each of `targets` under the logits row before it (`logits`: one row per
    target), with the k likeliest alternatives."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values = logprobs.gather(
        1, torch.tensor(targets, device=logprobs.device).unsqueeze(1)).squeeze(1).tolist()
    return [TokenLogprob(token, value, alternatives) for token, value, alternatives
            in zip(targets, values, _top_k(logprobs, k), strict=True)]


def _top_k(logprobs: torch.Tensor, k: int) -> list[tuple[tuple[int, float], ...]]:
    """For each row, its k most likely (token, log-prob) pairs; empty tuples when k is 0."""
    if k == 0:
        return [()] * logprobs.shape[0]
    values, indices = logprobs.topk(k, dim=-1)
    return [tuple(zip(i, v, strict=True))
            for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
