"""The top of a run's HTML report (`html_report`), built as escaped HTML: the run's
configuration and provenance, what ranked and why, the comparison, trust and usage tables,
the plots, and the empty frame the page's script fills with the questions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sieverag.inference.core.html import svg
from sieverag.inference.core.html.page import definition_list, escape, table
from sieverag.inference.eval.report import GRADER_COLUMNS, TABLE_COLUMNS, TRUST_COLUMNS

# The card's fields worth a line at the top (the whole card is in the config shown below).
CARD_FIELDS = ("name", "trained_as", "base_model", "base_model_hub_name", "format")


def figures_table(summaries: Mapping[str, Mapping[str, Any]],
                  columns: Sequence[tuple[str, str]], caption: str) -> str:
    """A sortable table, a row per pipeline, the columns some pipeline has a figure for."""
    shown = [(k, t) for k, t in columns if any(s.get(k) is not None for s in summaries.values())]
    if not shown:
        return ""
    rows = [[name, s.get("examples"), *(s.get(k) for k, _ in shown)]
            for name, s in summaries.items()]
    return table(["pipeline", "n", *(t for _, t in shown)], rows, caption=caption)


def usage_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """LLM use per question by pipeline and agent: calls, tokens, seconds."""
    rows = [[name, agent, u.get("calls"), u.get("prompt_tokens"), u.get("completion_tokens"),
             u.get("seconds")]
            for name, s in summaries.items()
            for agent, u in (s.get("usage_per_question") or {}).items()]
    if not rows:
        return ""
    return table(["pipeline", "agent", "calls/q", "prompt tokens/q", "completion tokens/q",
                  "LLM s/q"], rows, caption="LLM use per question, by agent", numeric_from=2)


def models_section(config: Mapping[str, Any]) -> str:
    """The models by role: model, adapter, endpoint."""
    models = config.get("models") or {}
    rows = [[role, spec.get("model"), spec.get("adapter"), spec.get("endpoint")]
            for role, spec in models.items() if isinstance(spec, dict)]
    return table(["role", "model", "adapter", "endpoint"], rows, sortable=False,
                 caption="Models", numeric_from=99)


def provenance_section(config: Mapping[str, Any]) -> str:
    """The filter's card (its main fields, then the whole card), what ranked and why, and the
    versions and fingerprints the run recorded."""
    provenance = config.get("provenance") or {}
    card = provenance.get("filter_adapter")
    ranking = provenance.get("ranking")
    parts = ["<h3>What ranked, and why</h3>",
             f"<p class=ranking>{escape(ranking)}</p>" if ranking else
             "<p class=muted>Not recorded: the run's config.yaml has no "
             "<code>provenance.ranking</code> (a run made before it was recorded, or one whose "
             "pipelines call no trained filter).</p>"]
    if isinstance(card, dict):
        parts += ["<h3>The filter's card</h3>",
                  definition_list((k, card.get(k)) for k in CARD_FIELDS),
                  "<p class=muted>The whole card is in the config below "
                  "(<code>provenance.filter_adapter</code>).</p>"]
    else:
        parts.append("<p class=muted>No filter card: no pipeline of this run read a trained "
                     "filter's card.</p>")
    versions = provenance.get("versions") or {}
    parts.append(definition_list([
        ("dataset sha256", provenance.get("dataset_sha256")),
        ("question ids sha256", provenance.get("question_ids_sha256")),
        *((f"{package} version", version) for package, version in versions.items())]))
    return "".join(parts)


def plots(summaries: Mapping[str, Mapping[str, Any]],
          records: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Answer quality by pipeline, quality against cost, and for each pipeline whose records
    hold gold-marked scores, the scores of gold and other passages with its mean bar."""
    charts = [svg.grouped_bars("Answers by pipeline", summaries, ("accuracy", "f1", "em")),
              svg.scatter("Accuracy against the generator's input",
                          {n: (s["generator_input_tokens_per_question"], s["accuracy"])
                           for n, s in summaries.items()
                           if s.get("generator_input_tokens_per_question") is not None
                           and s.get("accuracy") is not None},
                          "generator input tokens per question", "accuracy"),
              svg.scatter("Accuracy against time",
                          {n: (s["seconds_per_question"], s["accuracy"])
                           for n, s in summaries.items()
                           if s.get("seconds_per_question") is not None
                           and s.get("accuracy") is not None},
                          "seconds per question", "accuracy")]
    for name, rs in records.items():
        # Generated verdicts (a judge's kept/dropped written as 1/0) are no score.
        scored = [e for r in rs for e in (r.get("filter") or {}).get("scores") or ()
                  if e.get("verdict") is None and e.get("is_gold") is not None]
        gold = [e["score"] for e in scored if e["is_gold"]]
        other = [e["score"] for e in scored if not e["is_gold"]]
        bars = [r["filter"]["threshold"] for r in rs
                if (r.get("filter") or {}).get("threshold") is not None]
        if gold and other:
            mean_bar = sum(bars) / len(bars) if bars else None
            charts.append(svg.histograms(
                f"{name}: scores of the passages it scored", {"gold": gold, "other": other},
                "the filter's or judge's score", marker=mean_bar,
                marker_label="" if mean_bar is None else f"mean bar {mean_bar:.2f}"))
    return '<div class="charts">' + "".join(c for c in charts if c) + "</div>"


def run_header(path: Path, config: Mapping[str, Any], summaries: Mapping[str, Mapping[str, Any]],
               records: Mapping[str, Sequence[Mapping[str, Any]]], notes: Sequence[str]) -> str:
    """The page's body: the run at the top, then the questions' frame (`html_report.js`)."""
    questions = len({r["id"] for rs in records.values() for r in rs})
    retrieval = config.get("retrieval") or {}
    parts = [
        f"<h1>sieverag run <code>{escape(path.name)}</code></h1>",
        "<p>" + escape(f"{questions} question(s) of {config.get('dataset')}; pipelines: "
                       f"{', '.join(records)}")
        + (escape(f"; retrieval from {retrieval.get('index')} ({retrieval.get('mode')}, "
                  f"k={retrieval.get('k')})") if isinstance(retrieval, dict) and retrieval
           else "") + f". Folder: <code>{escape(path)}</code></p>",
        *(f'<p class="note chip bad">{escape(note)}</p>' for note in notes),
        "<h2>Configuration and provenance</h2>", models_section(config),
        provenance_section(config),
        "<details><summary>the whole config.yaml</summary><pre class=mono>"
        f"{escape(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))}</pre></details>",
        "<h2>Comparison</h2>",
        figures_table(summaries, TABLE_COLUMNS, "Answers, reading and cost (click a heading "
                                                "to sort)"),
        figures_table(summaries, TRUST_COLUMNS, "Trust-aware metrics (↓ lower is better; "
                                                "(ours): sieverag's own)"),
        figures_table(summaries, GRADER_COLUMNS, "LLM grader (1-5; ↓ lower is better)")
        if any(s.get("grader_overall") is not None for s in summaries.values()) else "",
        usage_table(summaries),
        "<h2>Plots</h2>", plots(summaries, records),
        '<h2 id="questions-heading">Questions</h2>',
        '<div class="controls" id="controls"></div><div id="questions"></div>',
    ]
    return "".join(parts)
