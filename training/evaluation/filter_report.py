"""The `eval-filter` report: report.json, report.md, pr_curve.png and per-question decisions
(its HTML page: `filter_eval_html`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sieverag.inference.core.io_utils import write_atomic
from sieverag.inference.core.types import Example
from sieverag.training.evaluation.filter_methods import ChunkDecisions

CHUNK_COLUMNS = (("precision", "P"), ("recall", "R"), ("f1", "F1"), ("auroc", "AUROC"),
                 ("average_precision", "AP"), ("ece", "ECE"),
                 ("calibrated_share", "P calibrated"), ("kept_per_question", "kept/q"))
SENTENCE_COLUMNS = (("precision", "P"), ("recall", "R"), ("f1", "F1"),
                    ("kept_per_question", "kept/q"))
PLOT_FILE = "pr_curve.png"


@dataclass(frozen=True)
class DatasetDecisions:
    """One evaluated dataset's per-question output: its section name in the report, each chunk
    row's decisions, its questions, and each sentence row's kept sentences."""

    name: str
    decisions: Sequence[ChunkDecisions]
    examples: Sequence[Example]
    sentence_kept: Mapping[str, Mapping[str, Iterable[tuple[str, int]]]] = \
        field(default_factory=dict)


def write_report(report: Mapping[str, Any], datasets: Sequence[DatasetDecisions],
                 out: Path) -> None:
    """Write the JSON report, the Markdown report, the plot (the first dataset's) and
    decisions.jsonl into `out`.

    decisions.jsonl: per question of every dataset, its dataset's name, each chunk row's kept
    passage ids and scores, and (for questions with supporting facts) each sentence row's kept
    [passage id, sentence index]."""
    out.mkdir(parents=True, exist_ok=True)
    first = datasets[0]
    plotted = plot_precision_recall(first.decisions, first.examples, report["chunk"],
                                    out / PLOT_FILE)
    full = {**report, "figures": {"precision_recall": PLOT_FILE if plotted else None}}
    write_atomic(out / "report.json", json.dumps(full, indent=2, default=str) + "\n")
    write_atomic(out / "report.md", markdown_report(full))
    lines = []
    for dataset in datasets:
        for example in dataset.examples:
            record = {
                "dataset": dataset.name,
                "id": example.id,
                "gold": [d.id for d in example.documents if d.is_gold],
                "kept": {d.method: list(d.kept[example.id]) for d in dataset.decisions},
                "scores": {d.method: [d.scores[doc.id] for doc in example.documents]
                           for d in dataset.decisions if d.scores is not None},
            }
            sentences = {row: sorted([list(pair) for pair in kept[example.id]])
                         for row, kept in dataset.sentence_kept.items()
                         if example.id in kept}
            if sentences:
                record["kept_sentences"] = sentences
            lines.append(json.dumps(record))
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


SUMMARY_COLUMNS = (("questions", "questions"), ("passages", "passages"),
                   ("filter_auroc", "filter alone AUROC"), ("bm25_auroc", "BM25 AUROC"),
                   ("dense_auroc", "dense AUROC"), ("default_auroc", "default AUROC"),
                   ("filter_top_k_f1", "filter alone top-k F1"),
                   ("bm25_top_k_f1", "BM25 top-k F1"), ("dense_top_k_f1", "dense top-k F1"),
                   ("default_top_k_f1", "default top-k F1"),
                   ("amber_default_f1", "default F1 (its bar)"),
                   ("default_minus_retrieval_f1", "default − better top-k F1"),
                   ("default_minus_retrieval_interval", "95 % interval"),
                   ("default_kept_per_question", "default kept/q"),
                   ("default_ece", "default ECE"),
                   ("default_calibrated_share", "default P calibrated"),
                   ("filter_ece", "filter alone ECE"),
                   ("fixed_bar_f1", "fixed bar F1"),
                   ("fixed_bar_kept_per_question", "fixed bar kept/q"),
                   ("sentence_stage_f1", "sentence stage F1"))


def summary_table(by_dataset: Mapping[str, Mapping[str, Any]]) -> str:
    """The cross-dataset table: one row per dataset (see `filter_eval.dataset_summary`)."""
    lines = ["| dataset | " + " | ".join(title for _, title in SUMMARY_COLUMNS) + " |",
             "|---|" + "---:|" * len(SUMMARY_COLUMNS)]
    for name, figures in by_dataset.items():
        cells = []
        for key, _ in SUMMARY_COLUMNS:
            value = figures.get(key)
            cells.append("–" if value is None else
                         str(value) if isinstance(value, int) else
                         "[" + ", ".join(f"{v:+.3f}" for v in value) + "]"
                         if isinstance(value, list) else f"{value:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(report: Mapping[str, Any]) -> str:
    """The human-readable report."""
    questions = report["questions"]
    passages = report["passages"]
    flt = report["filter"]
    default = flt.get("amber_default_row")
    lines = [
        "# Filter evaluation",
        "",
        f"Filter: {flt['name'] or flt['served_as'] or flt['adapter']} on {flt['base_model']}. "
        "Each MCF row runs amber's filter (`MultiGranularFilter`) with the config its name "
        "gives (s = log P(Yes) − log P(No))"
        + (f"; amber's default is {default}." if default else ".")
        + (f" Its default: {flt['ranking']}." if flt.get("ranking") else ""),
        f"Dataset: {report['dataset']} — {questions['evaluated']} questions "
        f"evaluated of {questions['rows_in_dataset']} rows; {questions['excluded_as_training']} "
        "left out as training questions"
        + (f" (from {', '.join(questions['training_datasets'])})"
           if questions["training_datasets"] else "")
        + f"; {passages['total']} passages, {passages['gold']} gold.",
        "",
        *(_by_dataset(report) if len(report.get("datasets") or {}) > 1 else []),
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
            f"{questions['with_supporting_facts']} questions with supporting facts. "
            "'(whole passages)' rows keep every sentence of the passages kept (what amber "
            "reads with the sentence stage off, its default); '→ sentence stage' rows run MCF "
            "with its sentence stage on; the oracle rows start from the gold passages. "
            f"Sentence answers: {parse['answers']}, unparsed {parse['unparsed']} (keeps its "
            f"whole passage), none {parse['none']}.",
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
    plotted: dict[tuple[float, ...], str] = {}  # one curve per score (MCF rows share some)
    for index, decision in enumerate(decisions):
        values = (tuple(decision.scores[d.id] for e in examples for d in e.documents)
                  if decision.scores is not None else ())
        color = plotted.get(values, f"C{index % 10}")
        if decision.scores is not None and values not in plotted:
            plotted[values] = color
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


def _by_dataset(report: Mapping[str, Any]) -> list[str]:
    """The cross-dataset table and each further dataset's chunk table."""
    lines = ["## By dataset", "",
             "Filter alone: its score s over all passages (AUROC; top-k F1; ECE of its "
             "P(Yes)). Priors alone: BM25 and dense on the same passages. Default: amber's "
             "default MCF rule, the combination of s with BM25 and dense from the filter's "
             "card (AUROC; F1 and passages kept at its own calibrated bar; ECE of its "
             "P(relevant) on the rounds it calls calibrated, and the share of passages on "
             "them: a round the card's shift guard finds unlike its fitting rounds gets a "
             "relevance score, not a probability; F1 of its top-k). F1 per question, "
             "averaged. Fixed bar: MCF keeps a passage when P(Yes) > P(No).", "",
             summary_table(report["by_dataset"]), ""]
    for name, section in list(report["datasets"].items())[1:]:
        questions = section["questions"]
        lines += [f"### {name} — {questions['evaluated']} questions "
                  f"({questions['excluded_as_training']} left out as training questions), "
                  f"{section['passages']['total']} passages, {section['passages']['gold']} gold",
                  "", table(section["chunk"], CHUNK_COLUMNS), ""]
    lines += [f"## The main dataset: {next(iter(report['datasets']))}", ""]
    return lines
