"""The trained filter run in this process, for the framework adapters when no server runs:
the same selection as `RerankEndpoint` (`keep`, `top_n`, `granularity`), computed by the same
code the server's `/v1/rerank` runs (`rank_by_filter`, MCF) on an `hf` backend of the filter
instead of over HTTP.

`InProcessFilter("smollm2-filter")` loads the embedded model with the shipped filter when it
is built (a few seconds; errors about the filter or the model come then, not at the first
query). Calls are serialised: one model, one forward pass at a time; `aselect` runs the
filter on a worker thread so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import replace

from sieverag.inference.core.types import Device, RerankResult
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.card.combination import adapter_combination
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.filters.ranking import as_documents, best_first, rank_by_filter
from sieverag.inference.integrations.selection import (
    Granularity,
    Keep,
    check_selection,
    choose,
)
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL


class InProcessFilter:
    """The documents the filter keeps (MCF's verdicts under `mcf`, the server's default bar
    unless given), best first; see `RerankEndpoint` for `keep`, `top_n` and `granularity`."""

    def __init__(self, filter: str = DEFAULT_FILTER_NAME, *, base_model: str = DEFAULT_MODEL,
                 keep: Keep = "kept", top_n: int | None = None,
                 granularity: Granularity = "chunk", mcf: MCFConfig | None = None,
                 device: Device = "auto") -> None:
        check_selection(keep, top_n, granularity)
        self.keep = keep
        self.top_n = top_n
        self.config = replace(mcf or MCFConfig(), sentence_stage=granularity == "sentence")
        folder = resolve_filter(filter, base_model)
        self.combination = adapter_combination(folder)
        self.backend = HFBackend(HFBackendConfig(model=base_model, adapter=str(folder),
                                                 device=device))
        self._lock = threading.Lock()

    def select(self, query: str, texts: Sequence[str]) -> list[RerankResult]:
        """The results to keep for `texts` (by their `index` there), best first."""
        if not texts:
            return []
        with self._lock:
            ranked = rank_by_filter(self.backend, self.config, query, as_documents(texts),
                                    self.combination)
        return choose(best_first(ranked), self.keep, self.top_n)

    async def aselect(self, query: str, texts: Sequence[str]) -> list[RerankResult]:
        """`select` on a worker thread."""
        return await asyncio.to_thread(self.select, query, list(texts))
