"""Where a run's index lives, and the one search surface every command uses on it.

`SearchBackend` is what eval, ask, amber's later queries and the router need of an index:
`search`/`search_many` (top-k hits in a mode, optionally reranked), `modes`, and `manifest`
(its `fingerprint`, chunk and source counts: what identifies the indexed chunks, for caches
and reports). Three backends satisfy it:

* a local index folder (`index_folder.Index`, loaded in this process; it satisfies the protocol as
  it is);
* `sieverag index serve` on another process or machine (`remote.RemoteIndex`,
  `--retrieval.endpoint URL`);
* a Milvus collection (`milvus.MilvusIndex`, `--retrieval.backend milvus --retrieval.uri URI`:
  a cluster's `http://host:19530` or a Milvus Lite file).

`IndexSource` names one of them and `chooser.open_backend` opens it: the one chooser every
command goes through.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import field, fields
from typing import TYPE_CHECKING, Literal, Protocol, get_args, runtime_checkable

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import settings
from sieverag.inference.retrieval.index_folder import SEARCH_MODES
from sieverag.inference.retrieval.retrieved import RetrievedDocument

if TYPE_CHECKING:
    from sieverag.inference.retrieval.config import SearchConfig
    from sieverag.inference.retrieval.rerank import HitReranker

BackendKind = Literal["sieverag", "milvus"]
BACKEND_KINDS: tuple[str, ...] = get_args(BackendKind)
DEFAULT_COLLECTION = "sieverag"
DEFAULT_TIMEOUT_S = 60.0


class IndexIdentity(Protocol):
    """What identifies an index's chunks (an index manifest has these and more)."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def chunk_count(self) -> int: ...

    @property
    def source_count(self) -> int: ...


@runtime_checkable
class SearchBackend(Protocol):
    """An index to search, wherever it lives (see the module docstring)."""

    @property
    def manifest(self) -> IndexIdentity: ...

    @property
    def modes(self) -> tuple[str, ...]: ...

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               reranker: HitReranker | None = None) -> list[RetrievedDocument]: ...

    def search_many(self, queries: Sequence[str], k: int = 10, mode: str = "hybrid",
                    reranker: HitReranker | None = None) -> list[list[RetrievedDocument]]: ...


def check_search(where: str, modes: Sequence[str], mode: str, k: int) -> None:
    """Refuse a search an index cannot answer: an unknown or unsupported mode, k < 1."""
    if mode not in SEARCH_MODES:
        raise ConfigError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    if mode not in modes:
        raise ConfigError(f"{where} cannot search in mode {mode!r}; it supports: "
                          f"{', '.join(modes)}")
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")


def fetch_depth(k: int, reranker: HitReranker | None, search_config: SearchConfig) -> int:
    """How many first-stage hits a search takes: k, or the reranker's depth when deeper."""
    return max(k, search_config.rerank_depth) if reranker is not None else k


def reranked(queries: Sequence[str], hits: Sequence[list[RetrievedDocument]], k: int,
             reranker: HitReranker | None) -> list[list[RetrievedDocument]]:
    """Each query's hits reranked (when a reranker is given) and cut to k."""
    if reranker is None:
        return [list(h[:k]) for h in hits]
    return [reranker.rerank(q, h)[:k] for q, h in zip(queries, hits, strict=True)]


_ENDPOINT_HELP = ("URL of a `sieverag index serve` server holding the index (http://host:port), "
                  "instead of a local folder")
_URI_HELP = "Milvus: a cluster's URI (http://host:19530) or a Milvus Lite file path"
_COLLECTION_HELP = (f"Milvus: the collection `sieverag index build --backend milvus` filled "
                    f"(unset: {DEFAULT_COLLECTION})")
_API_KEY_ENV_HELP = ("environment variable holding the endpoint's API key (sent as a bearer "
                     "token) or Milvus's token (user:password)")
_TIMEOUT_HELP = (f"seconds a served index or Milvus gets to answer one search request "
                 f"(unset: {DEFAULT_TIMEOUT_S:g})")


