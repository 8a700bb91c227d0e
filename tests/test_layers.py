"""The import layers, checked on the source (parsed with `ast`, nothing imported), and the
wheel's package list.

Inside `sieverag.inference` a module imports only its own layer or the layers below it:
`LAYERS` below, each with its rank, modules and role (layers of one rank sit side by side and
import neither of each other). docs/architecture.md shows them, generated from this file by
docs/hooks/layers.py, so the declaration here is the one map of the modules.

Between the parts (the folders pyproject.toml maps to `sieverag.*`, see PART_IMPORTS):
`inference` imports none of the others; data_gen, training and serving import `inference` and
themselves only (they share the filter's contract through `inference`); training also reads
its launch configs from `accelerate_configs`; the `sieverag` root (the command line) imports
`inference` and finds the other parts' commands by import path; nothing imports the root's
modules (`import sieverag` itself, which holds only `__version__`, is allowed).
Every import counts, also those inside functions and under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "setuptools"]
# Package name → repository folder, as the wheel maps them (e.g. sieverag.inference → inference).
PART_FOLDERS: dict[str, str] = SETUPTOOLS["package-dir"]

ROOT = "sieverag"
INFERENCE = "sieverag.inference"
DATA_GEN, TRAINING, SERVING = "sieverag.data_gen", "sieverag.training", "sieverag.serving"
ACCELERATE_CONFIGS = "sieverag.accelerate_configs"

# Each part → the parts it may import (itself included).
PART_IMPORTS: dict[str, frozenset[str]] = {
    ROOT: frozenset({ROOT, INFERENCE}),
    INFERENCE: frozenset({INFERENCE}),
    DATA_GEN: frozenset({DATA_GEN, INFERENCE}),
    TRAINING: frozenset({TRAINING, INFERENCE, ACCELERATE_CONFIGS}),
    SERVING: frozenset({SERVING, INFERENCE}),
    ACCELERATE_CONFIGS: frozenset({ACCELERATE_CONFIGS}),
}


@dataclass(frozen=True)
class Layer:
    name: str
    rank: int
    members: tuple[str, ...]
    """Modules, or packages standing for every module inside them."""
    role: str = ""
    """What the layer holds, in a line (docs/architecture.md shows it)."""


LAYERS = (
    Layer("shared base", 0, (INFERENCE, f"{INFERENCE}.core"),
          role="shared types and errors, file I/O, the prompt templates (`prompts/`), the one "
               "configuration system, many questions in flight, self-contained HTML pages "
               "(`html/`)"),
    Layer("data", 1, (f"{INFERENCE}.data",), role="dataset loaders and the demo set"),
    Layer("llm", 2, (f"{INFERENCE}.llm",),
          role="the backends: in-process transformers, OpenAI-compatible servers"),
    Layer("retrieval", 2, (f"{INFERENCE}.retrieval",),
          role="BM25, dense and hybrid retrieval, indexes; runs no LLM"),
    Layer("agents", 3, (f"{INFERENCE}.filters", f"{INFERENCE}.agents"),
          role="the filters (MCF, the MAIN-RAG judge, their stack, the shipped filter), the "
               "filter's card in one package (`card/`: its file, its fitted combination, the "
               "questions asked of it), who runs each model role, cutting the scored answer "
               "from a reply"),
    # Every metric's definition (the runner and reports sit above, in evaluation): functions of
    # answers, decisions, context and gold.
    Layer("metrics", 3, (f"{INFERENCE}.metrics",),
          role="every metric's definition: answers (EM, F1, accuracy), a filter against gold "
               "passages and sentences, retrieval (recall@k, MRR), trust (the Auto-RAG "
               "study's and ours) and the LLM grader"),
    Layer("pipelines", 4, (f"{INFERENCE}.pipelines",),
          role="a pipeline is a module, or a package with its parts (`amber/`, `auto/`); the "
               "shared modules name no pipeline"),
    Layer("composition", 5, (f"{INFERENCE}.composition",),
          role="a run's settings (`presets/`); plan a run, build its roles and pipelines"),
    Layer("integrations", 5, (f"{INFERENCE}.integrations",),
          role="the filter inside LangChain and LlamaIndex, through the rerank endpoint or in "
               "process"),
    Layer("evaluation", 6, (f"{INFERENCE}.eval",),
          role="the runner, records, reports (computing and reporting the metrics), trace "
               "rendering, the judge-bar sweep, the RAGAS export"),
)
COMMAND_LINE = Layer("command line", 7, (),
                     role="every part's `cli` module or package, at the part's top (never "
                          "inside a layer's folder): it may import anything in its own part")
# The shared core: the layers the parts built on `inference` (data_gen, training, serving) may
# import. The layers above — pipelines, composition, integrations, evaluation, the command
# line — are inference proper: answering and scoring questions.
SHARED_CORE = frozenset({"shared base", "data", "llm", "retrieval", "agents", "metrics"})

# Libraries that run a generator: the layers that must run without an LLM import none.
GENERATOR_LIBRARIES = ("transformers", "peft", "trl", "vllm")
NO_GENERATOR_LAYERS = ("shared base", "data", "retrieval")


@dataclass(frozen=True)
class SourceModule:
    name: str
    path: Path
    is_package: bool

    @property
    def shown(self) -> str:
        """The file as a message names it, relative to the repository."""
        return str(self.path.relative_to(REPO)) if self.path.is_relative_to(REPO) else str(
            self.path)


@dataclass(frozen=True)
class Import:
    target: str
    """The module imported: the most specific one named (`from a import b` → a.b if a module)."""
    line: int
    statement: str


def source_modules() -> dict[str, SourceModule]:
    """Every module of the parts, by dotted name."""
    modules = {}
    for package, folder in PART_FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder).with_suffix("")
            is_package = relative.name == "__init__"
            name = ".".join((package, *(relative.parts[:-1] if is_package else relative.parts)))
            modules[name] = SourceModule(name, path, is_package)
    return modules


def imports_of(module: SourceModule, known: set[str]) -> Iterator[Import]:
    """Each import of the module's file, first-party targets resolved to known modules."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            names = [alias.name for alias in node.names]
            statement = f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"
            submodules = [f"{base}.{name}" for name in names if f"{base}.{name}" in known]
            for target in submodules:
                yield Import(target, node.lineno, statement)
            if len(submodules) < len(names):
                yield Import(base, node.lineno, statement)


