"""The GPU check's wheel set, derived (never listed by hand) from what the project declares
and what the lent GPU machine already has.

* `lent_machine()` — the lent machine's Python packages (tests/gpu/lent_machine.txt, copied
  from the device README's package list), with the versions the README gives.
* `wheel_set()` — the distributions to carry as wheels: pyproject.toml's dependencies (and
  the `deepspeed` extra, for the ZeRO-3 step), with everything they require in turn (read
  from this environment's installed metadata, markers evaluated for the machine's CPython on
  Linux x86-64), stopping at a package the machine has; each pinned to the version installed
  here, the one the suite is tested with. tests/gpu/prepare_wheels.sh downloads it.
* `machine_packages_used()` — the machine's packages that set reaches (what a stand-in of the
  machine needs: tests/gpu/check_wheels.sh installs them, the README's version where known).
* `checked_modules()` / `third_party_imports()` — every sieverag module the check runs (from
  tests/gpu/gpu_check.py, its helpers and the commands it starts, following each import,
  function-level ones too) and the third-party distributions they import
  (tests/gpu/test_wheels.py asserts each is on the machine or in the wheel set).

Run with the project's environment: `python tests/gpu/wheel_set.py wheels|machine|modules`.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LENT_MACHINE = Path(__file__).with_name("lent_machine.txt")
# The lent machine's interpreter (its README: Python 3.12 on Linux x86-64).
MACHINE_PYTHON = "3.12"
# Extras the check needs beyond the main dependencies: ZeRO-3 training (train_zero3).
CHECK_EXTRAS = ("deepspeed",)
# The top-level packages of this distribution, by import name → folder (pyproject's
# [tool.setuptools.package-dir]).
PACKAGE_DIRS = {"sieverag.inference": "inference", "sieverag.data_gen": "data_gen",
                "sieverag.training": "training", "sieverag.serving": "serving",
                "sieverag.accelerate_configs": "accelerate_configs", "sieverag": "sieverag"}
# What the check runs: its script and the test helpers it imports, the module accelerate
# launches for training (`-m sieverag.training.sft`), and `python -m sieverag serve`.
CHECK_FILES = ("tests/gpu/gpu_check.py", "tests/tiny_model.py", "tests/tiny_adapter.py",
               "tests/benchmarks/bench_train.py")
CHECK_MODULES = ("sieverag.__main__", "sieverag.training.sft.__main__", "sieverag.serving.cli")


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def lent_machine() -> dict[str, str | None]:
    """The lent machine's packages (normalised name → its version where the README gives one)."""
    packages: dict[str, str | None] = {}
    for line in LENT_MACHINE.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[normalize(name)] = version.strip() or None
    return packages


def _target_environment() -> dict[str, str]:
    environment = default_environment()
    environment.update(python_version=MACHINE_PYTHON, python_full_version=f"{MACHINE_PYTHON}.0",
                       sys_platform="linux", platform_system="Linux",
                       platform_machine="x86_64", implementation_name="cpython",
                       platform_python_implementation="CPython", os_name="posix")
    return environment


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    environment = _target_environment()
    return any(requirement.marker.evaluate({**environment, "extra": extra})
               for extra in ("", *extras))


def declared_requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and the check's extras."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = list(project["dependencies"])
    for extra in CHECK_EXTRAS:
        declared += project["optional-dependencies"][extra]
    return [Requirement(text) for text in declared]


def _requirements_of(name: str, extras: Iterable[str]) -> list[Requirement]:
    try:
        requires = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        raise SystemExit(f"{name} is not installed in this environment ({sys.prefix}): run "
                         "`make setup` and use .venv/bin/python") from None
    return [r for r in map(Requirement, requires) if _applies(r, extras)]


