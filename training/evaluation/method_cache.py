"""`MethodCache`: `eval-filter`'s model work kept on disk between runs, one JSON file per kind
(the filter's tables, the judge's decisions) under OUT/cache, each valid while the
fingerprint of what decides it (model, adapter content, questions, bar) matches, so a rerun
after an interruption skips finished work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import parse_json, write_atomic


class MethodCache:
    """One JSON file per kind of model work under OUT/cache, valid while its fingerprint
    matches."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load(self, key: str, fingerprint: Mapping[str, Any]) -> Any | None:
        """The value stored under `key` for this fingerprint, else None.

        A file that is not such an entry (unreadable, not UTF-8, not JSON Python can read,
        not an object with this fingerprint and a value) is a miss, never an error: the work
        is done again and the file overwritten, as a cache should.
        """
        path = self.folder / f"{key}.json"
        if not path.is_file():
            return None
        try:
            stored = parse_json(path.read_bytes(), str(path))
        except (OSError, DatasetError):
            return None
        if not isinstance(stored, dict) or stored.get("fingerprint") != _digest(fingerprint):
            return None
        return stored.get("value")

    def store(self, key: str, fingerprint: Mapping[str, Any], value: Any) -> None:
        write_atomic(self.folder / f"{key}.json",
                     json.dumps({"fingerprint": _digest(fingerprint), "value": value}))

    def get_or_compute(self, key: str, fingerprint: Mapping[str, Any],
                       compute: Callable[[], Any]) -> Any:
        stored = self.load(key, fingerprint)
        if stored is not None:
            return stored
        value = compute()
        self.store(key, fingerprint, value)
        return value


def _digest(fingerprint: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
