"""Questions in flight for the training commands (`eval-filter`, `filter fit-combination`):
each per-question loop runs through `inference.in_flight.run_in_flight`, and a run's
in-process models share one `CallBatcher`, as `sieverag eval` runs them.

`by_question` is the loop: the results come back by question id in dataset order, whatever
order the questions finish in, so every report reads the same at any `--concurrency`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from tqdm.auto import tqdm

from sieverag.inference.core.in_flight import run_in_flight
from sieverag.inference.core.types import Example

Result = TypeVar("Result")


def by_question(examples: Sequence[Example], work: Callable[[Example], Result], *,
                concurrency: int = 1, desc: str, progress: bool = True,
                resumable: bool = True) -> dict[str, Result]:
    """Example id → `work(example)` for every example, `concurrency` at once, in dataset
    order. A failing question raises `QuestionFailedError` naming its id (`resumable`: whether
    what finished is kept for a rerun, as a `CachingBackend` keeps the filter's reads)."""
    finished: dict[str, Result] = {}

    def keep(example: Example, result: Result) -> None:
        finished[example.id] = result

    with tqdm(total=len(examples), desc=desc, unit="question", disable=not progress) as bar:
        run_in_flight(examples, work, keep, concurrency=concurrency,
                      name=lambda e: repr(e.id), bar=bar, resumable=resumable)
    return {e.id: finished[e.id] for e in examples}
