"""Shards: N machines (or GPUs) label one dataset, each a deterministic share of its questions.

`sieverag label --shard I/N` (1 <= I <= N) labels the questions whose id falls in share I
of N: the share is read from the sha256 of the question id (never Python's `hash()`, which
changes from one process to the next), so every machine computes the same split of the same
dataset with nothing shared between them. Borrowed negatives (`--borrowed-negatives`) are
drawn over the whole dataset before it is split, so a question's chunks do not depend on
the shard. The shard is part of the run's settings (`label_config.json`), and each sharded
record keeps its place in the whole dataset (`position`).

`sieverag build-dataset --labels A,B,...` merges the shards of one run: the folders' settings
must be the same apart from the shard, their shard counts equal and their indices distinct;
their questions are put back in the dataset's order, so the merged dataset equals one
unsharded run's, record for record. A folder without a shard (another dataset, another
source) is taken as it is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import parse_json, read_text

SHARD_HELP = ("label share I of N of the questions (I/N, 1 <= I <= N, chosen by a hash of "
              "each question id); `build-dataset --labels A,B,...` merges the shards")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """(I, N) from `I/N`; a `ConfigError` naming `shard` when it is not 1 <= I <= N."""
    match = _SHARD.match(text)
    if match is None or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ConfigError(f"shard must be I/N with 1 <= I <= N (e.g. 1/4), got {text!r}")
    return int(match.group(1)), int(match.group(2))


def shard_index(question_id: str, count: int) -> int:
    """The shard (1..count) that a question id falls in: sha256 of the id, modulo `count`."""
    digest = hashlib.sha256(question_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def in_shard(question_id: str, shard: str | None) -> bool:
    """Whether the question belongs to `shard` (`I/N`; None: every question does)."""
    if shard is None:
        return True
    index, count = parse_shard(shard)
    return shard_index(question_id, count) == index


def _settings(folder: str, config_file: str) -> dict[str, Any]:
    path = Path(folder) / config_file
    if not path.is_file():
        return {}
    stored = parse_json(read_text(path), str(path), "relabel the folder with `sieverag label`")
    return stored if isinstance(stored, dict) else {}


def shard_groups(folders: Sequence[str], config_file: str) -> list[list[str]]:
    """The label folders in merge groups, in the order given: each sharded run's folders
    together (at the place of its first), every other folder alone.

    Refused, each with one line naming the folders: sharded folders of one dataset whose
    other settings differ, whose shard counts differ, or that hold the same shard twice.
    """
    runs: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # sharded runs, by dataset
    order: list[str] = []  # a folder alone by its name, a sharded run by its dataset
    for folder in folders:
        stored = _settings(folder, config_file)
        key = (folder if stored.get("shard") is None
               else repr((stored.get("dataset"), stored.get("source"))))
        if key not in runs:
            runs[key] = []
            order.append(key)
        runs[key].append((folder, stored))
    for key in order:
        if runs[key][0][1].get("shard") is not None:
            _check_run(runs[key])
    return [[folder for folder, _ in runs[key]] for key in order]


def _check_run(run: list[tuple[str, dict[str, Any]]]) -> None:
    first, first_settings = run[0]
    base = {k: v for k, v in first_settings.items() if k != "shard"}
    count = parse_shard(first_settings["shard"])[1]
    seen: dict[int, str] = {}
    for folder, stored in run:
        settings = {k: v for k, v in stored.items() if k != "shard"}
        changed = sorted(k for k in base.keys() | settings.keys() if base.get(k) != settings.get(k))
        if changed:
            raise ConfigError(f"shards {first} and {folder} were labelled with other settings "
                              f"({', '.join(changed)} differ); merge shards of one run only")
        index, other_count = parse_shard(stored["shard"])
        if other_count != count:
            raise ConfigError(f"shards {first} ({first_settings['shard']}) and {folder} "
                              f"({stored['shard']}) split the dataset differently and overlap; "
                              "merge shards of one --shard I/N split")
        if index in seen:
            raise DatasetError(f"shards {seen[index]} and {folder} are both shard "
                               f"{stored['shard']} (they overlap); give each shard once")
        seen[index] = folder
