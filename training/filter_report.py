"""The `eval-filter` report: report.json, report.md, pr_curve.png and per-question decisions."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sieverag.inference.io_utils import write_atomic
from sieverag.inference.types import Example
from sieverag.training.filter_methods import ChunkDecisions

CHUNK_COLUMNS = (("precision", "P"), ("recall", "R"), ("f1", "F1"), ("auroc", "AUROC"),
                 ("average_precision", "AP"), ("kept_per_question", "kept/q"))
SENTENCE_COLUMNS = (("precision", "P"), ("recall", "R"), ("f1", "F1"),
                    ("kept_per_question", "kept/q"))
PLOT_FILE = "pr_curve.png"


def write_report(report: Mapping[str, Any], decisions: Sequence[ChunkDecisions],
                 examples: Sequence[Example], out: Path) -> None:
    """Write the JSON report, the Markdown report, the plot and decisions.jsonl into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    plotted = plot_precision_recall(decisions, examples, report["chunk"], out / PLOT_FILE)
    full = {**report, "figures": {"precision_recall": PLOT_FILE if plotted else None}}
    write_atomic(out / "report.json", json.dumps(full, indent=2, default=str) + "\n")
    write_atomic(out / "report.md", markdown_report(full))
    lines = []
    for example in examples:
        lines.append(json.dumps({
            "id": example.id,
            "gold": [d.id for d in example.documents if d.is_gold],
            "kept": {d.method: list(d.kept[example.id]) for d in decisions},
            "scores": {d.method: [d.scores[doc.id] for doc in example.documents]
                       for d in decisions if d.scores is not None},
        }))
    write_atomic(out / "decisions.jsonl", "\n".join(lines) + "\n")


def table(rows: Mapping[str, Mapping[str, float | None]],
          columns: Sequence[tuple[str, str]]) -> str:
    """A Markdown table: one row per method, the given columns (– where undefined)."""
    lines = ["| method | " + " | ".join(title for _, title in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for method, figures in rows.items():
        cells = ["–" if figures.get(key) is None else f"{figures[key]:.3f}"
                 for key, _ in columns]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(report: Mapping[str, Any]) -> str:
    """The human-readable report."""
    questions = report["questions"]
    passages = report["passages"]
    flt = report["filter"]
    lines = [
        "# Filter evaluation",
        "",
        f"Filter: {flt['name'] or flt['served_as'] or flt['adapter']} on {flt['base_model']} "
        f"(keep when P(Yes) > {flt['threshold']}).",
        f"Dataset: {report['config']['dataset']} — {questions['evaluated']} questions "
        f"evaluated of {questions['rows_in_dataset']} rows; {questions['excluded_as_training']} "
        "left out as training questions"
        + (f" (from {', '.join(questions['training_datasets'])})"
           if questions["training_datasets"] else "")
        + f"; {passages['total']} passages, {passages['gold']} gold.",
        "",
        "## Chunk level (against gold passages)",
        "",
        "P / R / F1: per question, averaged over questions. AUROC / AP: the method's score over "
        "all passages.",
        "",
        table(report["chunk"], CHUNK_COLUMNS),
        "",
    ]
    for rule, comparison in report["comparison"].items():
        lines.append(f"- {rule}: F1 minus " + ", ".join(
            f"{name.removeprefix('f1_minus_')} {value:+.3f}"
            for name, value in comparison.items() if value is not None) + ".")
    lines.append("")
    if report["sentence"]:
        parse = report["sentence_answers"]
        lines += [
            "## Sentence level (against supporting facts)",
            "",
            f"{questions['with_supporting_facts']} questions with supporting facts. Baselines "
            "keep whole passages (every sentence); the oracle rows start from the gold "
            f"passages. Sentence answers: {parse['answers']}, unparsed {parse['unparsed']} "
            "(an unparsed answer keeps its whole passage).",
            "",
            table(report["sentence"], SENTENCE_COLUMNS),
            "",
        ]
    else:
        lines += ["No evaluated question carries supporting facts: no sentence-level rows.", ""]
    if report["figures"]["precision_recall"]:
        lines += [f"![precision–recall, chunk level]({report['figures']['precision_recall']})",
                  ""]
    if report.get("command"):
        lines += ["Command:", "", "```", report["command"], "```", ""]
    return "\n".join(lines)


def plot_precision_recall(decisions: Sequence[ChunkDecisions], examples: Sequence[Example],
                          chunk: Mapping[str, Mapping[str, float | None]], path: Path) -> bool:
    """Chunk-level precision–recall curves of the scored methods, and each method's operating
    point (micro precision and recall of its keep decisions). False when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve

    labels = [bool(d.is_gold) for e in examples for d in e.documents]
    if all(labels) or not any(labels):
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    plotted: dict[int, str] = {}  # one curve per score table (the filter's rules share one)
    for index, decision in enumerate(decisions):
        color = plotted.get(id(decision.scores), f"C{index}")
        if decision.scores is not None and id(decision.scores) not in plotted:
            plotted[id(decision.scores)] = color
            values = [decision.scores[d.id] for e in examples for d in e.documents]
            precision, recall, _ = precision_recall_curve(labels, values)
            ax.plot(recall, precision, color=color, label=decision.method)
        figures = chunk[decision.method]
        ax.plot(figures["micro_recall"], figures["micro_precision"], "o", color=color,
                label=None if decision.scores is not None else decision.method)
        if decision.scores is not None:
            ax.annotate(decision.method, (figures["micro_recall"], figures["micro_precision"]),
                        fontsize="x-small", xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("recall (gold passages)")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title("Chunk level: curves by score, dots at each method's decisions")
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, path)  # readers never see a half-written image
    return True
