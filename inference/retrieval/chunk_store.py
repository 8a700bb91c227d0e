"""The chunk store: an index's chunks on disk, read by position through a memory map.

Two files:

    chunks.jsonl     one chunk per line: id, source_id, position, text, title
    chunks.offsets   little-endian int64 byte offsets: where each line starts, plus the
                     file's length (so chunk i is bytes offsets[i]:offsets[i + 1])

Opening a store maps both files; nothing is read until a ranking asks for a chunk, so the
memory a loaded index costs does not grow with the corpus (the pages the OS keeps cached
are shared and given back under pressure). Writing streams: one chunk at a time, each file
staged next to its target and renamed into place when the store is complete.

An index folder from before the offsets file holds `chunks.jsonl` alone;
`write_offsets` (run by `sieverag index convert`) adds the offsets by reading it once.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from sieverag.inference.core.io_utils import atomic_file
from sieverag.inference.retrieval.chunking import Chunk

CHUNKS_FILE = "chunks.jsonl"
OFFSETS_FILE = "chunks.offsets"
FILES = (CHUNKS_FILE, OFFSETS_FILE)
_OFFSET = np.dtype("<i8")
# Offsets buffered before a write: 64k × 8 bytes.
_OFFSET_BATCH = 65_536


def indexed_text(chunk: Chunk) -> str:
    """What the retrievers index of a chunk: its title line plus its text."""
    return chunk.to_document().as_context()


class ChunkStoreWriter:
    """Appends chunks to a store being written (see `write_chunk_store`)."""

    def __init__(self, lines: object, offsets: object) -> None:
        self._lines = lines
        self._offsets = offsets
        self._pending: list[int] = []
        self._end = 0
        self.count = 0

    def add(self, chunk: Chunk) -> None:
        """Append one chunk (the next position)."""
        line = (json.dumps(asdict(chunk), ensure_ascii=False) + "\n").encode()
        self._lines.write(line)  # type: ignore[attr-defined]
        self._pending.append(self._end)
        self._end += len(line)
        self.count += 1
        if len(self._pending) >= _OFFSET_BATCH:
            self._flush()

    def _flush(self) -> None:
        self._offsets.write(np.asarray(self._pending, dtype=_OFFSET).tobytes())  # type: ignore[attr-defined]
        self._pending.clear()

    def finish(self) -> None:
        self._pending.append(self._end)
        self._flush()


@contextmanager
def write_chunk_store(directory: Path) -> Iterator[ChunkStoreWriter]:
    """Yield a writer; when the block succeeds both files replace the folder's store."""
    with ExitStack() as stack:
        lines = stack.enter_context(atomic_file(Path(directory) / CHUNKS_FILE, "wb"))
        offsets = stack.enter_context(atomic_file(Path(directory) / OFFSETS_FILE, "wb"))
        writer = ChunkStoreWriter(lines, offsets)
        yield writer
        writer.finish()


def write_offsets(directory: Path) -> int:
    """Write the offsets file of a folder's `chunks.jsonl` (reading it once, line by line);
    returns the number of chunks. Blank lines are not chunks and are refused."""
    directory = Path(directory)
    count = 0
    with (directory / CHUNKS_FILE).open("rb") as lines, \
            atomic_file(directory / OFFSETS_FILE, "wb") as offsets:
        pending: list[int] = []
        end = 0
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                raise ValueError(f"{directory / CHUNKS_FILE}, line {number} is blank")
            pending.append(end)
            end += len(line)
            count += 1
            if len(pending) >= _OFFSET_BATCH:
                offsets.write(np.asarray(pending, dtype=_OFFSET).tobytes())
                pending.clear()
        pending.append(end)
        offsets.write(np.asarray(pending, dtype=_OFFSET).tobytes())
    return count


class ChunkStore:
    """The chunks of an index, read by position; a read-only sequence of `Chunk`s."""

    def __init__(self, directory: Path) -> None:
        directory = Path(directory)
        self.directory = directory
        self._offsets = np.memmap(directory / OFFSETS_FILE, dtype=_OFFSET, mode="r")
        if len(self._offsets) < 1:
            raise ValueError(f"{directory / OFFSETS_FILE} is empty")
        size = (directory / CHUNKS_FILE).stat().st_size
        if int(self._offsets[-1]) != size:
            raise ValueError(f"{directory / OFFSETS_FILE} ends at byte {int(self._offsets[-1])}"
                             f" but {CHUNKS_FILE} has {size} bytes")
        with (directory / CHUNKS_FILE).open("rb") as handle:
            self._lines = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, position: int) -> Chunk:
        if not -len(self) <= position < len(self):
            raise IndexError(f"chunk position {position} out of range (0..{len(self) - 1})")
        position %= len(self)
        start, end = int(self._offsets[position]), int(self._offsets[position + 1])
        return Chunk(**json.loads(self._lines[start:end]))

    def __iter__(self) -> Iterator[Chunk]:
        for position in range(len(self)):
            yield self[position]

    def texts(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The indexed texts (`indexed_text`) of positions [start, stop)."""
        stop = len(self) if stop is None else min(stop, len(self))
        return [indexed_text(self[p]) for p in range(start, stop)]


class IndexedTexts:
    """A store's indexed texts as a sequence (len, slices, iteration), read lazily: what the
    dense shards embed, without the corpus in memory."""

    def __init__(self, store: ChunkStore) -> None:
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, item: int | slice) -> str | list[str]:
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step != 1:
                return [indexed_text(self.store[p]) for p in range(start, stop, step)]
            return self.store.texts(start, stop)
        return indexed_text(self.store[item])

    def __iter__(self) -> Iterator[str]:
        for chunk in self.store:
            yield indexed_text(chunk)
