"""Questions in flight share one in-process model: their concurrent calls run as one batch.

`--concurrency N` runs N questions at once, each in its own thread, each through exactly the
pipeline it runs alone. Against a served model their requests meet in the server's batches.
In-process, `CallBatcher` plays the server's part: every in-process backend of a run is
wrapped (`BatchedBackend`), and one worker thread runs all their calls, one at a time (one
model, one owner: a second thread computing on the same weights would only take cores from
the first). While it runs one call, the others queue; it then takes the oldest waiting call
and every waiting call of the same backend, operation and settings, and runs them as one call
whose prompts are all theirs, in arrival order. The backend batches those prompts as it
batches one question's (similar lengths together, a shared prefix computed once), so the
work of many questions fills each forward pass.

Greedy answers are those of one question at a time: a batch changes which rows sit together,
so scores may differ by float rounding only (tested). Each question keeps its own usage: the
backend meters prompt by prompt (`UsageMeter.record_rows`) and each question gets its own
prompts' counts; its seconds are the wall time it waited for each call, queue included.
A merged call that fails is run again question by question, so only the question whose
prompts fail gets the error.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import (
    GenerationSettings,
    LLMBackend,
    Usage,
    add_question_seconds,
    check_continuations,
    current_question_usage,
    rows_owned_by,
)

if TYPE_CHECKING:
    from sieverag.inference.llm.backend_registry import BackendSpec

_DEFAULT_SETTINGS = GenerationSettings()
# How long the idle worker waits after a call arrives for the others of the same moment (the
# questions that start together), and the most prompts one merged call carries.
BATCH_WINDOW_S = 0.005
MAX_BATCH_PROMPTS = 256
T = TypeVar("T")


@dataclass(eq=False)
class _Call:
    """One question's call, waiting for the worker."""

    backend: LLMBackend
    operation: str
    key: Hashable  # calls with equal keys may run as one
    prompts: Sequence[Conversation]
    per_prompt: Sequence[Any] | None  # one argument per prompt (continuations), merged too
    shared: tuple[Any, ...]  # the same for every call with this key (labels, settings)
    agent: str
    tally: dict[str, Usage] | None  # the calling question's usage
    future: Future = field(default_factory=Future)


class CallBatcher:
    """One worker thread that runs the calls of every backend it wraps, merged across the
    questions that wait on them."""

    def __init__(self, *, window_s: float = BATCH_WINDOW_S,
                 max_prompts: int = MAX_BATCH_PROMPTS) -> None:
        if window_s < 0 or max_prompts < 1:
            raise ValueError(f"window_s must be >= 0 and max_prompts >= 1, got {window_s} and "
                             f"{max_prompts}")
        self.window_s = window_s
        self.max_prompts = max_prompts
        self.merged_sizes: list[int] = []  # questions per call run (for tests and benchmarks)
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._waiting: deque[_Call] = deque()
        self._wrapped: dict[int, BatchedBackend] = {}
        self._thread = threading.Thread(target=self._work, name="sieverag-batcher", daemon=True)
        self._thread.start()

    def wrap(self, backend: LLMBackend) -> BatchedBackend:
        """`backend` with its calls run here (one wrapper per backend)."""
        if isinstance(backend, BatchedBackend):
            return backend
        wrapper = self._wrapped.get(id(backend))
        if wrapper is None:
            wrapper = self._wrapped[id(backend)] = BatchedBackend(backend, self)
        return wrapper

    def close(self) -> None:
        """Stop the worker once the calls queued so far have run."""
        self._queue.put(None)
        self._thread.join()

    def __enter__(self) -> CallBatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, call: _Call) -> Any:
        """Queue `call`, wait for its result (or its error); its wait counts as its seconds."""
        started = time.perf_counter()
        self._queue.put(call)
        try:
            return call.future.result()
        finally:
            add_question_seconds(call.agent, time.perf_counter() - started)

    # ----- the worker -----

    def _work(self) -> None:
        while True:
            if not self._waiting:
                first = self._queue.get()
                if first is None:
                    return
                self._waiting.append(first)
                time.sleep(self.window_s)
            if not self._drain():
                return
            self._run(self._next_batch())

    def _drain(self) -> bool:
        """Move every queued call to the waiting line; False once closed (after running what
        was already waiting)."""
        if drain_queue(self._queue, self._waiting.append):
            return True
        while self._waiting:
            self._run(self._next_batch())
        return False

    def _next_batch(self) -> list[_Call]:
        """The oldest waiting call and the later ones it can run with, up to max_prompts."""
        first = self._waiting.popleft()
        batch, prompts, rest = [first], len(first.prompts), deque()
        while self._waiting:
            call = self._waiting.popleft()
            if call.key == first.key and prompts + len(call.prompts) <= self.max_prompts:
                batch.append(call)
                prompts += len(call.prompts)
            else:
                rest.append(call)
        self._waiting = rest
        return batch

    def _run(self, batch: list[_Call]) -> None:
        self.merged_sizes.append(len(batch))
        try:
            results = _run_merged(batch)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting questions
            if len(batch) == 1:
                batch[0].future.set_exception(error)
                return
            for call in batch:  # only the question whose prompts fail gets the error
                self._run([call])
            return
        for call, result in zip(batch, results, strict=True):
            call.future.set_result(result)


