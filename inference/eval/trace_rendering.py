"""Readable rendering of one saved example (a line of RUN_DIR/results/<pipeline>.jsonl):
answer and metrics, its trace shown by the renderer its pipeline declares
(`register_pipeline(render_trace=...)`: amber's rounds, auto's route, ...) or else the
documents read and the filter's scores, then the usage by agent."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import parse_json, validated_record
from sieverag.inference.eval.result_records import EvalRecord, read_trace
from sieverag.inference.pipelines.pipeline_registry import declared_traces
from sieverag.inference.pipelines.traces import (
    OpenTrace,
    PipelineTrace,
    TraceDeclaration,
    scored_document_lines,
    wrap,
)

SNIPPET = 240  # characters of an open trace's value shown


def find_record(run_dir: str | Path, question_id: str, pipeline: str) -> EvalRecord:
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


def _declarations(trace: PipelineTrace) -> list[TraceDeclaration]:
    """The declared traces `trace` is an instance of, each model once, those sitting beside an
    inner trace first (shown before it)."""
    found = {d.model: d for d in declared_traces() if isinstance(trace, d.model)}
    return sorted(found.values(), key=lambda d: not d.beside_inner)


def _open_lines(trace: PipelineTrace) -> list[str]:
    """The keys of a trace no declared model has, a line each (JSON, shortened)."""
    if not isinstance(trace, OpenTrace):
        return []
    return [line for key, value in (trace.model_extra or {}).items()
            for line in wrap(f"{key}: ", textwrap.shorten(json.dumps(value), SNIPPET))]


def render_trace(trace: PipelineTrace | Mapping[str, Any]) -> str:
    """A pipeline's trace (a pipeline output's JSON trace is read first, `read_trace`) as
    text: each declared part by its pipeline's renderer, then any keys no declared model
    has."""
    trace = read_trace(trace)
    return "\n".join([*(d.render(trace) for d in _declarations(trace)), *_open_lines(trace)])


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
    declared = _declarations(record.trace) if record.trace is not None else []
    # A trace beside an inner one (a router's decision) heads the record; the main trace's
    # renderer shows what was read, else the documents read and the filter's scores do.
    lines += [d.render(record.trace) for d in declared if d.beside_inner]
    if record.hygiene_removed:
        lines += wrap("Evidence hygiene removed: ", "; ".join(
            f"{removal.id} ({removal.reason})" for removal in record.hygiene_removed), indent=0)
    main = [d for d in declared if not d.beside_inner]
    if main:
        lines += [d.render(record.trace) for d in main]
    else:
        lines += ["", f"Documents read: {', '.join(record.documents_read) or '(none)'}"]
        if record.filter is not None:
            rule = record.filter.rule
            lines.append(f"Filter scores (bar {record.filter.threshold}"
                         + (f", {rule}: {record.filter.rule_reason}" if rule else "") + "):")
            for scored in record.filter.scores:
                lines += scored_document_lines(scored, indent=2)
        if record.trace is not None and _open_lines(record.trace):
            lines += ["Trace:", *_open_lines(record.trace)]
    if record.usage:
        lines += ["", f"  {'agent':<22}{'calls':>6}{'prompt tokens':>15}{'completion':>12}"
                      f"{'seconds':>10}"]
        lines += [f"  {agent:<22}{u.calls:>6}{u.prompt_tokens:>15}{u.completion_tokens:>12}"
                  f"{u.seconds:>10.2f}" for agent, u in record.usage.items()]
    return "\n".join(lines)
