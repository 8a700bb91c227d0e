"""The inference part's commands, one module per group, found by import path from the
`sieverag` command table (sieverag/cli.py): `run` (eval, ask, demo, trace, report, export,
judge-sweep), `index` (index build / search, eval-retrieval, hard-negatives), `filter`
(filter list / install / package). Nothing here is imported at start-up; `sieverag --help`
imports none of them.

`from sieverag.inference.cli import EvalCommand` (the module before it became this package)
still works for one release, with a deprecation warning: import from `cli.run`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    run = importlib.import_module(f"{__name__}.run")
    if not hasattr(run, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"sieverag.inference.cli.{name} moved to sieverag.inference.cli.run.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(run, name)
