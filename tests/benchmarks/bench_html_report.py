"""The run report at scale: report.html of a 1,000-question, 5-pipeline run, its size and how
fast it opens in headless Chromium, against the demo-sized page and against building every
question at once.

A synthetic run folder (tests/synthetic_runs.py: no model; 10 passages of 8 sentences a
question, amber-like traces of two rounds, a judge's scores, a router's decisions) is written,
then its report.html (`inference.eval.html_report`). Headless Chromium (Debian's chromium and
chromium-driver, tests/headless_chromium.py) opens each page from disk, `--repeats` times:

  open      navigation start to the load event (the embedded JSON parsed, the first page of
            20 questions built): the goal is under 2 s, with no console error;
  filter    choosing "got wrong by vanilla" and showing its first page;
  search    typing a question's id into the search box;
  all       building all 1,000 questions at once (a page of 1,000): what paging avoids.
  Each step's time includes laying the page out.

The page's stated bound: under 25 MB for such a run (the passages' text is most of it).

    python tests/benchmarks/bench_html_report.py [--questions 1000] [--repeats 3] [--quick]

`--quick`: 200 questions, one repeat. Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' helpers

from headless_chromium import chromium, console_errors  # noqa: E402
from synthetic_runs import write_synthetic_run  # noqa: E402

from sieverag.inference.eval.html_report import write_html_report  # noqa: E402

SIZE_BOUND_MB = 25.0
OPEN_GOAL_S = 2.0
LOAD_MS = "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd;"
# Reading offsetHeight makes the browser lay the page out: the time includes layout.
TIMED = """const started = performance.now(); %s; document.body.offsetHeight;
return performance.now() - started;"""
FILTER = ("document.getElementById('show').value = 'wrong';"
          "document.getElementById('by').value = 'vanilla';"
          "document.getElementById('show').dispatchEvent(new Event('change'))")
SEARCH = ("document.getElementById('show').value = 'all';"
          "document.getElementById('show').dispatchEvent(new Event('change'));"
          "const box = document.getElementById('search'); box.value = 'q777';"
          "box.dispatchEvent(new Event('input'))")
ALL = ("const box = document.getElementById('search'); box.value = '';"
       "box.dispatchEvent(new Event('input')); pager.setSize(DATA.questions.length)")


def measure(driver, page: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds of each step over `repeats` fresh loads of `page`."""
    runs: dict[str, list[float]] = {"open": [], "filter": [], "search": [], "all": []}
    for _ in range(repeats):
        driver.get("about:blank")
        driver.get(page.as_uri())
        runs["open"].append(driver.execute_script(LOAD_MS))
        shown = driver.execute_script("return document.querySelectorAll('section.question')"
                                      ".length")
        assert shown > 0, f"{page}: no question shown"
        for step, script in (("filter", FILTER), ("search", SEARCH), ("all", ALL)):
            runs[step].append(driver.execute_script(TIMED % script))
        errors = console_errors(driver)
        assert not errors, f"{page}: console errors {errors}"
    return {step: statistics.median(values) for step, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    questions, repeats = (200, 1) if args.quick else (args.questions, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        pages = {}
        for name, count in (("demo-sized", 12), (f"{questions} x 5", questions)):
            run = write_synthetic_run(Path(tmp) / name.replace(" ", ""), questions=count,
                                      passages=10, sentences=8)
            started = time.perf_counter()
            pages[name] = (write_html_report(run), time.perf_counter() - started)
        with chromium() as driver:
            timings = {name: measure(driver, page, repeats) for name, (page, _) in pages.items()}
        sizes = {name: page.stat().st_size / 1e6 for name, (page, _) in pages.items()}
    print(f"{'page':<12}{'MB':>8}{'write s':>9}{'open ms':>9}{'filter ms':>11}{'search ms':>11}"
          f"{'all at once ms':>16}")
    for name, (_, write_s) in pages.items():
        t = timings[name]
        print(f"{name:<12}{sizes[name]:>8.2f}{write_s:>9.2f}{t['open']:>9.0f}{t['filter']:>11.0f}"
              f"{t['search']:>11.0f}{t['all']:>16.0f}")
    big = f"{questions} x 5"
    verdict = timings[big]["open"] / 1000 < OPEN_GOAL_S and sizes[big] < SIZE_BOUND_MB
    print(f"\n{big}: opens in {timings[big]['open'] / 1000:.2f} s (goal < {OPEN_GOAL_S} s), "
          f"{sizes[big]:.1f} MB (bound {SIZE_BOUND_MB} MB): {'met' if verdict else 'NOT met'}; "
          f"building every question at once takes {timings[big]['all'] / 1000:.2f} s more")
    print(json.dumps({
        "questions": questions, "pipelines": 5, "size_mb": round(sizes[big], 2),
        "size_bound_mb": SIZE_BOUND_MB, "write_s": round(pages[big][1], 2),
        "open_ms": round(timings[big]["open"]), "filter_ms": round(timings[big]["filter"]),
        "search_ms": round(timings[big]["search"]), "all_at_once_ms": round(timings[big]["all"]),
        "demo_open_ms": round(timings["demo-sized"]["open"]),
        "open_ratio_to_demo": round(timings[big]["open"] / timings["demo-sized"]["open"], 2),
        "goal_met": verdict}))


if __name__ == "__main__":
    main()
