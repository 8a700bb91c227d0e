"""The `sieverag` command line.

Every command is a settings class (a `@settings` dataclass: its fields are the command's
flags, a YAML `--config` or `--preset` supplies defaults) and a function that runs it. This
table names both by import path, so `sieverag --help` lists the commands without importing
any of them (no torch at start-up); the chosen command's module is imported when it runs.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: its settings class and run function (`module:name`), one line of help."""

    settings: str
    run: str
    help: str


def _command(module: str, settings: str, run: str, help: str) -> Command:
    return Command(f"{module}:{settings}", f"{module}:{run}", help)


_INFERENCE = "sieverag.inference.cli.run"
_RETRIEVAL = "sieverag.inference.cli.index"
_DATA_GEN = "sieverag.data_gen.cli"
_TRAIN = "sieverag.training.cli.train"
_EVAL_FILTER = "sieverag.training.cli.eval_filter"
_FILTERS = "sieverag.training.cli.filter"
_SERVING = "sieverag.serving.cli"

# Command name (two words for a group's command) → what runs it, in the order --help shows.
COMMANDS: dict[str, Command] = {
    "eval": _command(_INFERENCE, "EvalCommand", "run_eval",
                     "run pipelines on a QA dataset and score them"),
    "ask": _command(_INFERENCE, "AskCommand", "run_ask",
                    "answer one question over an index, with its evidence"),
    "demo": _command(_INFERENCE, "DemoCommand", "run_demo",
                     "compare direct, vanilla, main-rag and amber (trained filter) on the "
                     "built-in demo set"),
    "trace": _command(_INFERENCE, "TraceCommand", "run_trace",
                      "show one question's saved result and amber trace"),
    "report": _command(_INFERENCE, "ReportCommand", "run_report",
                       "the papers' tables across runs: a row per pipeline, a column per "
                       "dataset; --html: each run's report.html"),
    "export": _command(_INFERENCE, "ExportCommand", "run_export",
                       "a run's records as RAGAS-style jsonl: question, contexts read, "
                       "response, reference"),
    "judge-sweep": _command(_INFERENCE, "JudgeSweepCommand", "run_judge_sweep",
                            "MAIN-RAG's n·σ ablation: re-answer a run's questions at other "
                            "judge bars, from its stored scores"),
    "index build": _command(_RETRIEVAL, "IndexBuildCommand", "run_index_build",
                            "chunk a corpus and index it (BM25 and/or dense)"),
    "index search": _command(_RETRIEVAL, "IndexSearchCommand", "run_index_search",
                             "print the top-k chunks of an index for a query"),
    "index import": _command(_RETRIEVAL, "IndexImportCommand", "run_index_import",
                             "an index folder over a prebuilt FAISS index and its corpus "
                             "(FlashRAG's wiki-18, DPR's psgs_w100), without re-embedding"),
    "index convert": _command(_RETRIEVAL, "IndexConvertCommand", "run_index_convert",
                              "bring an index folder of an older format up to date in place"),
    "index serve": Command("sieverag.serving.retrieval.config:RetrievalServerConfig",
                           f"{_SERVING}:run_index_serve",
                           "serve an index over HTTP (Search-R1's /retrieve and every mode) "
                           "for other processes and machines"),
    "eval-retrieval": _command(_RETRIEVAL, "EvalRetrievalCommand", "run_eval_retrieval",
                               "recall@k and MRR of retrieval modes on a benchmark"),
    "hard-negatives": _command(_DATA_GEN, "HardNegativesCommand", "run_hard_negatives",
                               "a question set with retrieved hard negatives (or snippets)"),
    "label": _command(_DATA_GEN, "LabelCommand", "run_label",
                      "label chunks and sentences with STRINC, CXMI and a teacher"),
    "build-dataset": _command(_DATA_GEN, "BuildDatasetCommand", "run_build_dataset",
                              "turn label folders into the multi-task filter dataset"),
    "train": _command(_TRAIN, "TrainCommand", "run_train",
                      "LoRA-train the filter under `accelerate launch` (recipe by name)"),
    "eval-filter": _command(_EVAL_FILTER, "EvalFilterCommand", "run_eval_filter",
                            "score a trained filter against gold passages and baselines"),
    "filter list": _command(_FILTERS, "FilterListCommand", "run_list",
                            "show the filters found by name, and where"),
    "filter install": _command(_FILTERS, "FilterInstallCommand", "run_install",
                               "copy an adapter into the cache under a name (checked first)"),
    "filter package": _command(_FILTERS, "FilterPackageCommand", "run_package",
                               "turn a training run into a shippable bf16 adapter with a card"),
    "filter fit-combination": _command(
        _FILTERS, "FitCombinationCommand", "run_fit_combination",
        "fit MCF's combination of the filter with BM25 and dense into the card"),
    "serve": _command(_SERVING, "ServeCommand", "run_serve",
                      "serve a model and LoRA adapters over an OpenAI-compatible API"),
}

GROUPS = {"index": "build, search or serve a retrieval index",
          "filter": "list, install, package trained filters, or fit their combination"}


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _listing(prefix: str = "") -> str:
    names: list[tuple[str, str]] = []
    for name, command in COMMANDS.items():
        if prefix:
            if name.startswith(prefix + " "):
                names.append((name.removeprefix(prefix + " "), command.help))
            continue
        group = name.split(" ")[0]
        if " " not in name:
            names.append((name, command.help))
        elif group not in {n for n, _ in names}:
            names.append((group, GROUPS[group]))
    width = max(len(n) for n, _ in names) + 2
    return "\n".join(
        textwrap.fill(help_text, width=100, initial_indent=f"  {n:<{width}}",
                      subsequent_indent=" " * (width + 2)) for n, help_text in names)


def _usage(prefix: str = "") -> str:
    prog = f"sieverag {prefix}".strip()
    head = (f"usage: {prog} COMMAND [--config FILE] [--preset NAME] [flags]\n\n"
            "Filter what a RAG generator reads: evaluate pipelines, label data, train and "
            "serve the filter.\n\n")
    return (head + "commands:\n" + _listing(prefix) + f"\n\n`{prog} COMMAND --help` shows a "
            "command's flags; nested settings are dotted flags (--amber.collector.max-queries "
            "3).")


def main(argv: Sequence[str] | None = None) -> int:
    """Run `sieverag ARGV`; returns the exit code."""
    from sieverag import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"sieverag {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in GROUPS:
        if not rest or rest[0] in ("-h", "--help") or f"{name} {rest[0]}" not in COMMANDS:
            print(_usage(name), file=sys.stderr if rest and rest[0] not in ("-h", "--help")
                  else sys.stdout)
            return 0 if rest and rest[0] in ("-h", "--help") else 2
        name, rest = f"{name} {rest[0]}", rest[1:]
    if name not in COMMANDS:
        print(f"sieverag: error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from sieverag.inference.core.errors import SieveragError
    from sieverag.inference.core.settings import parse_settings

    command = COMMANDS[name]
    try:
        settings = parse_settings(_load(command.settings), rest, f"sieverag {name}")
        return _load(command.run)(settings)
    except SieveragError as err:
        print(f"sieverag: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sieverag: interrupted; finished results are saved, rerun the same command to "
              "resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
