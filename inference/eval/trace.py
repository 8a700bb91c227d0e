"""Readable rendering of one saved example (a line of RUN_DIR/results/<pipeline>.jsonl):
answer and metrics, and for `amber` every round of its trace — query, documents with scores
and key sentences, the three memory agents, the memory, the sufficiency verdict, the next
query — then the evidence the generator read and the usage by agent."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sieverag.inference.errors import ConfigError
from sieverag.inference.eval.records import EvalRecord
from sieverag.inference.filters.base import ScoredDocumentRecord
from sieverag.inference.io_utils import parse_json, validated_record
from sieverag.inference.pipelines.amber.trace import AmberRound, AmberTrace

WIDTH = 100
SNIPPET = 240


def find_record(run_dir: str | Path, question_id: str, pipeline: str = "amber") -> EvalRecord:
    """The record of `question_id` in RUN_DIR/results/<pipeline>.jsonl."""
    results = Path(run_dir) / "results"
    path = results / f"{pipeline}.jsonl"
    if not path.is_file():
        known = sorted(p.stem for p in results.glob("*.jsonl"))
        hint = (f"pick one with --pipeline: {', '.join(known)}" if known
                else "is it a run folder written by `sieverag eval`?")
        raise ConfigError(f"{path} not found; {hint}")
    ids = []
    # Bytes, line by line, as JsonlLog reads: a line that is not UTF-8 or not JSON Python can
    # read is named, and the file is only read (an eval may still be appending to it).
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            data = parse_json(line, f"{path}, line {number}", "fix or remove that line")
            record = validated_record(EvalRecord, data, path, number)
            if record.id == question_id:
                return record
            ids.append(record.id)
    shown = ", ".join(ids[:5]) + (" …" if len(ids) > 5 else "")
    raise ConfigError(f"no question {question_id!r} in {path} ({len(ids)} records: {shown})")


def _wrap(label: str, text: str, indent: int = 2) -> list[str]:
    prefix = " " * indent + label
    body = " ".join(str(text).split()) or "(empty)"
    return textwrap.wrap(body, WIDTH, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix)) or [prefix]


def _document_lines(entry: ScoredDocumentRecord, indent: int = 4) -> list[str]:
    mark = "✓" if entry.kept else "✗"
    gold = " [gold]" if entry.is_gold else ""
    title = f"{entry.title} " if entry.title else ""
    line = f"{' ' * indent}{mark} {entry.score:+7.3f}  {title}({entry.id}){gold}"
    extras = []
    if entry.p_yes is not None:
        extras.append(f"P(Yes) {entry.p_yes:.2f}")
    if entry.bm25 is not None:  # a score fused with the lexical prior: show both parts
        # s is None where the filter was not called (MCF's `reads_filter`)
        filter_part = ("" if entry.filter_score is None
                       else f"filter s {entry.filter_score:+.2f} · ")
        extras.append(f"{filter_part}BM25 {entry.bm25:.2f}")
    if entry.p_yes is None and entry.p_relevant is not None:
        extras.append(f"P(relevant) {entry.p_relevant:.2f}")
    if entry.mcf_score is not None:
        extras.append(f"mcf {entry.mcf_score:+.2f}{'✓' if entry.mcf_kept else '✗'}")
    if entry.judge_score is not None:
        extras.append(f"judge {entry.judge_score:+.2f}{'✓' if entry.judge_kept else '✗'}")
    if entry.predicted_answer is not None:
        extras.append(f"predicted {entry.predicted_answer!r}")
    if entry.verdict is not None:
        extras.append(f"verdict {entry.verdict!r}")
    if entry.kept and entry.sentence_status is not None:
        numbers = ", ".join(str(i + 1) for i in entry.key_sentences or []) or "none"
        extras.append(f"sentences {numbers} ({entry.sentence_status})")
    lines = [line]
    if extras:
        lines.append(" " * (indent + 11) + " · ".join(extras))
    return lines


def _round_lines(entry: AmberRound) -> list[str]:
    bar = entry.threshold
    lines = [f"Round {entry.round} — query: {entry.query!r}",
             f"  retrieved {len(entry.retrieved)} new document(s), skipped "
             f"{entry.skipped_seen} seen; bar {'–' if bar is None else f'{bar:+.3f}'}"]
    if entry.rule:
        lines += _wrap("Bar rule:   ", f"{entry.rule} — {entry.rule_reason or ''}")
    for scored in entry.scored:
        lines += _document_lines(scored)
    branch = entry.branch
    if branch is not None:
        lines += _wrap("Branch:     ", f"{branch.branch} — {branch.reason}")
    update = entry.memory_update
    if update is None:
        lines.append("  memory agents: not run (" + (
            "the kept evidence is strong enough to answer" if branch is not None
            and branch.branch == "answer" else
            "the answer reads the evidence, not the memory" if entry.kept
            else "nothing new kept") + ")")
    else:
        lines += _wrap("Reviewer:   ", update.reviewer)
        lines += _wrap("Challenger: ", update.challenger)
        lines += _wrap("Refiner:    ", update.refiner
                       + (" [cut to the memory cap]" if update.truncated else ""))
    lines += _wrap("Memory:     ", entry.memory)
    verdict = entry.sufficiency
    if verdict is not None:
        lines.append(f"  Sufficient? P(Yes) = {verdict.p_yes:.2f} → "
                     f"{'yes' if verdict.sufficient else 'no'}")
    following = entry.next_query
    if following is not None:
        if following.query is None:
            lines += _wrap("Next query: ", f"none new (writer said {following.written!r})")
        else:
            lines += _wrap("Next query: ", f"{following.query!r} ({following.source})")
        if following.candidates:
            lines += _wrap("Candidates: ", " · ".join(
                f"{c.name} P(Yes) {c.p_yes:.2f}" for c in following.candidates))
    return lines


def render_loop(trace: AmberTrace | Mapping[str, Any]) -> str:
    """An amber trace (a pipeline output's JSON trace is validated first): the stop reason,
    every round, and the evidence the generator read."""
    if not isinstance(trace, AmberTrace):
        trace = AmberTrace.model_validate(trace)
    lines = [f"Pipeline {trace.pipeline} (filter {trace.filter}): stopped "
             f"({trace.stop_reason}) after {len(trace.rounds)} round(s); "
             f"answer from {trace.answer_from}"]
    for entry in trace.rounds:
        lines += ["", *_round_lines(entry)]
    lines += ["", "Evidence the generator read:"]
    for number, item in enumerate(trace.evidence, start=1):
        lines += _wrap(f"[{number}] ", f"{item.title or item.id} (round {item.round}, "
                       f"{item.score:+.2f}): {textwrap.shorten(item.text, SNIPPET)}")
    if not trace.evidence:
        lines.append("  (none)")
    return "\n".join(lines)


def render_record(record: EvalRecord) -> str:
    """The record as readable text (see the module docstring)."""
    metrics = " · ".join(f"{k} {v:.2f}" for k, v in record.metrics.to_json().items())
    lines = [f"Question {record.id}: {record.question}",
             f"Gold: {' | '.join(record.answers) or '–'}",
             f"Prediction: {record.prediction!r} (raw reply: {record.raw_prediction!r})",
             f"Metrics: {metrics or '–'}",
             f"Cost: {record.llm_calls} LLM calls · {record.input_tokens} input tokens "
             f"({record.generator_input_tokens} to the generator) · {record.seconds:.1f} s"]
    if record.truncated_prompts:
        lines.append(f"Context: {record.truncated_prompts} prompt(s) cut to fit the model's "
                     f"context, {record.tokens_dropped} tokens dropped")
    if record.route is not None:
        lines.append(f"Router: {'retrieve' if record.route.retrieve else 'answer directly'} "
                     f"({record.route.reason})")
    if record.hygiene_removed:
        lines += _wrap("Evidence hygiene removed: ", "; ".join(
            f"{removal.id} ({removal.reason})" for removal in record.hygiene_removed), indent=0)
    if isinstance(record.trace, AmberTrace):
        lines.append(render_loop(record.trace))
    else:
        lines += ["", f"Documents read: {', '.join(record.documents_read) or '(none)'}"]
        if record.filter is not None:
            rule = record.filter.rule
            lines.append(f"Filter scores (bar {record.filter.threshold}"
                         + (f", {rule}: {record.filter.rule_reason}" if rule else "") + "):")
            for scored in record.filter.scores:
                lines += _document_lines(scored, indent=2)
    if record.usage:
        lines += ["", f"  {'agent':<22}{'calls':>6}{'prompt tokens':>15}{'completion':>12}"
                      f"{'seconds':>10}"]
        lines += [f"  {agent:<22}{u.calls:>6}{u.prompt_tokens:>15}{u.completion_tokens:>12}"
                  f"{u.seconds:>10.2f}" for agent, u in record.usage.items()]
    return "\n".join(lines)
