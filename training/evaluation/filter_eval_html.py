"""`eval-filter`'s HTML page, OUT/report.html: one self-contained file (`inference.html.page`)
holding the per-source table, each dataset's chunk table, the calibration plot of every row
with a P(relevant), and every question's passages ranked by each selector with gold marked.

Its one-click question, "where did the default lose to dense top-k?": a button shows the
questions where the default MCF row's F1 is below dense top-k's (any two rows can be compared
the same way). A question's F1 for a row is that of its kept passage ids against the gold ones,
as the chunk table's macro F1 averages it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sieverag.inference.core.html import svg
from sieverag.inference.core.html.page import asset, escape, table, write_page
from sieverag.training.evaluation.filter_report import (
    CHUNK_COLUMNS,
    SUMMARY_COLUMNS,
    DatasetDecisions,
)

REPORT_FILE = "report.html"
SCRIPT = "filter_eval.js"
CALIBRATION_BINS = 10


def question_f1(kept: Sequence[str], gold: set[str]) -> float | None:
    """F1 of the kept passage ids against the gold ones; None without gold."""
    if not gold:
        return None
    hits = len(set(kept) & gold)
    if not hits:
        return 0.0
    precision, recall = hits / len(kept), hits / len(gold)
    return round(2 * precision * recall / (precision + recall), 4)


def calibration_curves(datasets: Sequence[DatasetDecisions]
                       ) -> dict[str, list[tuple[float, float, int]]]:
    """Per row with a P(relevant): (mean P, share gold, passages) per bin of P, pooled over
    the datasets."""
    pooled: dict[str, list[tuple[float, bool]]] = {}
    for dataset in datasets:
        gold = {d.id: bool(d.is_gold) for e in dataset.examples for d in e.documents}
        for decision in dataset.decisions:
            if decision.probabilities:
                pooled.setdefault(decision.method, []).extend(
                    (p, gold[i]) for i, p in decision.probabilities.items() if i in gold)
    curves = {}
    for method, pairs in pooled.items():
        bins: list[list[tuple[float, bool]]] = [[] for _ in range(CALIBRATION_BINS)]
        for p, is_gold in pairs:
            bins[min(int(p * CALIBRATION_BINS), CALIBRATION_BINS - 1)].append((p, is_gold))
        curves[method] = [(sum(p for p, _ in b) / len(b), sum(g for _, g in b) / len(b), len(b))
                          for b in bins if b]
    return curves


def page_data(report: Mapping[str, Any], datasets: Sequence[DatasetDecisions]) -> dict:
    """The embedded JSON: the rows, the default and dense rows, and every question with its
    passages and each row's kept ids, scores and F1."""
    top_k = (report.get("config") or {}).get("top_k")
    methods = list(dict.fromkeys(d.method for ds in datasets for d in ds.decisions))
    questions = []
    for dataset in datasets:
        for example in dataset.examples:
            gold = {d.id for d in example.documents if d.is_gold}
            rows = {}
            for decision in dataset.decisions:
                kept = list(decision.kept.get(example.id, ()))
                scores = ({d.id: round(decision.scores[d.id], 4) for d in example.documents
                           if d.id in decision.scores} if decision.scores else None)
                rows[decision.method] = {"kept": kept, "scores": scores,
                                         "f1": question_f1(kept, gold)}
            questions.append({"dataset": dataset.name, "id": example.id,
                              "question": example.question, "answers": list(example.answers),
                              "gold": sorted(gold),
                              "docs": [[d.id, d.title or "", d.text] for d in example.documents],
                              "rows": rows})
    return {"methods": methods, "default": (report.get("filter") or {}).get("amber_default_row"),
            "dense": f"dense top-{top_k}" if top_k else None, "questions": questions,
            "datasets": [d.name for d in datasets], "page_size": 20}


def page_body(report: Mapping[str, Any], datasets: Sequence[DatasetDecisions]) -> str:
    """The tables and the plot at the top, then the questions' frame (`filter_eval.js`)."""
    flt = report.get("filter") or {}
    name = flt.get("name") or flt.get("served_as") or flt.get("adapter")
    by_dataset = report.get("by_dataset") or {}
    parts = [f"<h1>Filter evaluation: <code>{escape(name)}</code></h1>",
             f"<p>{escape(flt.get('ranking') or '')}</p>",
             "<h2>By source</h2>",
             table(["dataset", *(t for _, t in SUMMARY_COLUMNS)],
                   [[n, *(_shown(s.get(k)) for k, _ in SUMMARY_COLUMNS)]
                    for n, s in by_dataset.items()], caption="Per source (click a heading "
                                                             "to sort)")]
    for dataset_name, section in (report.get("datasets") or {}).items():
        chunk = section.get("chunk") or {}
        parts.append(table(["method", *(t for _, t in CHUNK_COLUMNS)],
                           [[m, *(f.get(k) for k, _ in CHUNK_COLUMNS)] for m, f in chunk.items()],
                           caption=f"{dataset_name}: chunk level, against gold passages"))
    curves = calibration_curves(datasets)
    if curves:
        parts += ["<h2>Calibration</h2>", '<div class="charts">',
                  svg.reliability("P(relevant) against the share of gold passages", curves),
                  "</div>"]
    parts += ["<h2>Questions</h2>", '<div class="controls" id="controls"></div>',
              '<div id="questions"></div>']
    return "".join(parts)


def _shown(value: Any) -> Any:
    if isinstance(value, list):  # an interval
        return "[" + ", ".join(f"{v:+.3f}" for v in value) + "]"
    return value


def write_filter_eval_html(report: Mapping[str, Any], datasets: Sequence[DatasetDecisions],
                           out: Path) -> Path:
    """Write OUT/report.html and return its path."""
    return write_page(out / REPORT_FILE, "sieverag eval-filter", page_body(report, datasets),
                      page_data(report, datasets), asset(SCRIPT, Path(__file__).parent))
