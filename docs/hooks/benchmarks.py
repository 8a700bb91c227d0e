"""The benchmark scripts' reference, from each script's own docstring (a part
docs/hooks/generated.py writes).

`docs/benchmarks.md` holds the line `<!-- benchmark-scripts -->`; the build replaces it with a
table of the scripts in `tests/benchmarks/` (each one that runs as a script) and a section per
script holding its module docstring, which says what it measures, against what, and how to
run it. The scripts are read, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = "<!-- benchmark-scripts -->"
PAGE = "benchmarks.md"
BENCHMARKS = Path(__file__).resolve().parents[2] / "tests" / "benchmarks"


def _scripts() -> list[tuple[str, str]]:
    """(file name, docstring) of every benchmark that runs as a script, by name."""
    found = []
    for path in sorted(BENCHMARKS.glob("bench_*.py")):
        source = path.read_text(encoding="utf-8")
        if '__name__ == "__main__"' not in source:  # a helper module, not a benchmark
            continue
        doc = ast.get_docstring(ast.parse(source))
        if not doc:
            raise PluginError(f"{path} has no docstring to document it by")
        found.append((path.name, doc))
    if not found:
        raise PluginError(f"no benchmark scripts in {BENCHMARKS}")
    return found


def benchmarks_reference() -> str:
    scripts = _scripts()
    rows = ["| script | measures |", "|---|---|"]
    rows += [f"| [`{name}`](#{name.removesuffix('.py')}) | "
             f"{doc.split(chr(10) + chr(10))[0].replace(chr(10), ' ').replace('|', '/')} |"
             for name, doc in scripts]
    sections = [f"## {name.removesuffix('.py')}\n\n`tests/benchmarks/{name}`\n\n"
                f"```text\n{doc}\n```\n" for name, doc in scripts]
    return "\n".join(rows) + "\n\n" + "\n".join(sections)


# What docs/hooks/generated.py puts in place of MARKER on PAGE.
WHAT = "the benchmarks"
generate = benchmarks_reference
