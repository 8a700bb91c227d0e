"""`sieverag export`: a run's records in the schema RAG-evaluation tools read (RAGAS's
single-turn sample), one JSON line per (pipeline, example):

    {"user_input": question, "retrieved_contexts": [text read, ...], "response": prediction,
     "reference": reference answer, "pipeline": name, "id": example id}

`retrieved_contexts` is the text of each document the generator read (the record's
`contexts`); `reference` is the dataset's reference answer where the example had one, else
its first gold answer (None without either).

No sieverag figure is exported: what RAGAS computes from these rows is RAGAS's own (its
context precision and faithfulness are LLM-judged), neither the Auto-RAG study's token-level
metrics of those names nor sieverag's `sentence_*` measures (docs/pipelines/trust-metrics.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import JsonlLog, write_atomic
from sieverag.inference.eval.result_records import EvalRecord


def export_row(pipeline: str, record: EvalRecord) -> dict[str, Any]:
    """The RAGAS-style row of one record (see the module docstring)."""
    return {"user_input": record.question, "retrieved_contexts": list(record.contexts),
            "response": record.prediction,
            "reference": record.reference or (record.answers[0] if record.answers else None),
            "pipeline": pipeline, "id": record.id}


def _pipeline_results(run_dir: Path, pipelines: Sequence[str] | None) -> dict[str, Path]:
    """results/<pipeline>.jsonl of each pipeline asked for (default: every one the run has)."""
    results = run_dir / "results"
    known = sorted(p.stem for p in results.glob("*.jsonl"))
    if not known:
        raise ConfigError(f"{results} holds no results: is {run_dir} a run folder written by "
                          "`sieverag eval`?")
    wanted = list(dict.fromkeys(pipelines)) if pipelines else known
    missing = [name for name in wanted if name not in known]
    if missing:
        raise ConfigError(f"the run in {run_dir} has no results for {', '.join(missing)} "
                          f"(it has: {', '.join(known)}); pick from those with --pipelines")
    return {name: results / f"{name}.jsonl" for name in wanted}


def export_run(run_dir: str | Path, out: str | Path,
               pipelines: Sequence[str] | None = None) -> dict[str, int]:
    """Write the RAGAS-style rows of `run_dir`'s records (of `pipelines`, default all) to
    `out` as jsonl, atomically; returns the rows written per pipeline.

    A record from before records kept the text read (it read documents but holds no
    `contexts`) is an error: exporting it would claim the generator read nothing."""
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} not found")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the file to write, e.g. "
                          f"{out / 'export.jsonl'}")
    lines: list[str] = []
    counts: dict[str, int] = {}
    for pipeline, path in _pipeline_results(run_dir, pipelines).items():
        records = JsonlLog(path).read_records(EvalRecord)
        for record in records:
            if len(record.contexts) != len(record.documents_read):
                raise ConfigError(
                    f"{path}: question {record.id!r} read {len(record.documents_read)} "
                    "document(s) but its record keeps no text of them (written by an older "
                    f"sieverag); re-run it (`sieverag eval --config {run_dir / 'config.yaml'} "
                    "--out NEW_FOLDER`) and export that run")
            lines.append(json.dumps(export_row(pipeline, record), ensure_ascii=False) + "\n")
        counts[pipeline] = len(records)
    if not lines:
        raise ConfigError(f"the run in {run_dir} holds no finished question to export")
    try:
        write_atomic(out, "".join(lines))
    except OSError as error:  # a parent that is a file, a read-only folder
        raise ConfigError(f"cannot write {out}: {error.strerror or error}") from None
    return counts
