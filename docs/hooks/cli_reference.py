"""The CLI reference page, written at build time from each command's `--help` (a part
docs/hooks/generated.py writes).

`docs/cli.md` holds the line `<!-- cli-reference -->`; the build replaces it with a section per
command of `sieverag.cli.COMMANDS` (and per command group), each holding what `sieverag ...
--help` prints. The help is produced in this process by the CLI's own entry point, at a fixed
width and without colour, so the page is the same on every machine and cannot drift from the
code.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator

from mkdocs.exceptions import PluginError

MARKER = "<!-- cli-reference -->"
PAGE = "cli.md"
# argparse wraps help at $COLUMNS - 2; pinned so the page does not depend on the terminal.
HELP_ENV = {"COLUMNS": "100", "NO_COLOR": "1"}

# Where the guide explains each command (the reference only lists its flags): title, page.
GUIDE = {
    "eval": ("Evaluating pipelines", "pipelines/evaluating.md"),
    "ask": ("Amber", "pipelines/amber.md#running-amber"),
    "demo": ("Getting started", "getting-started.md#the-demo"),
    "trace": ("Amber", "pipelines/amber.md#running-amber"),
    "report": ("Tables across runs", "pipelines/evaluating.md#tables-across-runs"),
    "export": ("Export for RAG-evaluation tools",
               "pipelines/evaluating.md#export-for-rag-evaluation-tools"),
    "judge-sweep": ("MAIN-RAG's ablations", "pipelines/main-rag.md#the-papers-ablations"),
    "index": ("Retrieval over your own index", "pipelines/retrieval.md"),
    "index build": ("Retrieval over your own index", "pipelines/retrieval.md"),
    "index search": ("Retrieval over your own index", "pipelines/retrieval.md"),
    "eval-retrieval": ("Retrieval over your own index", "pipelines/retrieval.md"),
    "hard-negatives": ("Hard negatives", "labelling.md#hard-negatives"),
    "label": ("Labelling", "labelling.md"),
    "build-dataset": ("The training set", "labelling.md#the-training-set"),
    "train": ("Training the filter", "training.md"),
    "eval-filter": ("Evaluating a filter", "training.md#evaluating-a-filter"),
    "filter": ("The shipped filter", "shipped-filter.md"),
    "filter list": ("Finding a filter", "shipped-filter.md#finding-a-filter"),
    "filter install": ("Finding a filter", "shipped-filter.md#finding-a-filter"),
    "filter package": ("Finding a filter", "shipped-filter.md#finding-a-filter"),
    "serve": ("Serving", "serving/index.md"),
}


@contextlib.contextmanager
def _help_environment() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in (*HELP_ENV, "FORCE_COLOR")}
    os.environ.update(HELP_ENV)
    os.environ.pop("FORCE_COLOR", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def help_text(args: list[str]) -> str:
    """What `sieverag ARGS --help` prints, run through the CLI's own `main`."""
    from sieverag.cli import main

    out = io.StringIO()
    with _help_environment(), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main([*args, "--help"])
        except SystemExit as stop:  # argparse ends --help with sys.exit(0)
            code = stop.code or 0
        except Exception as error:  # a command whose module does not import
            raise PluginError(f"`sieverag {' '.join([*args, '--help'])}` failed: "
                              f"{type(error).__name__}: {error}") from error
    if code != 0 or not out.getvalue().strip():
        raise PluginError(f"`sieverag {' '.join([*args, '--help'])}` exited {code}: "
                          f"{err.getvalue().strip() or 'no output'}")
    return out.getvalue().rstrip()


def _section(level: int, name: str, summary: str, args: list[str]) -> str:
    guide = GUIDE.get(name)
    lines = [f"{'#' * level} sieverag {name}".rstrip(), ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + "." +
                  (f" Guide: [{guide[0]}]({guide[1]})." if guide else ""), ""]
    lines += ["```text", help_text(args), "```", ""]
    return "\n".join(lines)


def cli_reference() -> str:
    """Markdown for every command and command group, in the order `sieverag --help` lists them."""
    from sieverag.cli import COMMANDS, GROUPS

    parts = [_section(2, "", "", [])]
    for name, command in COMMANDS.items():
        group, _, sub = name.partition(" ")
        if sub and name == next(n for n in COMMANDS if n.startswith(group + " ")):
            parts.append(_section(2, group, GROUPS[group], [group]))
        parts.append(_section(3 if sub else 2, name, command.help, name.split(" ")))
    return "\n".join(parts)


# What docs/hooks/generated.py puts in place of MARKER on PAGE.
WHAT = "the CLI reference"
generate = cli_reference
