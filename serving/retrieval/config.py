"""The settings of `sieverag index serve` (its flags and YAML keys)."""

from __future__ import annotations

from dataclasses import field

from pydantic_settings import CliPositionalArg

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.retrieval.config import SearchConfig
from sieverag.inference.retrieval.index_folder import SearchMode
from sieverag.serving.config import LogLevel

# Search-R1's retrieval server answers this many passages when a request names no topk.
SEARCH_R1_TOPK = 3


@settings
class RetrievalServerConfig:
    """Serve one index folder over HTTP: Search-R1's `POST /retrieve` (so agentic-RAG
    trainers can use it) and sieverag's `POST /v1/search` (every mode; what
    `--retrieval.endpoint` reads), batched, with `/health`."""

    index: CliPositionalArg[str] = field(metadata={
        "help": "index folder built by `sieverag index build`"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to bind (127.0.0.1: this machine only; 0.0.0.0: every interface)"})
    port: int = field(default=8000, metadata={"help": "TCP port; 0 picks a free one"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "require `Authorization: Bearer <key>` on every route but /health, the key read "
                "from this environment variable"})
    mode: SearchMode | None = field(default=None, metadata={
        "help": "the mode of /retrieve (Search-R1's route names none): bm25, dense, hybrid or "
                "rrf; default hybrid when the index has BM25 and dense, else the one it has"})
    topk: int = field(default=SEARCH_R1_TOPK, metadata={
        "help": "passages /retrieve answers when a request gives no topk (Search-R1's 3)"})
    max_queries: int = field(default=256, metadata={
        "help": "most queries in one request (a client sends more in several)"})
    max_k: int = field(default=1000, metadata={"help": "most hits one query may ask for"})
    max_request_bytes: int = field(default=8 * 1024 * 1024, metadata={
        "help": "largest request body in bytes; a larger one gets 413 before it is read"})
    cache: bool = field(default=True, metadata={
        "help": "keep rankings in the index folder's retrieval cache"})
    search: SearchConfig = field(default_factory=SearchConfig, metadata={
        "help": "how searches fuse (clients must fuse the same: they check at start)"})
    log_level: LogLevel = field(default="info", metadata={"help": "server log level"})
    access_log: bool = field(default=True, metadata={"help": "log one line per request"})

    def __post_init__(self) -> None:
        if not self.index:
            raise ConfigError("index must name an index folder (`sieverag index build --out`)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.api_key_env is not None and not self.api_key_env:
            raise ConfigError("api_key_env must name an environment variable, got ''")
        at_least(1, topk=self.topk, max_queries=self.max_queries, max_k=self.max_k,
                 max_request_bytes=self.max_request_bytes)
        if self.topk > self.max_k:
            raise ConfigError(f"topk ({self.topk}) must be <= max_k ({self.max_k})")
