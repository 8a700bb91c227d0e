"""The documentation: the MkDocs site builds with --strict, its CLI reference covers every
command, the README stays a short front door, and every shell example either runs or says why
it cannot run here.

An example is a fenced ```bash / ```sh / ```shell / ```console block in README.md or docs/.
A marker on the line right above it (blank lines between are allowed) says why a test does not
run it:

    <!-- example: needs-gpu [why] -->       a CUDA GPU
    <!-- example: needs-dataset [why] -->   files not in the repository (the projects' data
                                            sets, a hub dataset, a corpus of your own)
    <!-- example: needs-network [why] -->   installs packages or reaches a server elsewhere
    <!-- example: covered-by tests/test_x.py::test_name [...] [why] -->
                                            long-running or needs a running server; the named
                                            tests run the same thing

Unmarked examples run here, each file's in order in one scratch folder that sees the
repository's files, with the `sieverag` of this checkout, the session's test cache and no
network. A `console` block runs its `$ ` lines only.
"""

from __future__ import annotations

import ast
import contextlib
import html
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sieverag.cli import main

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 250
README_COMMANDS_WITHIN = 30  # lines: `make demo` and `make test` within the first screen
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
KINDS = {"needs-gpu", "needs-dataset", "needs-network", "covered-by"}
MARKER = re.compile(r"<!--\s*example:\s*(?P<kind>[\w-]+)(?P<rest>.*?)-->", re.DOTALL)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w-]*)")
EXAMPLE_TIMEOUT_S = 240


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # the marker's kind, None when unmarked
    marker_args: str

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def script(self) -> str:
        if self.lang != "console":
            return self.code
        return "\n".join(line[2:] for line in self.code.splitlines() if line.startswith("$ "))


def documents() -> list[Path]:
    return [REPO / "README.md",
            *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def _marker_above(lines: list[str], fence: int) -> re.Match | None:
    """The example marker ending on the last non-blank line above line `fence` (0-based)."""
    end = fence - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return None
    start = end
    while start > 0 and "<!--" not in lines[start]:
        start -= 1
    return MARKER.fullmatch("\n".join(lines[start:end + 1]).strip())


def examples_in(path: Path) -> list[Example]:
    """The fenced shell blocks of a Markdown file, with the marker above each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening["indent"], opening["fence"], opening["lang"].lower()
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        if lang in SHELL_LANGUAGES:
            marker = _marker_above(lines, i)
            found.append(Example(path, i + 1, lang, "\n".join(body) + "\n",
                                 marker["kind"] if marker else None,
                                 " ".join(marker["rest"].split()) if marker else ""))
        i = end + 1
    return found


ALL_EXAMPLES = [example for path in documents() for example in examples_in(path)]


def test_readme_is_a_short_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    # CI runs the README's test command; it and the demo are on the first screen.
    commands = [line.split("#")[0].strip() for line in lines[:README_COMMANDS_WITHIN]]
    assert "make demo" in commands and "make test" in commands
    for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", "\n".join(lines)):
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


def test_every_marker_is_known_and_sits_on_a_shell_example():
    for path in documents():
        text = path.read_text(encoding="utf-8")
        marked = {e.line for e in examples_in(path) if e.marker}
        for marker in MARKER.finditer(text):
            line = text.count("\n", 0, marker.end()) + 1  # where the comment ends
            where = f"{path.relative_to(REPO)}:{line}"
            assert marker["kind"] in KINDS, f"{where}: unknown example marker {marker['kind']!r}"
            lines = text.splitlines()
            below = line  # 0-based index of the line after the comment
            while below < len(lines) and not lines[below].strip():
                below += 1
            assert below + 1 in marked, f"{where}: the marker is not right above a shell block"


def _test_names(test_file: Path) -> set[str]:
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"):
            names.add(node.name)
    return names


def test_covered_by_names_existing_tests():
    covered = [e for e in ALL_EXAMPLES if e.marker == "covered-by"]
    assert covered
    for example in covered:
        targets = [word for word in example.marker_args.split() if "::" in word]
        assert targets, f"{example.where()}: covered-by names no test (tests/test_x.py::name)"
        for target in targets:
            file, _, name = target.partition("::")
            test_file = REPO / file
            assert test_file.is_file(), f"{example.where()}: {file} does not exist"
            assert name.split("[")[0] in _test_names(test_file), (
                f"{example.where()}: {file} has no test named {name}")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with --strict into a temporary folder."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return site


def test_site_builds_strict_with_every_page(built_site: Path):
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS)
        if relative.parts[0] == "hooks":
            continue
        folder = relative.parent if relative.name == "index.md" else relative.with_suffix("")
        assert (built_site / folder / "index.html").is_file(), f"{relative} was not built"


def _cli_commands() -> list[str]:
    """Every command and command group, as `sieverag --help` and each group's --help list them."""
    def listing(args: list[str]) -> list[str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*args, "--help"]) == 0
        text = out.getvalue().split("commands:\n", 1)[1].split("\n\n", 1)[0]
        return [line.split()[0] for line in text.splitlines() if line.startswith("  ")
                and not line.startswith("   ")]

    commands = []
    for name in listing([]):
        commands.append(name)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main([name, "--help"])
            except SystemExit:
                pass
        if out.getvalue().startswith(f"usage: sieverag {name} COMMAND"):  # a group
            commands += [f"{name} {sub}" for sub in listing([name])]
    return commands


def test_cli_reference_covers_every_command(built_site: Path):
    page = (built_site / "cli" / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    commands = _cli_commands()
    assert {"eval", "index", "index build", "filter list", "serve"} <= set(commands)
    for name in commands:
        assert f'id="sieverag-{name.replace(" ", "-")}"' in page, f"no section for {name}"
        assert f"usage: sieverag {name} " in text, f"no --help output for {name}"
    assert "usage: sieverag COMMAND" in text  # sieverag --help itself


def _scratch_folder(root: Path) -> Path:
    """A working folder that sees the repository's files (by links) and keeps what examples
    write (runs/, a YAML file) to itself."""
    work = root / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name in {"runs", "site"}:
            continue
        (work / entry.name).symlink_to(entry)
    return work


def _runnable_groups() -> dict[str, list[Example]]:
    """Each document's unmarked examples, in order; documents whose examples are the same
    scripts (the README's tour and the docs' tour) share one run."""
    by_document: dict[Path, list[Example]] = {}
    for example in ALL_EXAMPLES:
        if example.marker is None:
            by_document.setdefault(example.path, []).append(example)
    groups: dict[tuple[str, ...], list[Path]] = {}
    for path, examples in by_document.items():
        groups.setdefault(tuple(e.script() for e in examples), []).append(path)
    return {"+".join(str(p.relative_to(REPO)) for p in paths): by_document[paths[0]]
            for paths in groups.values()}


RUNNABLE = _runnable_groups()


@pytest.mark.parametrize("document", sorted(RUNNABLE))
def test_unmarked_examples_run(document: str, tmp_path: Path, embedded_model_dir: Path):
    work = _scratch_folder(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "100",
           "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "SIEVERAG_CACHE": os.environ["SIEVERAG_CACHE"]}
    for example in RUNNABLE[document]:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", example.script()],
                              cwd=work, env=env, capture_output=True, text=True,
                              timeout=EXAMPLE_TIMEOUT_S)
        assert done.returncode == 0, (
            f"{example.where()} exited {done.returncode}; mark it (see tests/test_docs.py) if it "
            f"cannot run here\n$ {shlex.quote(example.script())}\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}")
        assert "Traceback" not in done.stderr, f"{example.where()}:\n{done.stderr[-3000:]}"
