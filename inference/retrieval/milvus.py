"""An index in Milvus, for corpora past one machine (`--retrieval.backend milvus
--retrieval.uri URI`).

One collection holds each chunk's text, its dense vector (the same sentence-transformers
embedder as a local index, `dense.make_encoder`) and Milvus's own BM25 full-text index (a
`Function` of type BM25 filling a sparse vector field from the analysed text, English
analyzer: stemming and stop words as the local BM25), so every mode runs in Milvus:

* `bm25` — full-text search on the sparse field (metric BM25, the build's k1 and b);
* `dense` — inner product of unit vectors (cosine) on the dense field;
* `hybrid` — `hybrid_search` of both, fused in Milvus by a `WeightedRanker` (1 − alpha on
  BM25, alpha on dense; Milvus normalises each score itself, so hybrid scores are Milvus's,
  not the local index's min-max fusion);
* `rrf` — `hybrid_search` with Milvus's `RRFRanker(rrf_k)`.

The same client code talks to a Milvus cluster (`http://host:19530`) and to Milvus Lite (a
local file whose name ends in `.db`, what the tests use). `build_collection` fills a
collection from a corpus (`sieverag index build --backend milvus`), in batches, resuming an
interrupted build; the collection's properties record what it holds (embedding model,
chunk fingerprint and counts), read back by `MilvusIndex.connect`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from sieverag.inference.core.errors import BackendUnavailableError, ConfigError, DatasetError
from sieverag.inference.core.types import Document
from sieverag.inference.retrieval.chunking import Chunk, chunk_corpus
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.corpus import load_corpora
from sieverag.inference.retrieval.dense import DenseConfig, Encoder, make_encoder
from sieverag.inference.retrieval.rerank import HitReranker
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.inference.retrieval.search_backend import (
    DEFAULT_COLLECTION,
    DEFAULT_TIMEOUT_S,
    check_search,
    fetch_depth,
    reranked,
)

if TYPE_CHECKING:
    from pymilvus import MilvusClient

MODES = ("bm25", "dense", "hybrid", "rrf")
FORMAT = "sieverag-milvus-1"
# Milvus's VARCHAR limit, in bytes.
MAX_TEXT_BYTES = 65_535
MAX_ID_BYTES = 1_024
INSERT_BATCH = 256
_OUTPUT_FIELDS = ["chunk_id", "source_id", "title", "text"]
MANIFEST_PROPERTY = "sieverag.manifest"
# English as the local BM25 reads it: lower case, Snowball stemming, English stop words (the
# `english` analyzer type is missing from Milvus Lite; these filters are in every Milvus).
ANALYZER = {"tokenizer": "standard",
            "filter": ["lowercase", {"type": "stemmer", "language": "english"},
                       {"type": "stop", "stop_words": ["_english_"]}]}
_INSTALL = "pip install 'sieverag[milvus]' (pymilvus and milvus-lite)"


@dataclass(frozen=True)
class CollectionManifest:
    """What a sieverag Milvus collection holds (`backend.IndexIdentity`), kept as JSON in its
    properties (`MANIFEST_PROPERTY`)."""

    fingerprint: str
    chunk_count: int
    source_count: int
    model: str
    dimension: int
    corpus: str

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **self.__dict__})

    @classmethod
    def from_description(cls, description: str, where: str) -> CollectionManifest:
        try:
            payload = json.loads(description)
            if payload.pop("format") != FORMAT:
                raise ValueError("another format")
            return cls(**payload)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise DatasetError(f"{where} was not built by `sieverag index build --backend "
                               "milvus` (its properties hold no sieverag manifest); "
                               "build it with that command, or name another "
                               "--retrieval.collection") from None


def _client(uri: str, token: str | None, timeout: float) -> MilvusClient:
    """A client on a cluster (http(s)://...) or Milvus Lite (a file ending in .db)."""
    try:
        from pymilvus import MilvusClient
    except ImportError:
        raise ConfigError(f"the Milvus backend needs pymilvus: {_INSTALL}") from None
    if not uri.startswith(("http://", "https://", "tcp://")) and not uri.endswith(".db"):
        raise ConfigError(f"retrieval.uri {uri!r} is neither a Milvus server URL "
                          "(http://host:19530) nor a Milvus Lite file (a path ending in .db)")
    try:
        return MilvusClient(uri=uri, token=token or "", timeout=timeout)
    except Exception as error:  # pymilvus raises its own MilvusException and grpc errors
        raise BackendUnavailableError(f"Milvus at {uri} cannot be reached ({type(error).__name__}"
                                      f": {error}); start it, or check retrieval.uri") from None


def _fingerprint(chunks: Sequence[Chunk]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(f"{chunk.id}\x00{chunk.title}\x00{chunk.text}\x00".encode())
    return digest.hexdigest()


def _row(position: int, chunk: Chunk, vector: Sequence[float]) -> dict[str, Any]:
    indexed = chunk.to_document().as_context()
    for name, value, limit in (("text", indexed, MAX_TEXT_BYTES),
                               ("id", chunk.id, MAX_ID_BYTES)):
        if len(value.encode()) > limit:
            raise DatasetError(f"chunk {chunk.id!r}: its {name} holds more than {limit} bytes, "
                               "Milvus's limit for a string; cut documents smaller "
                               "(--chunking.strategy tokens)")
    return {"position": position, "chunk_id": chunk.id, "source_id": chunk.source_id,
            "title": chunk.title, "text": chunk.text, "indexed": indexed,
            "dense": [float(v) for v in vector]}


def _create(client: MilvusClient, name: str, manifest: CollectionManifest,
            config: IndexConfig) -> None:
    from pymilvus import DataType, Function, FunctionType

    schema = client.create_schema(auto_id=False)
    schema.add_field("position", DataType.INT64, is_primary=True)
    schema.add_field("chunk_id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
    schema.add_field("source_id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
    schema.add_field("title", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("indexed", DataType.VARCHAR, max_length=MAX_TEXT_BYTES,
                     enable_analyzer=True, analyzer_params=ANALYZER)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=manifest.dimension)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(Function(name="indexed_bm25", function_type=FunctionType.BM25,
                                 input_field_names=["indexed"], output_field_names=["sparse"]))
    bm25 = config.bm25
    indexes = client.prepare_index_params()
    indexes.add_index(field_name="dense", index_type="AUTOINDEX", metric_type="IP")
    indexes.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX",
                      metric_type="BM25", params={"bm25_k1": bm25.k1 if bm25 else 1.2,
                                                  "bm25_b": bm25.b if bm25 else 0.75})
    client.create_collection(name, schema=schema, index_params=indexes)
    client.alter_collection_properties(name, properties={MANIFEST_PROPERTY: manifest.to_json()})


def _recorded(client: MilvusClient, name: str) -> str:
    """The manifest JSON a collection's properties hold ('' when none)."""
    return str(client.describe_collection(name).get("properties", {}).get(MANIFEST_PROPERTY, ""))


def _row_count(client: MilvusClient, name: str) -> int:
    client.load_collection(name)
    rows = client.query(name, filter="", output_fields=["count(*)"])
    return int(rows[0]["count(*)"])


def build_collection(corpus: Sequence[str], uri: str, config: IndexConfig, *,
                     collection: str = DEFAULT_COLLECTION, overwrite: bool = False,
                     token: str | None = None, encoder: Encoder | None = None,
                     batch_size: int = INSERT_BATCH, show_progress: bool = True
                     ) -> CollectionManifest:
    """Chunk the corpus file(s) as `config` says and load the chunks into the Milvus
    collection `collection` at `uri`: text, dense vector (`config.dense`'s model, or
    `encoder`) and BM25 (`config.bm25`'s k1 and b). A collection holding another corpus or
    model needs `overwrite`; one holding this corpus's chunks in part is resumed."""
    if config.dense is None or config.bm25 is None:
        raise ConfigError("a Milvus collection holds BM25 and dense together: build it with "
                          "both retrievers (--retrievers bm25,dense)")
    documents, _ = load_corpora(corpus, config.corpus_format)
    chunks = chunk_corpus(documents, config.chunking)
    if not chunks:
        raise DatasetError(f"corpus {', '.join(map(str, corpus))} produced no chunks")
    dense: DenseConfig = config.dense
    encode = encoder if encoder is not None else make_encoder(dense)
    dimension = int(encode([chunks[0].to_document().as_context()]).shape[1])
    manifest = CollectionManifest(fingerprint=_fingerprint(chunks), chunk_count=len(chunks),
                                  source_count=len(documents), model=dense.model,
                                  dimension=dimension, corpus=",".join(map(str, corpus)))
    client = _client(uri, token, DEFAULT_TIMEOUT_S)
    where = f"Milvus collection {collection!r} at {uri}"
    done = 0
    if client.has_collection(collection):
        found = _recorded(client, collection)
        same = False
        try:
            same = CollectionManifest.from_description(found, where) == manifest
        except DatasetError:
            same = False
        if overwrite or not same:
            if not overwrite:
                raise ConfigError(f"{where} already holds another index; pass --overwrite to "
                                  "replace it, or name another --collection")
            client.drop_collection(collection)
        else:
            done = _row_count(client, collection)
            if done == len(chunks):
                raise ConfigError(f"{where} already holds this index; pass --overwrite to "
                                  "rebuild it")
    if not client.has_collection(collection):
        _create(client, collection, manifest, config)
    with tqdm(total=len(chunks), initial=done, desc="Loading Milvus", unit="chunk",
              disable=not show_progress) as bar:
        for start in range(done, len(chunks), batch_size):
            batch = chunks[start:start + batch_size]
            vectors = encode([c.to_document().as_context() for c in batch])
            client.insert(collection, [_row(start + i, c, v) for i, (c, v)
                                       in enumerate(zip(batch, vectors, strict=True))])
            bar.update(len(batch))
    client.flush(collection)
    return manifest


class MilvusIndex:
    """A `SearchBackend` on a sieverag collection in Milvus; every mode runs in Milvus."""

    def __init__(self, client: MilvusClient, collection: str, manifest: CollectionManifest,
                 encoder: Encoder, where: str, search_config: SearchConfig | None = None
                 ) -> None:
        self.client = client
        self.collection = collection
        self.manifest = manifest
        self.encode = encoder
        self.where = where
        self.search_config = search_config if search_config is not None else SearchConfig()

    @classmethod
    def connect(cls, uri: str, collection: str = DEFAULT_COLLECTION, *,
                search_config: SearchConfig | None = None, token: str | None = None,
                timeout: float = DEFAULT_TIMEOUT_S, encoder: Encoder | None = None
                ) -> MilvusIndex:
        """Open the collection `collection` at `uri`, loading it for search, and the query
        encoder its manifest names (or `encoder`)."""
        client = _client(uri, token, timeout)
        where = f"Milvus collection {collection!r} at {uri}"
        if not client.has_collection(collection):
            raise DatasetError(f"{where} does not exist: build it with `sieverag index build "
                               f"--corpus FILE --backend milvus --uri {uri} --collection "
                               f"{collection}`")
        manifest = CollectionManifest.from_description(_recorded(client, collection), where)
        rows = _row_count(client, collection)
        if rows != manifest.chunk_count:
            raise DatasetError(f"{where} holds {rows} of its {manifest.chunk_count} chunks: its "
                               "build was interrupted; rerun `sieverag index build --backend "
                               "milvus` to finish it")
        encode = encoder if encoder is not None else make_encoder(DenseConfig(model=manifest.model))
        return cls(client, collection, manifest, encode, where, search_config)

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               reranker: HitReranker | None = None) -> list[RetrievedDocument]:
        """The top-k chunks for `query`, best first."""
        return self.search_many([query], k, mode, reranker)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, mode: str = "hybrid",
                    reranker: HitReranker | None = None) -> list[list[RetrievedDocument]]:
        """`search` for each query, in one Milvus request (blank queries find nothing)."""
        check_search(self.where, MODES, mode, k)
        fetch = fetch_depth(k, reranker, self.search_config)
        asked = [q for q in queries if q.strip()]
        found = iter(self._searchers[mode](self, asked, fetch) if asked else [])
        hits = [next(found) if q.strip() else [] for q in queries]
        return reranked(queries, hits, k, reranker)

    def _bm25(self, queries: list[str], k: int) -> list[list[RetrievedDocument]]:
        rankings = self._run(lambda: self.client.search(
            self.collection, data=queries, anns_field="sparse", limit=k,
            search_params={"metric_type": "BM25"}, output_fields=_OUTPUT_FIELDS))
        # Milvus Lite reports a BM25 score negated (as a distance), a cluster as it is; BM25 is
        # never negative, so its magnitude is the score on both.
        return [[replace(hit, score=abs(hit.score)) for hit in ranking] for ranking in rankings]

    def _dense(self, queries: list[str], k: int) -> list[list[RetrievedDocument]]:
        vectors = self.encode(queries).tolist()
        return self._run(lambda: self.client.search(
            self.collection, data=vectors, anns_field="dense", limit=k,
            search_params={"metric_type": "IP"}, output_fields=_OUTPUT_FIELDS))

    def _fused(self, queries: list[str], k: int, ranker: Any) -> list[list[RetrievedDocument]]:
        from pymilvus import AnnSearchRequest

        depth = max(k, self.search_config.candidates)
        requests = [AnnSearchRequest(data=queries, anns_field="sparse",
                                     param={"metric_type": "BM25"}, limit=depth),
                    AnnSearchRequest(data=self.encode(queries).tolist(), anns_field="dense",
                                     param={"metric_type": "IP"}, limit=depth)]
        return self._run(lambda: self.client.hybrid_search(
            self.collection, reqs=requests, ranker=ranker, limit=k,
            output_fields=_OUTPUT_FIELDS))

    def _hybrid(self, queries: list[str], k: int) -> list[list[RetrievedDocument]]:
        from pymilvus import WeightedRanker

        alpha = self.search_config.alpha
        return self._fused(queries, k, WeightedRanker(1.0 - alpha, alpha))

    def _rrf(self, queries: list[str], k: int) -> list[list[RetrievedDocument]]:
        from pymilvus import RRFRanker

        return self._fused(queries, k, RRFRanker(self.search_config.rrf_k))

    _searchers: dict[str, Callable[[MilvusIndex, list[str], int],
                                   list[list[RetrievedDocument]]]] = {
        "bm25": _bm25, "dense": _dense, "hybrid": _hybrid, "rrf": _rrf}

    def _run(self, call: Callable[[], Any]) -> list[list[RetrievedDocument]]:
        try:
            results = call()
        except Exception as error:  # pymilvus raises its own MilvusException and grpc errors
            raise BackendUnavailableError(f"{self.where} failed a search ({type(error).__name__}"
                                          f": {error})") from None
        return [[_hit(hit) for hit in ranking] for ranking in results]


def _hit(hit: Any) -> RetrievedDocument:
    entity = hit["entity"]
    document = Document(id=entity["chunk_id"], text=entity["text"], title=entity["title"])
    return RetrievedDocument(document, float(hit["distance"]), entity["source_id"])
