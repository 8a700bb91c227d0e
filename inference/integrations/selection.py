"""What a ranker is and which of its results a caller gets, shared by the rerank endpoint's
client (`rerank_client.RerankEndpoint`) and the filter run in this process
(`in_process.InProcessFilter`).

`keep` says which results a caller gets:

* `"kept"` — the documents the filter's bar keeps, best first, at most `top_n`;
* `"top_n"` — the `top_n` best by `relevance_score`, kept or not (all, best first, without
  `top_n`): a plain reranker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, get_args

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import RerankResult

Keep = Literal["kept", "top_n"]
Granularity = Literal["chunk", "sentence"]


class Ranker(Protocol):
    """What the adapters call: the results to keep for `texts` (by their `index` there), best
    first. `RerankEndpoint` (over HTTP) and `InProcessFilter` are rankers."""

    def select(self, query: str, texts: Sequence[str]) -> list[RerankResult]: ...

    async def aselect(self, query: str, texts: Sequence[str]) -> list[RerankResult]: ...


def check_selection(keep: str, top_n: int | None, granularity: str) -> None:
    """Refuse (ConfigError) a `keep`, `top_n` or `granularity` a ranker cannot use."""
    if keep not in get_args(Keep):
        raise ConfigError(f"keep must be one of {get_args(Keep)}, got {keep!r}")
    if granularity not in get_args(Granularity):
        raise ConfigError(f"granularity must be one of {get_args(Granularity)}, got "
                          f"{granularity!r}")
    if top_n is not None and top_n < 1:
        raise ConfigError(f"top_n must be >= 1 or None, got {top_n}")


def choose(best_first: Sequence[RerankResult], keep: Keep, top_n: int | None
           ) -> list[RerankResult]:
    """What a caller gets of results ordered best first: the kept ones (`keep="kept"`) or
    all, then at most `top_n`."""
    chosen = [r for r in best_first if r.kept] if keep == "kept" else list(best_first)
    return chosen[:top_n]
