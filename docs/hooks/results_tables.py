"""The results pages' tables, rendered from the JSON the measurements wrote (a part
docs/hooks/generated.py writes, and a script that keeps the committed pages in step).

Every table of `docs/results/*.md` is a generated region of its page (the opening line is
one line, broken here):

    <!-- generated from data/left_out.json#main: do not edit
         (python docs/hooks/results_tables.py) -->

    | left out | q | ... |
    |---|---:|...|
    | hotpotqa | 60 | ... |

    <!-- end generated -->

The opening line names a JSON file (relative to the page) and one of its tables; what lies
between the two lines is that table rendered, so the page reads the same on GitHub as on the
site. The build renders every region again from its JSON (the site cannot show a typed
figure), and `tests/test_docs_figures.py` fails when a committed page differs from what its
JSON renders. After a benchmark writes new figures (`--results-json`, tests/benchmarks/
results_json.py) or a JSON file is corrected, `python docs/hooks/results_tables.py` rewrites
the regions in place; `--check` only says which pages are out of step.

A JSON file holds the figures of one measurement:

    {"source": "how the figures got here: the command that wrote them, or that they were
                transcribed from the page (and how to measure them again)",
     "tables": {"main": {"columns": ["left out", "q", "F1"],
                         "align": ["", "right", "right"],        # optional: "", left, right, center
                         "formats": [null, "d", ".3f"],          # optional: for numeric cells
                         "rows": [["hotpotqa", 60, 0.7533], ...]}}}

A cell is text (Markdown, shown as written), a number (shown with its column's format, or as
Python writes it) or null (shown as "–").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
REGENERATE = "python docs/hooks/results_tables.py"
OPENING = re.compile(r"^<!-- generated from (?P<file>[\w./-]+\.json)#(?P<table>[\w-]+): "
                     r"do not edit \(python docs/hooks/results_tables\.py\) -->$")
CLOSING = "<!-- end generated -->"
ALIGN = {"": "---", "left": ":---", "right": "---:", "center": ":---:"}


class TableError(ValueError):
    """A generated region or its JSON that cannot be rendered; the message names which."""


def opening_line(file: str, table: str) -> str:
    """The line that opens a generated region of `table` in `file` (relative to the page)."""
    return (f"<!-- generated from {file}#{table}: do not edit "
            f"({REGENERATE}) -->")


def _cell(value: Any, spec: str | None, where: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        raise TableError(f"{where}: a cell is true/false, not a figure or text")
    if isinstance(value, (int, float)):
        return format(value, spec) if spec else str(value)
    if isinstance(value, str):
        return value.replace("|", r"\|")
    raise TableError(f"{where}: a cell is {type(value).__name__}, not text, a number or null")


def render_table(table: dict[str, Any], where: str) -> str:
    """A table of a results JSON file as Markdown (`where` names it in errors)."""
    if not isinstance(table, dict) or not isinstance(table.get("columns"), list) \
            or not isinstance(table.get("rows"), list):
        raise TableError(f"{where} is not a table: it needs a list of columns and of rows")
    columns = table["columns"]
    width = len(columns)
    align = table.get("align") or [""] * width
    formats = table.get("formats") or [None] * width
    if len(align) != width or len(formats) != width:
        raise TableError(f"{where}: align and formats need one entry per column ({width})")
    if any(a not in ALIGN for a in align):
        raise TableError(f"{where}: align entries are one of {sorted(ALIGN)}, got {align}")
    lines = ["| " + " | ".join(_cell(c, None, where) for c in columns) + " |",
             "|" + "|".join(ALIGN[a] for a in align) + "|"]
    for number, row in enumerate(table["rows"], 1):
        if not isinstance(row, list) or len(row) != width:
            raise TableError(f"{where}: row {number} has "
                             f"{len(row) if isinstance(row, list) else 'no'} cells, "
                             f"the table {width} columns")
        lines.append("| " + " | ".join(_cell(v, f, f"{where} row {number}")
                                       for v, f in zip(row, formats, strict=True)) + " |")
    return "\n".join(lines)


def load_tables(path: Path) -> dict[str, Any]:
    """The `tables` of a results JSON file, with one clear error when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(f"{path} does not exist") from None
    except json.JSONDecodeError as error:
        raise TableError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("source"), str) \
            or not isinstance(data.get("tables"), dict):
        raise TableError(f"{path} needs a \"source\" (how its figures got there) and "
                         "\"tables\"")
    return data["tables"]


def regions(markdown: str) -> list[tuple[int, int, str, str]]:
    """Each generated region of a page: (opening line index, closing line index, file,
    table), 0-based; an opening without its closing line is an error."""
    lines = markdown.split("\n")
    found = []
    i = 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if lines[i].startswith("<!-- generated from") and not opening:
            raise TableError(f"line {i + 1}: a generated region's opening line is malformed; "
                             f"write it as {opening_line('data/FILE.json', 'TABLE')!r}")
        if opening:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == CLOSING), None)
            later = next((j for j in range(i + 1, end or len(lines))
                          if OPENING.match(lines[j])), None)
            if end is None or later is not None:
                raise TableError(f"line {i + 1}: the region of {opening['file']}#"
                                 f"{opening['table']} has no {CLOSING!r} line")
            found.append((i, end, opening["file"], opening["table"]))
            i = end
        i += 1
    return found


def render_page(markdown: str, page: Path) -> str:
    """The page with every generated region rendered from its JSON (files relative to
    `page`'s folder)."""
    lines = markdown.split("\n")
    for start, end, file, table in reversed(regions(markdown)):
        path = page.parent / file
        tables = load_tables(path)
        if table not in tables:
            raise TableError(f"{page.name} line {start + 1}: {file} has no table {table!r} "
                             f"(it has {', '.join(sorted(tables)) or 'none'})")
        rendered = render_table(tables[table], f"{file}#{table}")
        lines[start:end + 1] = [lines[start], "", *rendered.split("\n"), "", CLOSING]
    return "\n".join(lines)


def pages() -> list[Path]:
    return sorted(RESULTS.glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the results pages' generated tables from their JSON, in place.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each page out of step")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        try:
            rendered = render_page(text, page)
        except TableError as error:
            print(f"{page}: {error}", file=sys.stderr)
            return 2
        if rendered != text:
            stale.append(page)
            if not args.check:  # a whole page or none: written beside it, then renamed
                staging = page.with_name(page.name + ".tmp")
                staging.write_text(rendered, encoding="utf-8")
                staging.replace(page)
    verb = "out of step with its JSON" if args.check else "rewritten from its JSON"
    for page in stale:
        print(f"{page.relative_to(RESULTS.parents[1])}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