def drain_queue(source: queue.SimpleQueue[T | None], take: Callable[[T], object]) -> bool:
    """Hand every item queued in `source` to `take`, in order, without waiting: True once the
    queue is empty, False at the closing sentinel None (items queued after it stay queued)."""
    while True:
        try:
            item = source.get_nowait()
        except queue.Empty:
            return True
        if item is None:
            return False
        take(item)


def _run_merged(batch: Sequence[_Call]) -> list[list[Any]]:
    """Run the calls of `batch` (equal keys) as one backend call; each call's results."""
    first = batch[0]
    prompts = [p for call in batch for p in call.prompts]
    arguments: tuple[Any, ...] = first.shared
    if first.per_prompt is not None:
        arguments = ([a for call in batch for a in call.per_prompt or ()], *arguments)
    operation: Callable[..., list[Any]] = getattr(first.backend, first.operation)
    with rows_owned_by([(call.tally, len(call.prompts)) for call in batch]):
        results = operation(prompts, *arguments, agent=first.agent)
    split, start = [], 0
    for call in batch:
        split.append(results[start:start + len(call.prompts)])
        start += len(call.prompts)
    return split


def question_batcher(concurrency: int, all_served: bool
                     ) -> AbstractContextManager[CallBatcher | None]:
    """A run's one `CallBatcher` when several questions are in flight and some model runs
    in-process (a served model batches on its server); else a context giving None."""
    return CallBatcher() if concurrency > 1 and not all_served else nullcontext()


def on_batcher(backend: LLMBackend, served: bool, batcher: CallBatcher | None) -> LLMBackend:
    """`backend` with its calls merged on `batcher` when it runs in-process; as it is when
    `served` (its server batches) or without a batcher."""
    return backend if batcher is None or served else batcher.wrap(backend)


def warn_capped_requests(specs: Sequence[BackendSpec], concurrency: int) -> None:
    """Say so (stderr) when a served model's `max_concurrency` holds fewer requests in flight
    than the questions in flight: the server's batches then stay partly empty (not an
    error)."""
    for spec in specs:
        if spec.endpoint is not None and spec.max_concurrency < concurrency:
            print(f"note: {concurrency} questions in flight, but at most "
                  f"{spec.max_concurrency} requests at a time to {spec.model} at "
                  f"{spec.endpoint} (its max_concurrency); raise it to keep the server full",
                  file=sys.stderr)
            return


class BatchedBackend:
    """An `LLMBackend` whose calls run on a `CallBatcher`, merged with other questions'.
    Anything else (the tokenizer, `render`, the config) is the wrapped backend's."""

    def __init__(self, backend: LLMBackend, batcher: CallBatcher) -> None:
        self.backend = backend
        self.batcher = batcher

    @property
    def meter(self):  # noqa: ANN201 - the wrapped backend's UsageMeter
        return self.backend.meter

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def _call(self, operation: str, prompts: Sequence[Conversation], *, agent: str,
              shared: tuple[Any, ...] = (), per_prompt: Sequence[Any] | None = None
              ) -> list[Any]:
        if not prompts:  # nothing to batch: the backend answers (and checks) an empty call
            extra = () if per_prompt is None else (list(per_prompt),)
            return getattr(self.backend, operation)(prompts, *extra, *shared, agent=agent)
        key = (id(self.backend), operation, shared, agent)
        return self.batcher.call(_Call(self.backend, operation, key, list(prompts),
                                       None if per_prompt is None else list(per_prompt),
                                       shared, agent, current_question_usage()))

    def generate(self, prompts: Sequence[Conversation],
                 settings: GenerationSettings = _DEFAULT_SETTINGS, *,
                 agent: str = "generator") -> list[str]:
        return self._call("generate", prompts, agent=agent, shared=(settings,))

    def label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                       agent: str = "scorer") -> list[dict[str, float]]:
        return self._call("label_logprobs", prompts, agent=agent, shared=(tuple(labels),))

    def marked_label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                              agent: str = "scorer") -> list[list[dict[str, float]]]:
        return self._call("marked_label_logprobs", prompts, agent=agent,
                          shared=(tuple(labels),))

    def continuation_logprob(self, prompts: Sequence[Conversation],
                             continuations: Sequence[str], *, agent: str = "scorer"
                             ) -> list[float]:
        check_continuations(prompts, continuations)
        return self._call("continuation_logprob", prompts, agent=agent,
                          per_prompt=continuations)
