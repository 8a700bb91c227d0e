"""The architecture page's map of the modules, from the layer test's own declaration (a part
docs/hooks/generated.py writes).

`docs/architecture.md` holds the line `<!-- layers -->`; the build replaces it with the parts
and what each may import (`PART_IMPORTS`, the folders from pyproject.toml) and the layers of
`inference`, low to high, with their modules and roles (`LAYERS`, `SHARED_CORE`), as
`tests/test_layers.py` declares and checks them. The test file is loaded by path; nothing of
it runs but its declarations.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from mkdocs.exceptions import PluginError

MARKER = "<!-- layers -->"
PAGE = "architecture.md"
LAYER_TEST = Path(__file__).resolve().parents[2] / "tests" / "test_layers.py"


def _layer_test() -> ModuleType:
    name = "sieverag_docs_test_layers"
    spec = importlib.util.spec_from_file_location(name, LAYER_TEST)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot load {LAYER_TEST}: the layers have no declaration to draw")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the file's annotations through it
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _short(module: str) -> str:
    """`sieverag.inference.llm` → `inference.llm`: the page names modules inside `sieverag`."""
    return f"`{module.removeprefix('sieverag.')}`"


def _member(module: str, layers: ModuleType) -> str:
    """A layer's member as the page names it; a part itself stands for its `__init__`."""
    return _short(module) + (" (its `__init__`)" if module in layers.PART_IMPORTS else "")


def _rank(layer) -> int:
    return layer.rank


def parts_table(layers: ModuleType) -> str:
    rows = ["| part | folder | imports (besides itself) |", "|---|---|---|"]
    for part, allowed in layers.PART_IMPORTS.items():
        others = [p for p in sorted(allowed) if p != part]
        # The parts built on `inference` reach its shared core only (the layer test's rule).
        cells = [_short(p) + (" (its shared core)" if p == layers.INFERENCE
                              and part not in (layers.INFERENCE, layers.ROOT) else "")
                 for p in others]
        rows.append(f"| {_short(part)} | `{layers.PART_FOLDERS[part]}/` | "
                    f"{', '.join(cells) or 'nothing'} |")
    return "\n".join(rows)


def layers_table(layers: ModuleType) -> str:
    rows = ["| rank | layer | modules | what it holds | imported by |", "|---|---|---|---|---|"]
    for layer in sorted((*layers.LAYERS, layers.COMMAND_LINE), key=_rank):
        if not layer.role:
            raise PluginError(f"{LAYER_TEST}: layer {layer.name!r} has no role to show")
        members = ", ".join(_member(m, layers) for m in layer.members) or "every part's `cli`"
        users = ("every part" if layer.name in layers.SHARED_CORE
                 else "the `sieverag` command table" if layer is layers.COMMAND_LINE
                 else "`inference` and the `sieverag` root")
        rows.append(f"| {layer.rank} | **{layer.name}** | {members} | {layer.role} | {users} |")
    return "\n".join(rows)


def layers_reference() -> str:
    layers = _layer_test()
    return (f"{parts_table(layers)}\n\n"
            "Inside `inference`, a module imports its own layer or one of a lower rank; layers "
            "of one rank sit side by side and import neither of each other. The shared core "
            "(imported by every part) is "
            + ", ".join(f"**{layer.name}**" for layer in sorted(layers.LAYERS, key=_rank)
                        if layer.name in layers.SHARED_CORE)
            + "; the layers above it are inference proper.\n\n"
            f"{layers_table(layers)}\n")


# What docs/hooks/generated.py puts in place of MARKER on PAGE.
WHAT = "the parts and layers"
generate = layers_reference