def _absolute(node: ast.ImportFrom, module: SourceModule) -> str:
    """The module a `from` import reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if not module.is_package:
        package = package[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> Layer | None:
    """The inference layer of a module; None for a module no layer claims."""
    if "cli" in module.split(".")[1:]:  # a part's `cli` module or package
        return COMMAND_LINE
    claims = [(len(member), layer) for layer in LAYERS for member in layer.members
              if _within(module, member)]
    return max(claims, key=lambda claim: claim[0])[1] if claims else None


def part_of(module: str) -> str:
    """The part (a package pyproject.toml maps to a folder) that holds the module."""
    return max((part for part in PART_FOLDERS if _within(module, part)), key=len, default="")


def violation(importer: str, target: str) -> str | None:
    """Why `importer` may not import `target` (a first-party module); None when it may."""
    importer_part, target_part = part_of(importer), part_of(target)
    if target == ROOT:  # the package itself holds only `__version__` and imports nothing
        return None
    if target_part not in PART_IMPORTS.get(importer_part, ()):
        if target_part == ROOT:
            return "nothing imports the `sieverag` command line (`import sieverag` for the " \
                "version is fine)"
        if importer_part == ROOT:
            return (f"the command line root imports only `inference`; it finds {target_part}'s "
                    "commands by import path (sieverag/cli.py COMMANDS)")
        if importer_part == INFERENCE:
            return f"`inference` imports none of the parts built on it ({target_part})"
        return (f"{importer_part} does not import {target_part}: the parts share the filter's "
                "contract through `inference` only")
    if importer_part != INFERENCE and target_part == INFERENCE and importer_part != ROOT:
        layer = layer_of(target)
        if layer is not None and layer.name not in SHARED_CORE:
            return (f"{importer_part} imports `inference`'s shared core only, not its "
                    f"{layer.name} layer (inference proper)")
    if importer_part != INFERENCE:
        return None
    have, want = layer_of(importer), layer_of(target)
    if have is None or want is None:
        return None  # reported by test_every_inference_module_has_a_layer
    if have is want or want.rank < have.rank:
        return None
    if have.name == "retrieval" and want.name == "llm":
        return "retrieval imports no LLM code (it runs without a generator)"
    where = "beside" if want.rank == have.rank else "above"
    return f"{have.name} imports {want.name}, a layer {where} it"


def generator_library_violation(importer: str, target: str) -> str | None:
    """Why `importer` may not import the third-party module `target`; None when it may."""
    layer = layer_of(importer) if part_of(importer) == INFERENCE else None
    library = target.split(".")[0]
    if layer is not None and layer.name in NO_GENERATOR_LAYERS and library in \
            GENERATOR_LIBRARIES:
        return f"the {layer.name} layer imports no generator library ({library})"
    return None


MODULES = source_modules()


def all_violations() -> list[str]:
    known = set(MODULES)
    found = []
    for module in MODULES.values():
        for imported in imports_of(module, known):
            if imported.target.split(".")[0] != ROOT:
                reason = generator_library_violation(module.name, imported.target)
            elif imported.target not in known:
                reason = "imports a module that does not exist"
            else:
                reason = violation(module.name, imported.target)
            if reason:
                found.append(f"{module.shown}:{imported.line}: `{imported.statement}` — {reason}")
    return found


# ----- the project's own code -----

def test_the_parts_are_found_and_each_has_its_rules() -> None:
    assert set(PART_FOLDERS) == set(PART_IMPORTS), (
        "pyproject.toml's package-dir and PART_IMPORTS in tests/test_layers.py name different "
        f"parts: {sorted(set(PART_FOLDERS) ^ set(PART_IMPORTS))}; give each part its rules")
    for part in PART_FOLDERS:
        assert part in MODULES and MODULES[part].is_package
    assert f"{INFERENCE}.data.loading" in MODULES
    assert "sieverag.cli" in MODULES and f"{INFERENCE}.cli" in MODULES


def test_command_modules_sit_at_a_parts_top_never_in_a_layers_folder() -> None:
    """A `cli` module or package is a part's own (sieverag/cli.py, inference/cli/,
    training/cli/, ...): no layer folder holds one."""
    misplaced = sorted(name for name in MODULES if "cli" in name.split(".")[1:]
                       and name.split(".").index("cli") != len(part_of(name).split(".")))
    assert not misplaced, f"command modules inside a layer's folder: {misplaced}"


def test_every_inference_module_has_a_layer() -> None:
    unplaced = [f"{m.shown} ({m.name})" for m in MODULES.values()
                if part_of(m.name) == INFERENCE and layer_of(m.name) is None]
    assert not unplaced, ("modules no layer claims; add each to LAYERS in tests/test_layers.py:\n"
                          + "\n".join(unplaced))


def test_no_import_runs_up_the_layers() -> None:
    found = all_violations()
    assert not found, "imports against the layers:\n" + "\n".join(found)


# ----- the checker itself -----

@pytest.mark.parametrize(("importer", "target", "reason"), [
    ("sieverag.inference.retrieval.corpus", "sieverag.inference.eval.runner",
     "retrieval imports evaluation, a layer above it"),
    ("sieverag.inference.retrieval.corpus", "sieverag.inference.metrics.answer_scores",
     "retrieval imports metrics, a layer above it"),
    ("sieverag.training.evaluation.filter_eval", "sieverag.inference.composition.compose",
     "sieverag.training imports `inference`'s shared core only, not its composition layer"),
    ("sieverag.serving.app", "sieverag.inference.pipelines.amber",
     "not its pipelines layer (inference proper)"),
    ("sieverag.inference.retrieval.index_folder", "sieverag.inference.llm.hf",
     "retrieval imports no LLM code"),
    ("sieverag.inference.llm.hf", "sieverag.inference.retrieval.bm25",
     "llm imports retrieval, a layer beside it"),
    ("sieverag.inference.data.readers", "sieverag.inference.retrieval.sentences",
     "data imports retrieval, a layer above it"),
    ("sieverag.inference.core.types", "sieverag.inference.data",
     "shared base imports data, a layer above it"),
    ("sieverag.inference.filters.judge", "sieverag.inference.cli.run",
     "agents imports command line, a layer above it"),
    ("sieverag.inference.pipelines.pipeline_registry", "sieverag.inference.composition.config",
     "pipelines imports composition, a layer above it"),
    ("sieverag.inference.eval.runner", "sieverag.data_gen.cxmi", "`inference` imports none of"),
    ("sieverag.inference.cli.run", "sieverag.accelerate_configs", "`inference` imports none of"),
    ("sieverag.serving.cli", "sieverag.accelerate_configs", "sieverag.serving does not import"),
    ("sieverag.training.sft", "sieverag.serving.config", "sieverag.training does not import"),
    ("sieverag.serving.app", "sieverag.training.sft.data", "sieverag.serving does not import"),
    ("sieverag.data_gen.labelling", "sieverag.training.sft.data", "sieverag.data_gen does not"),
    ("sieverag.cli", "sieverag.serving.cli", "the command line root imports only"),
    ("sieverag.inference.cli.run", "sieverag.cli", "nothing imports the `sieverag` command line"),
])
def test_imports_up_the_layers_are_refused(importer: str, target: str, reason: str) -> None:
    found = violation(importer, target)
    assert found is not None and reason in found


@pytest.mark.parametrize(("importer", "target"), [
    ("sieverag.inference.retrieval.corpus", "sieverag.inference.data"),
    ("sieverag.inference.eval.runner", "sieverag.inference.data"),
    ("sieverag.inference.data.loading", "sieverag.inference.core.errors"),
    ("sieverag.inference.filters.mcf", "sieverag.inference.retrieval.bm25"),
    ("sieverag.inference.pipelines.amber.collector", "sieverag.inference.pipelines.amber.memory"),
    ("sieverag.inference.cli.index", "sieverag.inference.llm.model_resolution"),
    ("sieverag.inference.cli.run", "sieverag.inference.cli.index"),
    ("sieverag.data_gen.labelling", "sieverag.inference.data"),
    ("sieverag.training.evaluation.filter_eval", "sieverag.inference.metrics.answer_scores"),
    ("sieverag.training.cli.train", "sieverag.accelerate_configs"),
    ("sieverag.cli", "sieverag.inference.core.settings"),
    ("sieverag.__main__", "sieverag.cli"),
])
def test_imports_down_the_layers_are_allowed(importer: str, target: str) -> None:
    assert violation(importer, target) is None


def test_generator_libraries_are_refused_below_the_llm_layer() -> None:
    refused = generator_library_violation("sieverag.inference.retrieval.dense",
                                          "transformers.models")
    assert refused is not None and "retrieval layer imports no generator library" in refused
    assert generator_library_violation("sieverag.inference.data.files", "peft") is not None
    assert generator_library_violation("sieverag.inference.retrieval.dense",
                                       "sentence_transformers") is None
    assert generator_library_violation("sieverag.inference.llm.hf", "transformers") is None


def test_imports_are_read_everywhere_in_a_file_and_resolved(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import bm25, missing_name\n"
        "from ..metrics import answer_scores\n"
        "if TYPE_CHECKING:\n"
        "    from sieverag.inference.llm.backend_protocol import LLMBackend\n"
        "def later():\n"
        "    import transformers\n", encoding="utf-8")
    module = SourceModule("sieverag.inference.retrieval.probe", source, is_package=False)
    known = {"sieverag.inference.retrieval.bm25", "sieverag.inference.metrics.answer_scores",
             "sieverag.inference.llm.backend_protocol"}
    assert {(found.target, found.line) for found in imports_of(module, known)} == {
        ("typing", 1),
        ("sieverag.inference.retrieval.bm25", 2), ("sieverag.inference.retrieval", 2),
        ("sieverag.inference.metrics.answer_scores", 3),
        ("sieverag.inference.llm.backend_protocol", 5),
        ("transformers", 7),
    }


# ----- the wheel's package list -----

def package_folders() -> dict[str, Path]:
    """Every folder of the parts holding an `__init__.py`, by its installed package name."""
    return {module.name: module.path.parent for module in MODULES.values() if module.is_package}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(SETUPTOOLS["packages"])
    missing = [f"{folder.relative_to(REPO)}/ ({name})"
               for name, folder in sorted(package_folders().items())
               if name not in listed]
    assert not missing, ("package folders missing from [tool.setuptools] packages in "
                         "pyproject.toml (a wheel would leave them out):\n" + "\n".join(missing))


def test_every_listed_package_is_a_package_folder() -> None:
    stale = sorted(set(SETUPTOOLS["packages"]) - set(package_folders()))
    assert not stale, f"pyproject.toml lists packages with no folder and __init__.py: {stale}"


def test_every_folder_with_python_code_is_a_package() -> None:
    loose = sorted({
        str(path.parent.relative_to(REPO))
        for folder in PART_FOLDERS.values() for path in (REPO / folder).rglob("*.py")
        if not (path.parent / "__init__.py").is_file()
    })
    assert not loose, f"folders with .py files but no __init__.py (not installed): {loose}"


# ----- pyproject.toml declares what the package imports --------------------------------------

# Import names that differ from their distribution's name.
DISTRIBUTION_OF = {"Stemmer": "pystemmer", "faiss": "faiss-cpu", "sklearn": "scikit-learn",
                   "yaml": "pyyaml", "llama_index": "llama-index-core",
                   "opentelemetry": "opentelemetry-sdk"}
# Imported only where their extra is installed (inside functions, behind that extra, or by a
# module of that extra alone: FRAMEWORK_MODULES).
EXTRA_ONLY = {"vllm", "deepspeed", "wandb", "langchain_core", "llama_index", "pymilvus",
              "opentelemetry"}
# A framework adapter's library → the one module that imports it (nothing imports that module),
# so `import sieverag.inference` and every command run without the framework installed.
FRAMEWORK_MODULES = {"langchain_core": f"{INFERENCE}.integrations.langchain",
                     "llama_index": f"{INFERENCE}.integrations.llamaindex"}


def _distribution(requirement: str) -> str:
    """`pydantic-settings>=2.7` → `pydantic-settings` (lower case, `_` as `-`)."""
    name = requirement
    for mark in "<>=!~[; ":
        name = name.split(mark)[0]
    return name.strip().lower().replace("_", "-")


def test_every_imported_package_is_declared() -> None:
    import sys

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {_distribution(r) for r in project["dependencies"]}
    extras = {_distribution(r) for rs in project["optional-dependencies"].values() for r in rs}
    imported = {i.target.split(".")[0] for m in MODULES.values() for i in imports_of(m, set())}
    third_party = imported - set(sys.stdlib_module_names) - {ROOT, "__future__"}
    missing = sorted(
        name for name in third_party
        if DISTRIBUTION_OF.get(name, name).lower().replace("_", "-")
        not in (declared | (extras if name in EXTRA_ONLY else set())))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_each_framework_is_imported_by_its_adapter_alone() -> None:
    known = set(MODULES)
    found = []
    for module in MODULES.values():
        for imported in imports_of(module, known):
            library = imported.target.split(".")[0]
            if library in FRAMEWORK_MODULES and module.name != FRAMEWORK_MODULES[library]:
                found.append(f"{module.shown}:{imported.line}: `{imported.statement}` — only "
                             f"{FRAMEWORK_MODULES[library]} imports {library}")
            if imported.target in FRAMEWORK_MODULES.values():
                found.append(f"{module.shown}:{imported.line}: `{imported.statement}` — a "
                             "framework adapter is imported by its users only")
    assert set(FRAMEWORK_MODULES.values()) <= known
    assert not found, "framework imports outside their adapters:\n" + "\n".join(found)


def import_graph() -> dict[str, set[str]]:
    """Module → the first-party modules it imports (an import of a package it sits in is the
    package's own business, not an edge)."""
    known = set(MODULES)
    return {name: {i.target for i in imports_of(module, known)
                   if i.target != name and not _within(name, i.target)}
            for name, module in MODULES.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles: each strongly connected set of two or more modules (Tarjan's)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            members = [stack.pop()]
            while members[-1] != module:
                members.append(stack.pop())
            if len(members) > 1:
                cycles.append(sorted(members))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def test_no_modules_import_each_other() -> None:
    """No import cycle, also none hidden by an import inside a function."""
    assert import_cycles(import_graph()) == []


def test_a_cycle_is_found_however_long() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


PIPELINES_DIR = REPO / PART_FOLDERS[INFERENCE] / "pipelines"
EVAL_DIR = REPO / PART_FOLDERS[INFERENCE] / "eval"
# The modules every pipeline shares, which must name none of them: composition, the run config,
# the pipelines' shared context, registry and traces, the package's door, its round-by-round
# source, and evaluation (which reads what each pipeline declares: its trace and renderer,
# what it compares with, whether a judge sweep may run it).
PIPELINE_NEUTRAL = ("composition/compose.py", "composition/config.py", "pipelines/__init__.py",
                    "pipelines/pipeline_registry.py", "pipelines/rounds.py", "pipelines/traces.py",
                    *sorted(str(path.relative_to(EVAL_DIR.parent))
                            for path in EVAL_DIR.rglob("*.py")))
# A string there that equals a pipeline's name but means something else, with what it means.
NOT_A_PIPELINE = {("composition/config.py", "auto"): "dataset_format's loader detection",
                  ("eval/html_report.py", "auto"): "dataset_format's loader detection"}


def registered_pipeline_names() -> set[str]:
    """The names the pipeline modules register: `register_pipeline("name")` and a module's
    `NAME = "..."` constant (read with `ast`), and amber's `amber-<variant>` by prefix."""
    names = set()
    for path in PIPELINES_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register_pipeline"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and any(getattr(t, "id", "") == "NAME" for t in node.targets)):
                names.add(node.value.value)
    return names


def code_strings(path: Path) -> Iterator[ast.Constant]:
    """The string constants of a file's code: not its docstrings, not a field's help text."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            prose.add(id(body[0].value))
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "help":
                    prose.update(id(n) for n in ast.walk(value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node


def test_no_pipeline_is_named_outside_its_own_package() -> None:
    """What a pipeline needs built, it declares (`register_pipeline`: `inner`, `part`), and
    what evaluation needs of it too (`trace`, `render_trace`, `compares_with`, `judge_sweep`),
    so the shared modules and eval decide nothing by a pipeline's name."""
    names = registered_pipeline_names()
    assert {"vanilla", "auto", "amber", "main-rag"} <= names
    assert "eval/result_records.py" in PIPELINE_NEUTRAL
    assert "eval/trace_rendering.py" in PIPELINE_NEUTRAL
    named = [f"{file}:{node.lineno} names {node.value!r}"
             for file in PIPELINE_NEUTRAL
             for node in code_strings(REPO / PART_FOLDERS[INFERENCE] / file)
             if (node.value in names or node.value.startswith("amber-"))
             and (file, node.value) not in NOT_A_PIPELINE]
    assert named == []


# ----- one name, one thing -------------------------------------------------------------------

# Stems that name a role, not a thing: every package may hold one.
ROLE_STEMS = {
    "__init__": "a package's door",
    "__main__": "what `python -m` runs",
    "cli": "a part's commands",
    "config": "a package's own settings",
    "errors": "a part's own error types",
}
# Stems an HTTP endpoint's folder holds, each endpoint its own: its routes, its bodies, its work.
ENDPOINT_STEMS = ("router", "protocol", "serving")


def _in_endpoint_folder(path: Path) -> bool:
    """Whether a module sits in an HTTP endpoint's folder: serving/api/<endpoint>/ or
    serving/proxy/."""
    folder = path.parent.relative_to(REPO / PART_FOLDERS[SERVING]).parts
    return (len(folder) == 2 and folder[0] == "api") or folder == ("proxy",)


def shared_stems(modules: dict[str, SourceModule]) -> dict[str, list[str]]:
    """Module file stems two or more package modules share, but for role stems and an endpoint
    folder's own."""
    by_stem: dict[str, list[str]] = {}
    for module in modules.values():
        stem = module.path.stem
        if stem in ROLE_STEMS:
            continue
        if (stem in ENDPOINT_STEMS and part_of(module.name) == SERVING
                and _in_endpoint_folder(module.path)):
            continue
        by_stem.setdefault(stem, []).append(module.shown)
    return {stem: sorted(shown) for stem, shown in sorted(by_stem.items()) if len(shown) > 1}


def test_no_two_modules_share_a_name() -> None:
    """`git grep -w NAME` for a module finds one module: a stem names what its module holds
    (`call_batching`, `continuous_batching`), never a second module elsewhere."""
    shared = shared_stems(MODULES)
    assert not shared, ("modules sharing a name; name each for what it holds:\n" + "\n".join(
        f"{stem}: {', '.join(shown)}" for stem, shown in shared.items()))


def test_a_shared_stem_is_found_and_an_endpoints_own_is_not() -> None:
    serving = REPO / PART_FOLDERS[SERVING]
    inference = REPO / PART_FOLDERS[INFERENCE]
    probe = {name: SourceModule(name, path, is_package=False) for name, path in [
        ("sieverag.serving.api.chat.router", serving / "api/chat/router.py"),
        ("sieverag.serving.api.score.router", serving / "api/score/router.py"),
        ("sieverag.serving.proxy.router", serving / "proxy/router.py"),
        ("sieverag.inference.pipelines.gate.router", inference / "pipelines/gate/router.py"),
        ("sieverag.serving.api.router", serving / "api/router.py"),
        ("sieverag.inference.llm.pool", inference / "llm/pool.py"),
        ("sieverag.serving.engine.pool", serving / "engine/pool.py"),
        ("sieverag.inference.retrieval.config", inference / "retrieval/config.py"),
        ("sieverag.serving.config", serving / "config.py"),
    ]}
    assert shared_stems(probe) == {
        "pool": ["inference/llm/pool.py", "serving/engine/pool.py"],
        "router": ["inference/pipelines/gate/router.py", "serving/api/router.py"]}


# A class name two package modules define, and why both keep it (none today).
SHARED_CLASS_NAMES: dict[str, str] = {}


def class_definitions(modules: dict[str, SourceModule]) -> dict[str, list[str]]:
    """Class name → where each package module defines it (`file:line`), nested classes too."""
    found: dict[str, list[str]] = {}
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{module.shown}:{node.lineno}")
    return found


def test_no_class_name_is_defined_twice() -> None:
    """`git grep -w NAME` for a class finds one class (the server's `RerankServing`, the
    retrieval stage's `HitReranker` and the client's `RerankEndpoint` are three things)."""
    twice = {name: where for name, where in class_definitions(MODULES).items()
             if len(where) > 1 and name not in SHARED_CLASS_NAMES}
    assert not twice, ("class names defined more than once; name each for what it is:\n"
                       + "\n".join(f"{name}: {', '.join(where)}" for name, where in twice.items()))
    stale = set(SHARED_CLASS_NAMES) - {name for name, where in class_definitions(MODULES).items()
                                       if len(where) > 1}
    assert not stale, f"SHARED_CLASS_NAMES lists names defined once or not at all: {stale}"


# ----- the filter's card in one room ---------------------------------------------------------

CARD_PACKAGE = f"{INFERENCE}.filters.card"
# The card's sections of the fitted combination, its home rule and its priors-only fit: only the
# card package reads them, by these keys or by the constants that hold them.
CARD_SECTION_KEYS = frozenset({"combination", "home", "priors_only"})
CARD_SECTION_CONSTANTS = frozenset({"COMBINATION_KEY", "HOME_KEY", "PRIORS_ONLY_KEY"})
# A module outside the card package that reads one of those keys of something that is not a
# card, with what it reads.
NOT_A_CARD_SECTION = {
    ("training/evaluation/home_fit.py", "home"): "the home fit's own rows and means: the "
                                                 "figures of its home rounds, before any card",
}
# The one question whether MCF reads the filter for a round's chunks, and the names it had.
READS_FILTER = "reads_filter"
RETIRED_READS_FILTER = ("uses_filter", "calls_filter")


def card_section_reads(path: Path) -> Iterator[tuple[int, str]]:
    """Each place a file reads a card section (`CARD_SECTION_KEYS` as a subscript or the key of
    `.get`/`.pop`/`.setdefault`) or names a constant of `CARD_SECTION_CONSTANTS` (an import
    too): (line, the key or constant)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in CARD_SECTION_KEYS:
            yield node.lineno, key.value
        if isinstance(node, ast.Name) and node.id in CARD_SECTION_CONSTANTS:
            yield node.lineno, node.id
        if isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, a.name) for a in node.names
                        if a.name in CARD_SECTION_CONSTANTS)


def function_definitions(modules: dict[str, SourceModule], names: tuple[str, ...]
                         ) -> list[tuple[str, str]]:
    """(function or method name, `file:line`) of every definition of one of `names`."""
    return [(node.name, f"{module.shown}:{node.lineno}")
            for module in modules.values()
            for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names]


def test_only_the_card_package_reads_the_cards_sections() -> None:
    """The card's combination, home and priors-only sections are read (and written) in
    `inference/filters/card/` alone: the server, MCF, eval-filter and training's fits ask it
    (`card_combination`, `fitted_questions`, `with_combination`, ...), never the dict."""
    found, allowed = [], set()
    for module in MODULES.values():
        if _within(module.name, CARD_PACKAGE):
            continue
        for line, key in card_section_reads(module.path):
            if (module.shown, key) in NOT_A_CARD_SECTION:
                allowed.add((module.shown, key))
            else:
                found.append(f"{module.shown}:{line}: reads {key!r}")
    assert not found, ("card sections read outside inference/filters/card/ (ask the card "
                       "package, or add what it reads to it):\n" + "\n".join(found))
    stale = set(NOT_A_CARD_SECTION) - allowed
    assert not stale, f"NOT_A_CARD_SECTION lists reads no module makes: {sorted(stale)}"


def test_whether_the_filter_is_read_has_one_rule() -> None:
    """`Combination.reads_filter` is the one rule (MCF, its start line and every description
    of a card ask it); the names it had are gone."""
    defined = function_definitions(MODULES, (READS_FILTER, *RETIRED_READS_FILTER))
    assert [name for name, _ in defined] == [READS_FILTER], defined
    assert defined[0][1].startswith("inference/filters/card/"), defined


def test_a_card_section_read_is_found_and_another_key_is_not(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from sieverag.inference.filters.card.combination import HOME_KEY\n"
        "fit = card['combination']['fit']\n"
        "rule = (card or {}).get('home')\n"
        "rest = {k: v for k, v in card.items() if k != HOME_KEY}\n"
        "base = card.get('base_model')\n"
        "weights = section['weights']\n"
        "report = {'combination': None}\n", encoding="utf-8")
    assert sorted(card_section_reads(source)) == [
        (1, "HOME_KEY"), (2, "combination"), (3, "home"), (4, "HOME_KEY")]
