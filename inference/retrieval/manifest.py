"""The index manifest: `manifest.json`, written last, so its presence means a finished build.

It records the format version, the build config, the corpus (path and SHA-256), a fingerprint
of the chunks and the list of files the index needs; loading checks all of them and names
what is wrong.

Format 2 (issue 63) added the chunk store's offsets file (`chunk_store`); a format-1 folder
is converted in place by `sieverag index convert DIR` (`index.convert_index`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag import __version__
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import write_json_atomic
from sieverag.inference.retrieval.config import IndexConfig

FORMAT_VERSION = 2
# Folders of these versions are converted in place, not rebuilt.
CONVERTIBLE_VERSIONS = (1,)
MANIFEST_FILE = "manifest.json"


class IndexFormatError(DatasetError):
    """An index folder is missing, incomplete, or from another format version."""


@dataclass(frozen=True)
class Manifest:
    """What an index folder holds."""

    config: IndexConfig
    files: tuple[str, ...]
    chunk_count: int
    source_count: int
    corpus: str
    corpus_format: str
    corpus_sha256: str
    fingerprint: str
    format_version: int = FORMAT_VERSION
    sieverag_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "sieverag_version": self.sieverag_version,
            "corpus": self.corpus,
            "corpus_format": self.corpus_format,
            "corpus_sha256": self.corpus_sha256,
            "chunk_count": self.chunk_count,
            "source_count": self.source_count,
            "fingerprint": self.fingerprint,
            "config": self.config.to_dict(),
            "files": list(self.files),
        }


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write `manifest.json` into `directory` (atomically)."""
    write_json_atomic(Path(directory) / MANIFEST_FILE, manifest.to_dict())


def read_manifest(directory: Path, *, version: int = FORMAT_VERSION) -> Manifest:
    """Read and check an index folder's manifest (of format `version`); every listed file
    must exist."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise IndexFormatError(f"index folder not found: {directory}")
    if not path.is_file():
        raise IndexFormatError(f"{directory} is not a finished sieverag index: {MANIFEST_FILE} "
                               "is missing (build it with `sieverag index build`)")
    try:
        payload = json.loads(path.read_text("utf-8"))
    except ValueError as error:
        raise IndexFormatError(f"{path} is not valid JSON ({error}); rebuild the index") from None
    found = payload.get("format_version") if isinstance(payload, dict) else None
    if found in CONVERTIBLE_VERSIONS and version == FORMAT_VERSION:
        raise IndexFormatError(f"index {directory} has format version {found}, from an older "
                               f"sieverag (chunks without their offsets file); convert it in "
                               f"place with `sieverag index convert {directory}`")
    if found != version:
        raise IndexFormatError(f"index {directory} has format version {found!r}, this sieverag "
                               f"reads version {version}; rebuild it with "
                               "`sieverag index build`")
    try:
        manifest = Manifest(
            config=IndexConfig.from_dict(payload["config"]),
            files=tuple(payload["files"]),
            chunk_count=int(payload["chunk_count"]),
            source_count=int(payload["source_count"]),
            corpus=str(payload["corpus"]),
            corpus_format=str(payload["corpus_format"]),
            corpus_sha256=str(payload["corpus_sha256"]),
            fingerprint=str(payload["fingerprint"]),
            format_version=found,
            sieverag_version=str(payload.get("sieverag_version", "")),
        )
    except (KeyError, TypeError, ValueError, ConfigError) as error:
        raise IndexFormatError(f"{path} is malformed ({error}); rebuild the index") from None
    for name in manifest.files:
        if not (directory / name).is_file():
            raise IndexFormatError(f"index {directory} is missing file {name}; rebuild it with "
                                   "`sieverag index build`")
    return manifest
