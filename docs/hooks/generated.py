"""MkDocs hook: the pages' generated parts, written at build time so they cannot drift.

Each module beside this one generates one part — `cli_reference` (every command's `--help`),
`presets` (the shipped presets), `benchmarks` (each benchmark script's docstring), `layers`
(the parts and layers tests/test_layers.py declares) — for its
`PAGE`, which holds its `MARKER` line; the build replaces the line with `generate()`.
`results_tables` renders every table of the results pages from the JSON its measurement
wrote (`docs/results/data/`), region by region, whatever the committed page holds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from mkdocs.exceptions import PluginError

HERE = Path(__file__).parent
PARTS = ("cli_reference", "presets", "benchmarks", "layers")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"sieverag_docs_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATORS = {module.PAGE: module for module in map(_load, PARTS)}
RESULTS_TABLES = _load("results_tables")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri.startswith("results/"):
        try:
            markdown = RESULTS_TABLES.render_page(markdown, Path(page.file.abs_src_path))
        except RESULTS_TABLES.TableError as error:
            raise PluginError(f"{page.file.src_uri}: {error}") from error
    part = GENERATORS.get(page.file.src_uri)
    if part is None:
        return markdown
    if part.MARKER not in markdown:
        raise PluginError(f"{part.PAGE} lost its {part.MARKER} line: {part.WHAT} have nowhere "
                          "to go")
    return markdown.replace(part.MARKER, part.generate())
