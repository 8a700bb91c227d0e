"""A persistent retrieval cache: (query, mode, k, settings, index) → ranking.

Re-running an evaluation where only the generator or the filter changed then skips
retrieval. The cache is an append-only jsonl file: each entry is written as one whole line
and flushed, so an interruption can at most tear the last line, which loading skips.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sieverag.inference.retrieval.retrieved import Ranking


def cache_key(*parts: Any) -> str:
    """A short stable key for JSON-serialisable parts."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class RetrievalCache:
    """Rankings by key, loaded from and appended to a jsonl file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: dict[str, Ranking] = {}
        if self.path.is_file():
            with self.path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                        self._entries[entry["key"]] = [(int(p), float(s))
                                                       for p, s in entry["ranking"]]
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn last line from an interrupted run

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Ranking | None:
        return self._entries.get(key)

    def put_many(self, rankings: Mapping[str, Ranking]) -> None:
        """Store rankings in memory and append them to the file."""
        if not rankings:
            return
        self._entries.update(rankings)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for key, ranking in rankings.items():
                handle.write(json.dumps({"key": key, "ranking": ranking}) + "\n")
            handle.flush()
