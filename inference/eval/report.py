"""The Markdown report of a run, with the judge score-distribution plot (MAIN-RAG style)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import parse_json, read_text, write_atomic
from sieverag.inference.eval.migration import migrate_summary
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.metrics.grader import GRADER_CRITERIA, LOWER_IS_BETTER
from sieverag.inference.pipelines.pipeline_registry import PIPELINES

TABLE_COLUMNS = (
    ("em", "EM"),
    ("f1", "F1"),
    ("accuracy", "Acc"),
    ("choice_accuracy", "MC acc"),
    ("str_em", "STR-EM"),
    ("str_hit", "STR-Hit"),
    ("rouge_l", "ROUGE-L"),
    ("read_precision", "Read P"),
    ("read_recall", "Read R"),
    ("read_f1", "Read F1"),
    ("read_all_gold", "All gold read"),
    ("documents_read_per_question", "Docs read"),
    ("generator_input_tokens_per_question", "Gen. in-tok/q"),
    ("input_tokens_per_question", "All in-tok/q"),
    ("llm_calls_per_question", "LLM calls/q"),
    ("truncated_rate", "Truncated"),
    ("seconds_per_question", "s/q"),
    ("retrieval_usage_rate", "Retrieval rate"),
)
# The papers' headline metrics: one table each, a row per pipeline, a column per dataset.
PAPER_METRICS = (
    ("accuracy", "Accuracy (the answer contains a gold answer)"),
    ("f1", "F1"),
    ("em", "EM"),
    ("choice_accuracy", "Multiple-choice accuracy"),
    ("str_em", "STR-EM (ASQA)"),
    ("str_hit", "STR-Hit (ASQA)"),
    ("rouge_l", "ROUGE-L (ASQA)"),
    ("generator_input_tokens_per_question", "Generator input tokens per question"),
    ("seconds_per_question", "Seconds per question"),
)
TRUST_COLUMNS = (
    ("retrieval_usage_rate", "Retrieval usage"),
    ("answer_quality", "AQS"),
    ("taas", "TAAS"),
    ("faithfulness", "Faithfulness"),
    ("hallucination_rate", "Hallucination ↓"),
    ("context_precision", "Ctx precision (tokens)"),
    ("evidence_noise", "Evidence noise ↓"),
    ("sentence_support_rate", "Sentence support (chunks)"),
    ("sentence_taas", "Sentence TAAS (ours)"),
    ("sentence_similarity", "Sentence similarity (ours)"),
    ("sentence_support_by_sentence", "Sentence support by sentence (ours)"),
    ("sentence_context_precision", "Sentence ctx precision (ours)"),
    ("sentence_evidence_noise", "Sentence evidence noise ↓ (ours)"),
    ("context_precision_gold", "Ctx P gold (ours)"),
)
GRADER_COLUMNS = tuple(
    (f"grader_{c}", c.replace("_", " ") + (" ↓" if c in LOWER_IS_BETTER else ""))
    for c in GRADER_CRITERIA) + (("grader_invalid", "invalid replies"),)
# Per-question Δ of these between a pipeline and the one it declares it compares with
# (`register_pipeline(compares_with=...)`; the study's routing against the model alone), per
# kind where the records have kinds.
DELTA_METRICS = (("taas", "TAAS"), ("answer_quality", "AQS"))


def _cell(value: object) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def comparison_table(summaries: Mapping[str, Mapping],
                     columns: Sequence[tuple[str, str]] = TABLE_COLUMNS) -> str:
    """A Markdown table, one row per pipeline, only the columns some pipeline has."""
    columns = [(k, title) for k, title in columns
               if any(s.get(k) is not None for s in summaries.values())]
    lines = [
        "| pipeline | n | " + " | ".join(t for _, t in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for name, summary in summaries.items():
        cells = [_cell(summary.get(k)) for k, _ in columns]
        lines.append(f"| {name} | {summary['examples']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_judge_scores(records: Sequence[EvalRecord], path: Path, title: str) -> bool:
    """Histogram of judge scores r for gold vs noisy documents with the mean bar τq.

    Returns False (and writes nothing) when the records hold no gold-marked filter scores
    (generated verdicts are not scores).
    """
    filters = [r.filter for r in records if r.filter is not None]
    # A generated verdict (main-rag-naive) is no score: its 1.0/0.0 entries are not plotted.
    scored = [s for f in filters for s in f.scores if s.verdict is None]
    gold = [s.score for s in scored if s.is_gold is True]
    noisy = [s.score for s in scored if s.is_gold is False]
    bars = [f.threshold for f in filters if f.threshold is not None]
    if not gold or not noisy:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bins = 30
    ax.hist(noisy, bins=bins, alpha=0.6, density=True, label=f"noisy documents (n={len(noisy)})")
    ax.hist(gold, bins=bins, alpha=0.6, density=True, label=f"relevant documents (n={len(gold)})")
    if bars:
        mean_bar = sum(bars) / len(bars)
        ax.axvline(mean_bar, color="black", linestyle="--", label=f"mean τq = {mean_bar:.2f}")
    ax.set_xlabel('judge score r = log P("Yes") − log P("No")')
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def trust_counts_line(summaries: Mapping[str, Mapping]) -> str:
    """How many answers each pipeline's grounding means cover (not applicable without
    retrieval, so left out)."""
    parts = []
    for name, summary in summaries.items():
        counts = summary.get("trust_counts")
        if counts:
            parts.append(f"{name}: {counts.get('faithfulness', 0)} of {summary['examples']}")
    return ("Grounding metrics (faithfulness, hallucination, sentence similarity and "
            "support, context precision, noise) are not applicable to answers given without "
            "retrieval; their means cover the answers that retrieved — "
            + "; ".join(parts) + ".") if parts else ""


def kind_tables(summaries: Mapping[str, Mapping]) -> list[str]:
    """The study's Table 5: per question kind, a row per pipeline."""
    kinds = list(dict.fromkeys(k for s in summaries.values() for k in s.get("by_kind", {})))
    if not kinds:
        return []
    parts = ["## By question kind\n"]
    for kind in kinds:
        rows = {name: {**s["by_kind"][kind]} for name, s in summaries.items()
                if kind in s.get("by_kind", {})}
        parts += [f"### {kind}\n", comparison_table(rows, (("accuracy", "Acc"),
                                                            *TRUST_COLUMNS)), ""]
    return parts


