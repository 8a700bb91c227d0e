"""What a labelling run's teacher cost: `usage.jsonl`, a crash-safe ledger of every reply's
tokens, the prices that turn them into dollars, and the budget that stops a run before it
passes `--teacher.max-cost`.

Each reply's usage is appended to `usage.jsonl` in the run folder as it arrives: one JSON
line (`key`: the request's cache key, `prompt_tokens`, `completion_tokens` (reasoning
included, as OpenAI bills them), `reasoning_tokens`, `cached_tokens`, `cost_usd`), flushed and
fsynced (`JsonlLog`), so a run killed at any moment keeps what it paid for; a line torn by the
kill is dropped on reading. A resumed run appends to the same file, so the ledger sums every
run of the folder. The reply is cached (`teacher_cache.jsonl`) before its ledger line is
written; a reply cached whose line the kill cut off is entered when the next run opens the
ledger (`settle_receipts`), so the ledger misses no reply the run received.

Dollars: `(prompt - cached) × price_in + cached × price_cached + completion × price_out`,
prices in USD per million tokens. `max_cost` bounds the whole folder's spending (every run):
before a request goes out, its worst case (its prompt at the most tokens a byte has counted so
far, one a byte before any reply, plus every reply token it allows) is reserved, and a request
that could pass the budget is not sent: the run stops with `BudgetExhaustedError`, and
resumes with a higher `--teacher.max-cost`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.llm.openai_backend import ReplyUsage

USAGE_FILE = "usage.jsonl"
_COUNTS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens")


class BudgetExhaustedError(SieveragError):
    """The next request could pass `--teacher.max-cost`; nothing finished is lost."""


@dataclass(frozen=True)
class Prices:
    """USD per million tokens: prompt (`price_in`), prompt tokens read from the server's
    cache (`price_cached`; None: `price_in`), reply (`price_out`)."""

    price_in: float = 0.0
    price_out: float = 0.0
    price_cached: float | None = None

    def cost(self, usage: ReplyUsage) -> float:
        cached = self.price_in if self.price_cached is None else self.price_cached
        return ((usage.prompt_tokens - usage.cached_tokens) * self.price_in
                + usage.cached_tokens * cached + usage.completion_tokens * self.price_out) / 1e6

    @property
    def free(self) -> bool:
        return not (self.price_in or self.price_out or self.price_cached)


@dataclass
class LedgerTotals:
    """The ledger's sums: replies, tokens, dollars."""

    replies: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, usage: ReplyUsage, cost: float) -> None:
        self.replies += 1
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(usage, name))
        self.cost_usd += cost

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost_usd": round(self.cost_usd, 6)}


class UsageLedger:
    """`usage.jsonl` of one run folder: its totals so far (every run), appended reply by reply
    (thread-safe), and the budget each request reserves from."""

    def __init__(self, path: Path, prices: Prices, max_cost: float | None = None) -> None:
        self._log = JsonlLog(path)
        self.prices = prices
        self.max_cost = max_cost
        self.totals = LedgerTotals()
        self.keys: set[str] = set()
        self._reserved = 0.0
        self._tokens_per_byte = 0.0  # the most a prompt byte has counted, once replies tell
        self._lock = threading.Lock()
        for line in self._log.read():
            usage = ReplyUsage(**{name: int(line.get(name, 0)) for name in _COUNTS})
            self.totals.add(usage, prices.cost(usage))
            self.keys.add(str(line.get("key", "")))

    def record(self, key: str, usage: ReplyUsage, prompt_bytes: int | None = None) -> None:
        """Append one reply's line (fsynced) and count it."""
        cost = self.prices.cost(usage)
        with self._lock:
            self._log.append({"key": key, **asdict(usage), "cost_usd": round(cost, 8),
                              "at": round(time.time(), 3)})
            self.totals.add(usage, cost)
            self.keys.add(key)
            if prompt_bytes and usage.prompt_tokens:
                self._tokens_per_byte = max(self._tokens_per_byte,
                                            usage.prompt_tokens / prompt_bytes)

    def settle_receipts(self, receipts: Iterable[tuple[str, ReplyUsage]]) -> int:
        """Enter the cached replies (key, usage) that have no line yet (a run killed between
        caching a reply and writing its line); how many were entered."""
        missing = [(key, usage) for key, usage in receipts if key not in self.keys]
        for key, usage in missing:
            self.record(key, usage)
        return len(missing)

    @contextmanager
    def reserve(self, prompt_bytes: int, reply_tokens: int) -> Iterator[None]:
        """Hold the worst-case cost of one request while it is out; `BudgetExhaustedError`,
        before anything is sent, when it could take the spending past `max_cost`."""
        if self.max_cost is None:
            yield
            return
        per_byte = self._tokens_per_byte * 1.25 if self._tokens_per_byte else 1.0
        worst = self.prices.cost(ReplyUsage(prompt_tokens=math.ceil(prompt_bytes * per_byte),
                                            completion_tokens=reply_tokens))
        with self._lock:
            spent = self.totals.cost_usd
            if spent + self._reserved + worst > self.max_cost:
                raise BudgetExhaustedError(
                    f"the teacher has cost ${spent:.4f} of --teacher.max-cost "
                    f"${self.max_cost:g} in this folder, and the next request could cost up to "
                    f"${worst:.4f} more; stopped before sending it (everything finished is "
                    "kept): rerun with a higher --teacher.max-cost to go on")
            self._reserved += worst
        try:
            yield
        finally:
            with self._lock:
                self._reserved -= worst

    def progress(self, answered: int, total: int) -> str:
        """"$0.42 so far, ~$3.10 for the run": dollars spent and, once some of the `total`
        requests are `answered`, the whole run's projected cost."""
        with self._lock:
            spent = self.totals.cost_usd
        if self.prices.free:
            return f"{self.totals.replies} teacher replies"
        projected = f", ~${spent * total / answered:.2f} for the run" if answered else ""
        return f"${spent:.2f} so far{projected}"


@contextmanager
def progress_ticker(bar: Any, note: Callable[[], str], every_s: float = 1.0) -> Iterator[None]:
    """Show `note()` after the bar's description every `every_s` seconds while open (a wait
    counts down even when no question finishes)."""
    description = getattr(bar, "desc", "") or ""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.set_description_str(f"{description} ({note()})")

    if getattr(bar, "disable", True):
        yield
        return
    thread = threading.Thread(target=tick, name="teacher-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.set_description_str(f"{description} ({note()})")
