"""Settings of an index build (`IndexConfig`) and of a search (`SearchConfig`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, get_args

from sieverag.inference.errors import ConfigError
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.corpus import CorpusFormat
from sieverag.inference.retrieval.dense import DenseConfig
from sieverag.inference.retrieval.hybrid import RRF_K


def _from_dict(cls: type, payload: Any, where: str) -> Any:
    """Build dataclass `cls` from a dict, refusing unknown keys."""
    if not isinstance(payload, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(payload).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(payload) - known)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    try:
        return cls(**payload)
    except TypeError as error:
        raise ConfigError(f"{where}: {error}") from None


@dataclass(frozen=True)
class IndexConfig:
    """What to index and how: chunking, and which retrievers (None switches one off)."""

    chunking: ChunkingConfig = field(default_factory=ChunkingConfig, metadata={
        "help": "how documents are cut into chunks"})
    bm25: BM25Config | None = field(default_factory=BM25Config, metadata={
        "help": "BM25 settings, or None for no BM25 index"})
    dense: DenseConfig | None = field(default_factory=DenseConfig, metadata={
        "help": "dense settings, or None for no dense index"})
    corpus_format: CorpusFormat = field(default="auto", metadata={
        "help": "auto, jsonl, nutrition, squad or hotpotqa"})

    def __post_init__(self) -> None:
        if self.bm25 is None and self.dense is None:
            raise ConfigError("an index needs at least one retriever: enable bm25 or dense")
        if self.corpus_format not in get_args(CorpusFormat):
            raise ConfigError(f"corpus_format must be one of {', '.join(get_args(CorpusFormat))},"
                              f" got {self.corpus_format!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: Any) -> IndexConfig:
        """The config a manifest recorded; unknown keys are an error."""
        if not isinstance(payload, dict):
            raise ConfigError(f"index config must be a mapping, got {type(payload).__name__}")
        payload = dict(payload)
        parts = {
            "chunking": (ChunkingConfig, False),
            "bm25": (BM25Config, True),
            "dense": (DenseConfig, True),
        }
        for key, (part_cls, optional) in parts.items():
            if key in payload and not (optional and payload[key] is None):
                payload[key] = _from_dict(part_cls, payload[key], f"index config '{key}'")
        return _from_dict(cls, payload, "index config")


@dataclass(frozen=True)
class SearchConfig:
    """How searches fuse and rerank."""

    alpha: float = field(default=0.5, metadata={
        "help": "hybrid weight of the dense score (1 − alpha goes to BM25)"})
    rrf_k: int = field(default=RRF_K, metadata={"help": "reciprocal-rank fusion constant"})
    candidates: int = field(default=100, metadata={
        "help": "hits taken from each retriever before fusion"})
    rerank_depth: int = field(default=30, metadata={
        "help": "first-stage hits a reranker re-scores"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"search.alpha must be in [0, 1], got {self.alpha}")
        if self.rrf_k < 0:
            raise ConfigError(f"search.rrf_k must be >= 0, got {self.rrf_k}")
        if self.candidates < 1 or self.rerank_depth < 1:
            raise ConfigError(f"search.candidates and search.rerank_depth must be >= 1, got "
                              f"{self.candidates} and {self.rerank_depth}")
