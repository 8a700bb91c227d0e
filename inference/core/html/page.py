"""One self-contained HTML page: the shared stylesheet and script (`page.css`, `page.js`
beside this module), a page's own script, its data as embedded JSON, and HTML built here
with every text escaped.

The data travels in `<script type="application/json" id="page-data">`: every `<` in it is
written `\\u003c`, so no text in the data (a passage holding `</script>`) can end the block,
and the page's script reads it with `JSON.parse` and builds the DOM from it with `textContent`
only, so no data is ever parsed as HTML.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sieverag.inference.core.io_utils import write_atomic

ASSETS = Path(__file__).parent
DATA_ELEMENT = "page-data"


def escape(value: object) -> str:
    """`value` as text for an HTML element or attribute (quotes escaped too)."""
    return html.escape(str(value), quote=True)


def asset(name: str, folder: Path = ASSETS) -> str:
    """The text of a stylesheet or script shipped beside a page's module."""
    return (folder / name).read_text(encoding="utf-8")


def embedded_json(data: Any) -> str:
    """`data` as JSON safe inside a `<script>` element: compact, NaN and infinities as null,
    every `<` escaped (`\\u003c`), so nothing in it closes the element."""
    text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"))
    # U+2028/9 are line ends to older JavaScript parsers; JSON.parse reads them escaped too.
    return (text.replace("<", "\\u003c").replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def cell(value: object) -> str:
    """A table cell's text: – for None, 3 decimals for a float."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, sortable: bool = True,
          caption: str | None = None, numeric_from: int = 1) -> str:
    """An HTML table, every cell escaped; `sortable`: a click on a heading sorts by that column
    (page.js), numbers as numbers. Columns from `numeric_from` on are right-aligned."""
    head = "".join(f'<th{" class=num" if i >= numeric_from else ""}>{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if i >= numeric_from else ""}>{escape(cell(v))}</td>'
                         for i, v in enumerate(row)) + "</tr>" for row in rows)
    title = f"<caption>{escape(caption)}</caption>" if caption else ""
    kind = ' class="sortable"' if sortable else ""
    return f"<table{kind}>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def definition_list(items: Iterable[tuple[str, object]]) -> str:
    """Labelled values (`<dl>`), each escaped; None values left out."""
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items
                   if v is not None)
    return f"<dl>{rows}</dl>"


def render_page(title: str, body: str, data: Any, script: str) -> str:
    """The page: `body` (HTML already escaped), `data` embedded as JSON, the shared stylesheet
    and script, then `script` (the page's own, which reads the data)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            # Nothing may be fetched: no network source for anything, inline styles and
            # scripts only (a copy opened from disk works offline, as this promises).
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{escape(title)}</title><style>{asset('page.css')}</style></head>"
            f"<body>{body}<script type=\"application/json\" id=\"{DATA_ELEMENT}\">"
            f"{embedded_json(data)}</script><script>{asset('page.js')}</script>"
            f"<script>{script}</script></body></html>\n")


def write_page(path: str | Path, title: str, body: str, data: Any, script: str) -> Path:
    """Write the page to `path` (atomically: a reader never sees half of it)."""
    path = Path(path)
    write_atomic(path, render_page(title, body, data, script))
    return path
