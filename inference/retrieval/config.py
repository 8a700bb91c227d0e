"""Settings of an index build (`IndexConfig`) and of a search (`SearchConfig`)."""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least, settings, validate_settings
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.corpus import CorpusFormat
from sieverag.inference.retrieval.dense import DenseConfig
from sieverag.inference.retrieval.hybrid import RRF_K


@settings
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: Any) -> IndexConfig:
        """The config a manifest recorded; unknown keys are an error."""
        return validate_settings(cls, payload, "index config")


@settings
class SearchConfig:
    """How searches fuse and rerank."""

    alpha: float = field(default=0.5, metadata={
        "help": "hybrid weight of the dense score (1 − alpha goes to BM25)"})
    rrf_k: int = field(default=RRF_K, metadata={"help": "reciprocal-rank fusion constant"})
    candidates: int = field(default=100, metadata={
        "help": "hits taken from each retriever before fusion"})
    rerank_depth: int = field(default=30, metadata={
        "help": "first-stage hits a reranker re-scores"})
    nprobe: int = field(default=32, metadata={
        "help": "dense IVF indexes: clusters searched per query (more: better recall, slower)"})
    ef_search: int = field(default=128, metadata={
        "help": "dense HNSW indexes: candidate list size while searching the graph"})
    rerank_factor: int = field(default=10, metadata={
        "help": "dense indexes that keep their full vectors: rerank_factor·k candidates are "
                "re-scored exactly from them (1: no re-ranking)"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"search.alpha must be in [0, 1], got {self.alpha}")
        at_least(0, "search.", rrf_k=self.rrf_k)
        at_least(1, "search.", candidates=self.candidates, rerank_depth=self.rerank_depth,
                 nprobe=self.nprobe, ef_search=self.ef_search, rerank_factor=self.rerank_factor)
