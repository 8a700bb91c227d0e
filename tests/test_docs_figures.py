"""The results pages' figures come from files: every table of docs/results/*.md is a region
rendered from a JSON file under docs/results/data/ (docs/hooks/results_tables.py), the
committed page shows exactly what its JSON renders, every JSON file says where its figures
came from, and a benchmark's `--results-json` (tests/benchmarks/results_json.py) writes a file
the pages render.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
BENCHMARKS = REPO / "tests" / "benchmarks"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"figures_test_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _load(REPO / "docs" / "hooks" / "results_tables.py")
results_json = _load(BENCHMARKS / "results_json.py")
PAGES = sorted(RESULTS.glob("*.md"))


def _table_lines(text: str) -> list[int]:
    """0-based indexes of the Markdown table lines of a page, code blocks left out."""
    found, fence = [], None
    for number, line in enumerate(text.split("\n")):
        opening = re.match(r"\s*(`{3,}|~{3,})", line)
        if opening:
            fence = opening[1] if fence is None else (None if line.strip().startswith(fence)
                                                      else fence)
        elif fence is None and line.lstrip().startswith("|"):
            found.append(number)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_results_table_is_rendered_from_its_json(page: Path):
    text = page.read_text(encoding="utf-8")
    inside = {line for start, end, _, _ in tables.regions(text) for line in range(start, end)}
    typed = [n + 1 for n in _table_lines(text) if n not in inside]
    assert not typed, (f"{page.name}: table lines {typed} are typed; put the figures in a JSON "
                       "file under docs/results/data/ and a generated region in their place")
    assert tables.render_page(text, page) == text, (
        f"{page.name} differs from what its JSON renders: edit the JSON under "
        "docs/results/data/, never the table, and run python docs/hooks/results_tables.py")


def test_the_results_pages_have_their_tables():
    counts = {page.name: len(tables.regions(page.read_text(encoding="utf-8")))
              for page in PAGES}
    assert all(counts[name] for name in ("auto-rag.md", "filter.md", "index.md",
                                         "pipelines.md", "serving.md")), counts


def test_every_results_json_is_shown_and_says_where_its_figures_came_from():
    shown = {(page.parent / file).resolve()
             for page in PAGES
             for _, _, file, _ in tables.regions(page.read_text(encoding="utf-8"))}
    files = sorted((RESULTS / "data").glob("*.json"))
    assert files
    for path in files:
        assert path.resolve() in shown, f"{path.name} is on no results page"
        source = json.loads(path.read_text(encoding="utf-8"))["source"]
        assert source.startswith(("written by `python ", "transcribed from docs/results/")), (
            f"{path.name}: its source must say which run wrote it or that it was transcribed")
        # A file that names a benchmark's --results-json names one that takes it.
        for script in re.findall(r"tests/benchmarks/(\w+\.py)[^`]*--results-json", source):
            code = (BENCHMARKS / script).read_text(encoding="utf-8")
            assert "results_json.add_option(parser)" in code, (
                f"{path.name} says {script} rewrites it, but {script} has no --results-json")


def test_a_region_is_rendered_again_from_its_json(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "m.json").write_text(json.dumps({"source": "transcribed", "tables": {
        "main": {"columns": ["run", "F1", "a|b"], "align": ["", "right", "center"],
                 "formats": [None, ".3f", None],
                 "rows": [["x", 0.5, None], ["y", 0.25, "c|d"]]}}}), encoding="utf-8")
    page = tmp_path / "p.md"
    stale = ("Before.\n\n" + tables.opening_line("data/m.json", "main")
             + "\n\n| run | F1 |\n|---|---|\n| x | 0.9 |\n\n" + tables.CLOSING + "\n\nAfter.\n")
    assert tables.render_page(stale, page) == (
        "Before.\n\n" + tables.opening_line("data/m.json", "main") + "\n\n"
        "| run | F1 | a\\|b |\n|---|---:|:---:|\n| x | 0.500 | – |\n| y | 0.250 | c\\|d |\n\n"
        + tables.CLOSING + "\n\nAfter.\n")


@pytest.mark.parametrize(("region", "message"), [
    ("data/m.json#other", "has no table 'other'"),
    ("data/gone.json#main", "gone.json does not exist"),
])
def test_a_region_whose_table_is_missing_names_it(tmp_path: Path, region: str, message: str):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "m.json").write_text(
        json.dumps({"source": "s", "tables": {"main": {"columns": ["a"], "rows": [[1]]}}}),
        encoding="utf-8")
    file, table = region.split("#")
    text = tables.opening_line(file, table) + "\n\n" + tables.CLOSING + "\n"
    with pytest.raises(tables.TableError, match=re.escape(message)):
        tables.render_page(text, tmp_path / "p.md")


def test_a_region_without_its_closing_line_or_a_row_of_the_wrong_width_is_refused(
        tmp_path: Path):
    with pytest.raises(tables.TableError, match="has no '<!-- end generated -->' line"):
        tables.regions(tables.opening_line("data/m.json", "main") + "\n| a |\n")
    with pytest.raises(tables.TableError, match="m.json#main: row 1 has 1 cells, the table 2"):
        tables.render_table({"columns": ["a", "b"], "rows": [["x"]]}, "m.json#main")


def test_a_benchmark_writes_a_table_the_pages_render(tmp_path: Path):
    path = tmp_path / "data" / "bench.json"
    written = results_json.table(["source", "q", "F1"], [["nq", 60, 0.83611], ["squad", 60, None]],
                                 align=["", "right", "right"], formats=[None, "d", ".3f"])
    results_json.write(path, {"main": written},
                       argv=[str(BENCHMARKS / "bench_x.py"), "--results-json", str(path)])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["source"].startswith("written by `python tests/benchmarks/bench_x.py "
                                     "--results-json ")
    assert re.search(r"at commit \S+.* on \d{4}-\d{2}-\d{2}$", data["source"])
    assert tables.render_table(data["tables"]["main"], "bench.json#main") == (
        "| source | q | F1 |\n|---|---:|---:|\n| nq | 60 | 0.836 |\n| squad | 60 | – |")
    assert not list(path.parent.glob("*.tmp"))
    with pytest.raises(ValueError, match="row 1 has 2 cells, the table 3 columns"):
        results_json.table(["a", "b", "c"], [["x", 1]])


def test_the_build_renders_a_results_page_from_its_json_whatever_the_page_says():
    hook = _load(REPO / "docs" / "hooks" / "generated.py")
    page_path = RESULTS / "filter.md"
    text = page_path.read_text(encoding="utf-8")
    start, end, file, table = tables.regions(text)[0]
    lines = text.split("\n")
    row = next(n for n in range(start, end) if lines[n].startswith("| ") and n > start + 3)
    stale = "\n".join([*lines[:row], "| typed | by | hand |", *lines[row + 1:]])
    page = type("Page", (), {"file": type("File", (), {
        "src_uri": "results/filter.md", "abs_src_path": str(page_path)})()})()
    assert hook.on_page_markdown(stale, page, None, None) == text


SHIPPED_CARD = REPO / "inference" / "filters" / "shipped" / "smollm2-filter" / \
    "sieverag_adapter.json"


def test_the_shipped_cards_rows_are_the_commands_own():
    """The card's held-out rows are what `filter package --eval-dir` copies from an eval-filter
    report (no row typed beside them), and its left-out rows, written by `filter
    fit-combination --by-left-out-source`, are the figures docs/results/filter.md shows
    (left_out.json, written by bench_default_left_out.py from the same scores)."""
    from sieverag.inference.filters.card.card_file import HELD_OUT_FIGURES

    card = json.loads(SHIPPED_CARD.read_text(encoding="utf-8"))
    for name, figures in card["held_out"]["chunk"].items():
        assert set(figures) <= set(HELD_OUT_FIGURES), (
            f"the card's held-out row {name!r} has figures eval-filter's report does not give "
            f"({sorted(set(figures) - set(HELD_OUT_FIGURES))}): was it typed?")
    fit = card["combination"]["fit"]["leave_one_source_out"]
    shown = json.loads((RESULTS / "data" / "left_out.json").read_text(encoding="utf-8"))
    main = shown["tables"]["main"]
    column = {name: i for i, name in enumerate(main["columns"])}
    assert {row[0] for row in main["rows"]} == set(fit)
    for row in main["rows"]:
        measured = fit[row[0]]
        assert row[column["q"]] == measured["questions"]
        for title, key in (("default F1", "f1"), ("margin over the better", "margin"),
                           ("ECE", "ece"), ("kept/q", "kept_per_question"),
                           ("rounds guarded", "guarded")):
            assert row[column[title]] == pytest.approx(measured["default"][key], abs=1e-12), (
                f"{row[0]}: {title} differs between the card and left_out.json")
        assert row[column["best rule with the filter"]] == pytest.approx(
            measured["with_filter"]["f1"], abs=1e-12)
