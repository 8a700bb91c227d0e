"""The figures a benchmark writes for the results pages (`--results-json PATH`): one
implementation every benchmark shares.

`docs/results/*.md` shows each table from a JSON file under `docs/results/data/`, rendered by
`docs/hooks/results_tables.py` (which documents the format). A benchmark that measures a
page's table takes `--results-json PATH` (`add_option`) and, at the end of its run, writes the
table's rows there (`write`), with a `source` naming the command, the commit and the date, so
a page's figures always say which run they came from. Then `python
docs/hooks/results_tables.py` renders the page again.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RENDERER = REPO / "docs" / "hooks" / "results_tables.py"
ALIGNMENTS = ("", "left", "right", "center")


def add_option(parser: argparse.ArgumentParser) -> None:
    """`--results-json PATH`: where the benchmark writes its results-page tables."""
    parser.add_argument(
        "--results-json", default=None, metavar="PATH",
        help="also write the figures as the tables of the results page that shows them "
             "(e.g. docs/results/data/NAME.json; then run python docs/hooks/results_tables.py)")


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
          align: Sequence[str] | None = None,
          formats: Sequence[str | None] | None = None) -> dict[str, Any]:
    """One table: column titles, rows of cells (text, a number or None for "–"), and per
    column an alignment ("", "left", "right", "center") and a format for its numbers (a
    Python format spec such as ".3f"; None shows the number as Python writes it)."""
    width = len(columns)
    align = list(align) if align is not None else [""] * width
    formats = list(formats) if formats is not None else [None] * width
    if len(align) != width or len(formats) != width:
        raise ValueError(f"align and formats need one entry per column ({width})")
    if any(a not in ALIGNMENTS for a in align):
        raise ValueError(f"align entries are one of {ALIGNMENTS}, got {align}")
    for number, row in enumerate(rows, 1):
        if len(row) != width:
            raise ValueError(f"row {number} has {len(row)} cells, the table {width} columns")
    return {"columns": list(columns), "align": align, "formats": formats,
            "rows": [list(row) for row in rows]}


def markdown(written: dict[str, Any]) -> str:
    """A `table(...)` as the results page will show it (the docs hook's own renderer, so a
    benchmark prints what the page renders)."""
    spec = importlib.util.spec_from_file_location("results_tables", RENDERER)
    assert spec is not None and spec.loader is not None
    renderer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(renderer)
    return renderer.render_table(written, "the benchmark's table")


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "an unknown commit (not a git checkout)"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True, timeout=30).stdout.strip()
    return done.stdout.strip() + (" with uncommitted changes" if dirty else "")


def dumps(data: dict[str, Any]) -> str:
    """A results file as JSON a reader can scan and a diff can follow: a row a line."""
    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    lines = ["{"]
    head = [f'  {one(key)}: {one(value)}' for key, value in data.items() if key != "tables"]
    lines += [line + "," for line in head]
    lines.append('  "tables": {')
    names = list(data["tables"])
    for n, name in enumerate(names):
        lines.append(f"    {one(name)}: {{")
        fields = data["tables"][name]
        keys = [k for k in fields if k != "rows"]
        lines += [f"      {one(k)}: {one(fields[k])}," for k in keys]
        rows = fields["rows"]
        lines.append('      "rows": [')
        lines += [f"        {one(row)}" + ("," if r < len(rows) - 1 else "")
                  for r, row in enumerate(rows)]
        lines.append("      ]")
        lines.append("    }" + ("," if n < len(names) - 1 else ""))
    lines += ["  }", "}"]
    text = "\n".join(lines) + "\n"
    if json.loads(text) != data:  # the layout must never change what the file says
        raise AssertionError("dumps changed the data")
    return text


def write(path: str | Path, tables: dict[str, dict[str, Any]],
          argv: Sequence[str] | None = None) -> Path:
    """Write `tables` (name → `table(...)`) to `path`, whole or not at all, with a `source`
    naming the command that measured them (`argv`, default this process's), the commit and
    the date."""
    path = Path(path)
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    if script.is_absolute() and script.is_relative_to(REPO):
        argv[0] = str(script.relative_to(REPO))
    command = shlex.join(["python", *argv])
    source = (f"written by `{command}` at commit {_commit()} on "
              f"{datetime.date.today().isoformat()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(dumps({"source": source, "tables": tables}), encoding="utf-8")
    staging.replace(path)
    print(f"results tables written to {path}")
    return path
