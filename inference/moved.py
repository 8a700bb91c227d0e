"""Old import paths of modules that moved, kept for one release: `alias_moved(__name__, new)`
in the old module's file makes the old name the new module, with a DeprecationWarning naming
where it went (docs/compatibility.md lists them)."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias_moved(old: str, new: str) -> None:
    """Make module `old` (the caller's `__name__`) the module `new`, and say so once."""
    warnings.warn(f"{old} moved to {new}", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