def _trust_value(record: EvalRecord, metric: str) -> float | None:
    return getattr(record.trust, metric) if record.trust is not None else None


def delta_table(records: Mapping[str, Sequence[EvalRecord]], pipeline: str,
                baseline: str) -> list[str]:
    """Per-question Δ(pipeline − baseline) of TAAS and AQS, overall and per kind: mean Δ and
    how many questions the pipeline wins, ties and loses. Empty unless both ran."""
    if pipeline not in records or baseline not in records:
        return []
    base = {r.id: r for r in records[baseline]}
    pairs = [(r, base[r.id]) for r in records[pipeline] if r.id in base]
    groups = {"all": pairs}
    for kind in dict.fromkeys(r.kind for r, _ in pairs if r.kind is not None):
        groups[kind] = [(a, b) for a, b in pairs if a.kind == kind]
    lines = [f"## Per-question Δ({pipeline} − {baseline})\n",
             "| questions | n | " + " | ".join(f"mean Δ {t} | {t} wins/ties/losses"
                                               for _, t in DELTA_METRICS) + " |",
             "|---|---|" + "---|---|" * len(DELTA_METRICS)]
    for group, members in groups.items():
        cells = []
        for metric, _ in DELTA_METRICS:
            deltas = [a - b for x, y in members
                      if (a := _trust_value(x, metric)) is not None
                      and (b := _trust_value(y, metric)) is not None]
            mean = sum(deltas) / len(deltas) if deltas else None
            cells += [_cell(round(mean, 4) if mean is not None else None),
                      f"{sum(d > 1e-9 for d in deltas)}/{sum(abs(d) <= 1e-9 for d in deltas)}/"
                      f"{sum(d < -1e-9 for d in deltas)}"]
        lines.append(f"| {group} | {len(members)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def delta_tables(records: Mapping[str, Sequence[EvalRecord]]) -> list[str]:
    """A `delta_table` for each pipeline of the run that declares one it compares with
    (`compares_with`) where both ran; a pipeline no longer registered declares none."""
    return [line for name in records
            if (entry := PIPELINES.get(name)) is not None and entry.compares_with is not None
            for line in delta_table(records, name, entry.compares_with)]


def usage_table(summary: Mapping) -> list[str]:
    """A pipeline's LLM usage per question by agent, the most seconds first: where its time
    goes (its `seconds_per_question` minus these is retrieval and bookkeeping). Summaries of
    runs from before agents were timed have no `seconds`: shown as 0."""
    usage = summary.get("usage_per_question", {})
    if not usage:
        return []
    total = summary.get("seconds_per_question") or 0.0
    lines = ["| agent | calls/q | prompt tokens/q | completion tokens/q | LLM s/q | share of s/q |",
             "|---|---:|---:|---:|---:|---:|"]
    for agent, u in sorted(usage.items(), key=lambda item: -item[1].get("seconds", 0)):
        seconds = u.get("seconds", 0)
        share = f"{seconds / total:.0%}" if total else "–"
        lines.append(f"| {agent} | {u['calls']} | {u['prompt_tokens']} | "
                     f"{u['completion_tokens']} | {seconds:.2f} | {share} |")
    return [*lines, ""]


def write_report(
    out_dir: Path,
    dataset: str,
    summaries: Mapping[str, Mapping],
    records: Mapping[str, Sequence[EvalRecord]],
) -> Path:
    """Write `report.md` (comparison table, per-pipeline usage, score plots)."""
    parts = [f"# sieverag evaluation\n\nDataset: `{dataset}`\n", comparison_table(summaries), "",
             "Trust-aware metrics (inference/metrics/trust.py: the Auto-RAG study's under its "
             "names, sieverag's own marked (ours); ↓ lower is better):\n",
             comparison_table(summaries, TRUST_COLUMNS), "", trust_counts_line(summaries), ""]
    if any(s.get("grader_overall") is not None or s.get("grader_invalid")
           for s in summaries.values()):
        parts += ["LLM grader (1-5; ↓ lower is better):\n",
                  comparison_table(summaries, GRADER_COLUMNS), ""]
    parts += kind_tables(summaries)
    parts += delta_tables(records)
    for name, summary in summaries.items():
        parts.append(f"## {name}\n")
        parts += usage_table(summary)
        plot = out_dir / f"judge_scores_{name}.png"
        if plot_judge_scores(records[name], plot, f"{name}: judge scores"):
            parts.append(f"![judge scores of {name}]({plot.name})\n")
    path = out_dir / "report.md"
    write_atomic(path, "\n".join(parts) + "\n")
    return path


def dataset_label(dataset: str) -> str:
    """A short column name for a run's dataset: an `hf:` name as written after the prefix,
    a file or folder by its name without extensions (a folder's `:SPLIT` kept)."""
    if dataset.startswith("hf:"):
        return dataset.removeprefix("hf:")
    name = Path(dataset).name
    stem, _, rest = name.partition(".")
    split = rest.rpartition(":")[2] if ":" in rest else ""
    return (f"{stem}:{split}" if split else stem) or dataset


def read_run_summary(run_dir: str | Path) -> tuple[str, dict[str, Mapping]]:
    """(dataset, {pipeline: summary}) of an `eval` run folder, from its summary.json (one
    written under the trust metrics' old names read under today's: `migrate_summary`)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise ConfigError(f"{path} not found: is {run_dir} a run folder written by "
                          "`sieverag eval` (and finished)?")
    data = parse_json(read_text(path, ConfigError), str(path), error=ConfigError)
    if (not isinstance(data, dict) or not isinstance(data.get("dataset"), str)
            or not isinstance(data.get("pipelines"), dict)
            or not all(isinstance(s, dict) for s in data["pipelines"].values())):
        raise ConfigError(f"{path}: not a run summary (expected {{dataset, pipelines}})")
    return data["dataset"], {name: migrate_summary(summary)
                             for name, summary in data["pipelines"].items()}


def collate_runs(run_dirs: Sequence[str | Path]) -> str:
    """The papers' tables over several runs (one dataset each): per metric, a row per
    pipeline and a column per dataset; then each run's full comparison table."""
    if not run_dirs:
        raise ConfigError("report needs at least one run folder (--runs DIR,DIR,...)")
    runs: dict[str, dict[str, Mapping]] = {}
    for run_dir in run_dirs:
        dataset, summaries = read_run_summary(run_dir)
        label = dataset_label(dataset)
        if label in runs:  # two runs of one dataset: tell them apart by their folders
            label = f"{label} ({Path(run_dir).name})"
        runs[label] = summaries
    pipelines = list(dict.fromkeys(name for summaries in runs.values() for name in summaries))
    parts = ["# sieverag evaluation across datasets\n"]
    for key, title in PAPER_METRICS:
        if not any(s.get(key) is not None for summaries in runs.values()
                   for s in summaries.values()):
            continue
        parts += [f"## {title}\n", "| pipeline | " + " | ".join(runs) + " |",
                  "|---|" + "---:|" * len(runs)]
        for name in pipelines:
            cells = [_cell(runs[label][name].get(key)) if name in runs[label] else "–"
                     for label in runs]
            parts.append(f"| {name} | " + " | ".join(cells) + " |")
        parts.append("")
    parts.append("## Per dataset\n")
    for label, summaries in runs.items():
        parts += [f"### {label}\n", comparison_table(summaries), ""]
    return "\n".join(parts)