@cache
def _closure() -> tuple[dict[str, str], dict[str, None]]:
    """(wheel set: name → version installed here, machine packages reached: name)."""
    wheels: dict[str, str] = {}
    reached: dict[str, None] = {}
    todo = [(r, tuple(r.extras)) for r in declared_requirements() if _applies(r, ())]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        requirement, extras = todo.pop()
        name = normalize(requirement.name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name in lent_machine():
            reached[name] = None
            continue
        wheels[name] = metadata.version(name)
        todo += [(r, tuple(r.extras)) for r in _requirements_of(name, extras)]
    return dict(sorted(wheels.items())), dict(sorted(reached.items()))


def wheel_set() -> dict[str, str]:
    """The distributions to carry (normalised name → the version installed here)."""
    return _closure()[0]


def machine_packages_used() -> dict[str, str | None]:
    """The machine's packages the wheel set and the declared dependencies reach (→ the
    README's version where it gives one)."""
    return {name: lent_machine()[name] for name in _closure()[1]}


def _module_file(module: str) -> Path | None:
    for package, folder in sorted(PACKAGE_DIRS.items(), key=lambda item: -len(item[0])):
        if module == package or module.startswith(package + "."):
            parts = module[len(package):].strip(".").split(".") if module != package else []
            base = ROOT / folder / Path(*parts) if parts else ROOT / folder
            if base.with_suffix(".py").is_file():
                return base.with_suffix(".py")
            if (base / "__init__.py").is_file():
                return base / "__init__.py"
            return None
    return None


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    for package, folder in PACKAGE_DIRS.items():
        if relative.parts[0] == folder and package != "sieverag":
            parts = [package, *relative.parts[1:]]
            return ".".join(p for p in parts if p != "__init__")
    return ".".join(p for p in relative.parts if p != "__init__")


def _optional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """An import under `if TYPE_CHECKING:` or in a `try` that catches ImportError."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
        if isinstance(node, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type)
                for h in node.handlers):
            return True
    return False


def _in_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return True
    return False


def _imports(path: Path) -> dict[str, bool]:
    """The absolute module names `path` imports anywhere (functions too; optional ones left
    out) → whether only inside functions (lazily); a package that imports its submodules by
    name imports them all."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if _optional(node, parents):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from a.b import c`: a.b.c, a module or a name of a.b (`_module_file` and
            # `distribution_of` then find the longest module it names)
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        lazy = _in_function(node, parents)
        for name in names:
            found[name] = found.get(name, True) and lazy
    if "import_module(f\"{__name__}." in source:  # e.g. inference/pipelines/__init__.py
        found.update((_module_name(p), False) for p in sorted(path.parent.rglob("*.py")))
    return found


def checked_modules() -> dict[str, dict[str, bool]]:
    """Each file the check runs (sieverag modules by name, its own scripts by path) → the
    modules it imports (→ whether only inside functions)."""
    todo = [ROOT / f for f in CHECK_FILES] + [_module_file(m) for m in CHECK_MODULES]
    found: dict[str, set[str]] = {}
    while todo:
        path = todo.pop()
        key = str(path.relative_to(ROOT))
        if key in found:
            continue
        found[key] = _imports(path)
        for name in found[key]:
            if name.split(".")[0] == "sieverag":
                target = _module_file(name) or _module_file(name.rpartition(".")[0])
                if target is not None:
                    todo.append(target)
            elif (helper := _helper_file(name.split(".")[0])) is not None:
                todo.append(helper)
    return found


# Where the check's own helpers live (it puts these folders on sys.path).
HELPER_DIRS = ("tests", "tests/gpu", "tests/benchmarks")


def _helper_file(name: str) -> Path | None:
    """The test helper module `name` (tiny_model, bench_train, ...), if it is one."""
    for folder in HELPER_DIRS:
        if (ROOT / folder / f"{name}.py").is_file():
            return ROOT / folder / f"{name}.py"
    return None


def third_party_imports(lazy: bool | None = None) -> dict[str, set[str]]:
    """Each third-party module the checked files import (as imported: `opentelemetry.trace`)
    → the files importing it; `lazy` True: only those imported inside functions alone (a
    module then loads without them), False: those imported at load time, None: all."""
    imported: dict[str, set[str]] = {}
    eager: set[str] = set()
    for file, names in checked_modules().items():
        for name, inside_functions in names.items():
            top = name.split(".")[0]
            if (top in ("sieverag", "__future__") or top in sys.stdlib_module_names
                    or _helper_file(top) is not None):
                continue
            imported.setdefault(name, set()).add(file)
            if not inside_functions:
                eager.add(name)
    return {name: files for name, files in imported.items()
            if lazy is None or (name not in eager) == lazy}


def optional_extras() -> dict[str, str]:
    """The distributions of pyproject.toml's optional extras (but `dev`, the test tools) →
    their extra: features a user installs on purpose (Milvus, OpenTelemetry, LangChain)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {normalize(Requirement(text).name): extra
            for extra, requirements in project["optional-dependencies"].items()
            if extra != "dev" for text in requirements}


@cache
def _module_owners() -> dict[str, str]:
    """Each module installed here (dotted name) → the distribution holding it."""
    owners: dict[str, str] = {}
    for dist in metadata.distributions():
        name = normalize(dist.metadata["Name"])
        for file in dist.files or ():
            parts = file.parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or ".." in parts:
                continue
            if file.suffix in (".py", ".so", ".pyd") or file.name.endswith(".abi3.so"):
                module = [*parts[:-1], parts[-1].split(".")[0]]
                if module[-1] == "__init__":
                    module = module[:-1]
                # Only real modules and packages: a namespace package (`opentelemetry`) has
                # no owner of its own, its submodules have theirs.
                owners[".".join(module)] = name
    return owners


def distribution_of(module: str) -> str | None:
    """The distribution installed here that provides `module` (its longest known prefix: a
    namespace package such as `opentelemetry` resolves by its submodule); None when none."""
    owners = _module_owners()
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        owner = owners.get(".".join(parts[:depth]))
        if owner is not None:
            return owner
    return None


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "wheels"
    if what == "wheels":
        print("\n".join(f"{name}=={version}" for name, version in wheel_set().items()))
    elif what == "machine":  # --pinned: the README's version, else the one installed here
        pinned = argv[1:] == ["--pinned"]
        print("\n".join(f"{name}=={version}" if version else name
                        for name, version in machine_packages_used().items()
                        for version in [version or (pinned and _installed(name))]))
    elif what == "modules":  # to import: `sieverag.__main__` runs the command line instead
        print("\n".join(sorted(name for f in checked_modules()
                               if f.split("/")[0] in set(PACKAGE_DIRS.values())
                               for name in [_module_name(ROOT / f)]
                               if not name.endswith("__main__"))))
    else:
        print("usage: python tests/gpu/wheel_set.py wheels|machine [--pinned]|modules",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