def check_one_index(index: str | None, endpoint: str | None, backend: str, uri: str | None,
                    folder: str = "retrieval.index") -> None:
    """Refuse a source naming no index, or more than one: a folder (the setting `folder`
    names it, for messages), a served index's `endpoint`, or Milvus at `uri`."""
    given = [value for value in (index, endpoint, uri) if value]
    if backend == "milvus":
        if uri is None:
            raise ConfigError("retrieval.backend milvus needs retrieval.uri: a cluster's "
                              "http://host:19530 or a Milvus Lite file path")
        if len(given) > 1:
            raise ConfigError(f"retrieval.backend milvus searches retrieval.uri only: drop "
                              f"{folder} and retrieval.endpoint")
        return
    if uri is not None:
        raise ConfigError("retrieval.uri names a Milvus server: add --retrieval.backend "
                          "milvus, or drop retrieval.uri")
    if len(given) != 1:
        raise ConfigError(f"retrieval needs one index: an index folder ({folder}) or a "
                          "`sieverag index serve` URL (retrieval.endpoint), not both and not "
                          "neither")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"retrieval.endpoint must be an http:// or https:// URL, got "
                          f"{endpoint!r}")


@settings
class IndexAddress:
    """Where an index is served: `sieverag index serve` at `endpoint`, or a Milvus collection
    (`backend: milvus`, `uri`). `ask` takes these beside its own `--index` folder
    (`source`); `IndexSource` adds the folder, for `eval`'s `retrieval` section."""

    endpoint: str | None = field(default=None, metadata={"help": _ENDPOINT_HELP})
    backend: BackendKind = field(default="sieverag", metadata={
        "help": "sieverag: an index folder, here or served (endpoint); milvus: a Milvus "
                "collection (uri)"})
    uri: str | None = field(default=None, metadata={"help": _URI_HELP})
    collection: str | None = field(default=None, metadata={"help": _COLLECTION_HELP})
    api_key_env: str | None = field(default=None, metadata={"help": _API_KEY_ENV_HELP})
    timeout: float | None = field(default=None, metadata={"help": _TIMEOUT_HELP})

    def source(self, index: str | None, folder: str) -> IndexSource:
        """The index source of the folder `index` (given as the setting `folder`, named in
        messages) or of these settings: exactly one of them names an index."""
        check_one_index(index, self.endpoint, self.backend, self.uri, folder)
        return IndexSource(index=index, **{spec.name: getattr(self, spec.name)
                                           for spec in fields(IndexAddress)})


@settings
class IndexSource(IndexAddress):
    """Which index a run searches: a local folder (`index`), `sieverag index serve` at
    `endpoint`, or a Milvus collection (`backend: milvus`, `uri`)."""

    index: str | None = field(default=None, metadata={
        "help": "index folder built by `sieverag index build` (searched in this process)"})

    def __post_init__(self) -> None:
        check_one_index(self.index, self.endpoint, self.backend, self.uri)
        if self.collection == "":
            raise ConfigError("retrieval.collection must name a Milvus collection")
        if self.api_key_env == "":
            raise ConfigError("retrieval.api_key_env must name an environment variable")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"retrieval.timeout must be > 0 seconds, got {self.timeout}")
        # A setting the index cannot use is refused, not ignored.
        folder = self.index is not None
        applies = {"collection": (self.collection, self.backend == "milvus"),
                   "api_key_env": (self.api_key_env, not folder),
                   "timeout": (self.timeout, not folder)}
        for name, (value, usable) in applies.items():
            if value is not None and not usable:
                raise ConfigError(f"retrieval.{name} does not apply to {self.location}: drop it")

    @property
    def collection_name(self) -> str:
        """The Milvus collection searched (`collection`, else the default)."""
        return self.collection or DEFAULT_COLLECTION

    @property
    def timeout_s(self) -> float:
        """Seconds a served index or Milvus gets per search (`timeout`, else the default)."""
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT_S

    @property
    def location(self) -> str:
        """Where the index is, in words (for messages)."""
        if self.backend == "milvus":
            return f"Milvus collection {self.collection_name!r} at {self.uri}"
        return f"index server {self.endpoint}" if self.endpoint else f"index {self.index}"


def read_secret(env_var: str | None, setting: str = "retrieval.api_key_env") -> str | None:
    """The key held by `env_var` (named by `setting`), or None without one; an unset or empty
    variable is an error naming it."""
    if env_var is None:
        return None
    value = os.environ.get(env_var, "")
    if not value:
        raise ConfigError(f"environment variable {env_var} ({setting}) is not set or empty: "
                          f"export the key in {env_var}, or drop {setting}")
    return value

