"""A run's HTML report, `report.html`: one self-contained page (`inference.html.page`) showing
what every pipeline read, kept and answered, question by question.

At the top, built here: the run's configuration and provenance (dataset, models, the filter's
card, what ranked and why), the comparison and trust tables (sortable) and inline SVG plots.
Below, built in the browser by `html_report.js` from the embedded JSON, a page of questions at
a time: each question with its gold answers and, per pipeline, its answer, metrics, cost, and
on demand every passage it scored (score, kept or dropped, gold, the kept sentences highlighted
at their character offsets) with the rest of its trace shown field by field.

The page names no pipeline and reads no pipeline's code: a record's `trace` is shown as it is
stored, a dict walked field by field, in which any list of scored passages (objects with an
`id`, a `score` and `kept`) is shown as passages. Passage texts are not in the records: they
are read from the run's dataset (the example's documents) or its index (`chunks.jsonl`), else
taken from the record's `contexts` (the text the generator read); where none is found the
passage shows its id and scores only, and the page and stderr say so.

A kept passage's key sentences (`key_sentences`, MCF's sentence stage) are located in its
text by `sentence_spans`, the split MCF chose them from and `/v1/rerank` reports as `spans`
(a document read window by window: the sentences of its best window, offset into it).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.html.page import asset, write_page
from sieverag.inference.core.io_utils import parse_json, read_text, validated_record
from sieverag.inference.core.types import Example
from sieverag.inference.eval.html_sections import run_header
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.eval.summary import summarize
from sieverag.inference.retrieval.sentences import sentence_spans

REPORT_FILE = "report.html"
SCRIPT = "html_report.js"
# Questions shown a page at a time (the page's own selector changes it).
PAGE_SIZE = 20
DIGITS = 4  # floats in the embedded data: enough to tell scores apart, a smaller page
# Record keys shown at the question's level, once, not per pipeline.
QUESTION_KEYS = ("id", "question", "answers", "reference", "kind")
_PUNCTUATION = re.compile(r"[^\w\s]")


@dataclass
class RunFolder:
    """What a run folder holds: its config (as YAML data), dataset, summaries and records,
    pipelines in the config's order."""

    path: Path
    config: dict[str, Any]
    summaries: dict[str, Mapping[str, Any]]
    records: dict[str, list[dict[str, Any]]]
    notes: list[str] = field(default_factory=list)

    @property
    def dataset(self) -> str:
        return str(self.config.get("dataset", ""))


def read_run(run_dir: str | Path) -> RunFolder:
    """The run folder's config.yaml, results/*.jsonl (validated, old lines read under today's
    names) and summary.json; a run not finished yet has no summary.json: its figures are
    computed from the records so far (and the page says so)."""
    path = Path(run_dir)
    config_path = path / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{config_path} not found: is {run_dir} a run folder written by "
                          "`sieverag eval`?")
    config = yaml.safe_load(read_text(config_path, ConfigError))
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path}: not a run config (expected a mapping)")
    names = [str(p) for p in config.get("pipelines") or ()]
    names += sorted(p.stem for p in (path / "results").glob("*.jsonl") if p.stem not in names)
    typed = {name: read_records(path / "results" / f"{name}.jsonl")
             for name in names if (path / "results" / f"{name}.jsonl").is_file()}
    if not typed:
        raise ConfigError(f"{path / 'results'} holds no results: has the run answered a "
                          "question yet?")
    notes = []
    summary_path = path / "summary.json"
    if summary_path.is_file():
        data = parse_json(read_text(summary_path, ConfigError), str(summary_path),
                          error=ConfigError)
        summaries = {name: s for name, s in data.get("pipelines", {}).items() if name in typed}
    else:
        summaries = {}
    missing = [name for name in typed if name not in summaries]
    if missing:
        notes.append(f"{', '.join(missing)}: the run has not finished (no summary yet); the "
                     "figures are those of the records written so far")
        summaries |= {name: summarize(typed[name]) for name in missing}
    records = {name: [r.to_json() for r in rs] for name, rs in typed.items()}
    return RunFolder(path, config, {n: summaries[n] for n in typed}, records, notes)


def read_records(path: Path) -> list[EvalRecord]:
    """The complete lines of a results file, validated; only read, never repaired (an eval
    may still be appending: a last line without its newline is one being written)."""
    records = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip() or not line.endswith(b"\n"):
                continue
            data = parse_json(line, f"{path}, line {number}", "fix or remove that line")
            records.append(validated_record(EvalRecord, data, path, number))
    return records


def question_order(records: Mapping[str, Sequence[Mapping[str, Any]]],
                   examples: Sequence[Example] | None) -> list[str]:
    """Every question id the run answered: in the dataset's order where the examples are
    known, else in the order the pipelines' records list them."""
    answered = dict.fromkeys(r["id"] for rs in records.values() for r in rs)
    if examples is not None:
        ordered = [e.id for e in examples if e.id in answered]
        return ordered + [i for i in answered if i not in set(ordered)]
    return list(answered)


def load_run_examples(run: RunFolder, ids: Sequence[str]) -> list[Example] | None:
    """The run's examples read from its dataset (for their passages' texts); None, with a
    note on the page and stderr, when the dataset cannot be read here."""
    try:
        from sieverag.inference.data import load_examples

        wanted = set(ids)
        return [e for e in load_examples(run.dataset, str(run.config.get("dataset_format")
                                                          or "auto"),
                                         require_documents=False) if e.id in wanted]
    except (DatasetError, ConfigError, OSError) as err:
        run.notes.append(f"the dataset {run.dataset} could not be read here ({err}): passages "
                         "not from the index show their ids and scores only")
        return None


def passage_entries(value: Any) -> Iterator[dict[str, Any]]:
    """Every scored passage inside a record's data: each object with an `id`, a numeric
    `score` and a boolean `kept`, at any depth."""
    if isinstance(value, dict):
        if isinstance(value.get("id"), str) and isinstance(value.get("kept"), bool) and \
                isinstance(value.get("score"), (int, float)):
            yield value
        for child in value.values():
            yield from passage_entries(child)
    elif isinstance(value, list):
        for child in value:
            yield from passage_entries(child)


def key_sentence_offsets(text: str, entry: Mapping[str, Any]) -> list[list[int]]:
    """[start, end) of each key sentence of a kept passage in its text: `sentence_spans`, in
    the best read window where the filter read the passage by windows; [] where it named
    none (kept whole) or was not kept."""
    keys = entry.get("key_sentences")
    if not entry.get("kept") or not keys:
        return []
    offset, end = 0, len(text)
    window = entry.get("window")
    if isinstance(window, list) and len(window) == 2:
        offset, end = int(window[0]), int(window[1])
    spans = [(offset + s, offset + e) for s, e in sentence_spans(text[offset:end])]
    return [list(spans[k]) for k in keys if isinstance(k, int) and 0 <= k < len(spans)]


def index_chunks(run: RunFolder, wanted: set[str]) -> dict[str, tuple[str, str]]:
    """The texts of the wanted chunk ids from the run's index (`retrieval.index`), if any."""
    retrieval = run.config.get("retrieval") or {}
    folder = retrieval.get("index") if isinstance(retrieval, dict) else None
    if not folder and wanted and retrieval:
        run.notes.append("the run searched a served index or Milvus (retrieval.endpoint or "
                         "retrieval.uri), whose chunk texts this report does not fetch: its "
                         "passages show their ids and scores only")
    if not folder or not wanted:
        return {}
    from sieverag.inference.retrieval.index_folder import CHUNKS_FILE

    path = Path(folder) / CHUNKS_FILE
    if not path.is_file():
        run.notes.append(f"the run's index {folder} is not here ({path} not found): its "
                         "passages show their ids and scores only")
        return {}
    found = {}
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                chunk = parse_json(line, f"{path}, line {number}", error=ConfigError)
                if chunk.get("id") in wanted:
                    found[chunk["id"]] = (str(chunk.get("title") or ""),
                                          str(chunk.get("text") or ""))
    return found


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def is_wrong(record: Mapping[str, Any]) -> bool:
    """The answer missed: its multiple-choice accuracy where it has one, else its accuracy
    (a gold alias contained), below 1."""
    metrics = record.get("metrics") or {}
    correct = metrics.get("choice_accuracy")
    correct = metrics.get("accuracy") if correct is None else correct
    return correct is not None and correct < 1


def _normalized(answer: str) -> str:
    return " ".join(_PUNCTUATION.sub(" ", answer.lower()).split())


def record_view(record: Mapping[str, Any], docs: dict[str, list[str]]) -> dict[str, Any]:
    """A record as the page shows it: the question-level keys and the texts left out (in the
    question's `docs`), every scored passage with its key sentences' offsets (`hl`), and
    flags: `wrong`, `gold_dropped` (a gold passage scored and not kept)."""
    view = {k: v for k, v in record.items() if k not in QUESTION_KEYS and k != "contexts"}
    if view.get("raw_prediction") == view.get("prediction"):
        view.pop("raw_prediction", None)
    entries = list(passage_entries(view))
    for entry in entries:
        text = docs.get(entry["id"], [None, None])[1]
        if text:
            offsets = key_sentence_offsets(text, entry)
            if offsets:
                entry["hl"] = offsets
    view["flags"] = {"wrong": is_wrong(record),
                     "gold_dropped": any(e.get("is_gold") is True and not e["kept"]
                                         for e in entries)}
    trace = view.get("trace")
    scores = (view.get("filter") or {}).get("scores")
    if scores and trace and any(True for _ in passage_entries(trace)):
        # The trace lists the same passages round by round: shown there, sent once.
        view["filter"] = {k: v for k, v in view["filter"].items() if k != "scores"}
    return _rounded(view)


def question_docs(question_id: str, example: Example | None,
                  records: Sequence[Mapping[str, Any]],
                  chunks: Mapping[str, tuple[str, str]]) -> dict[str, list[str]]:
    """The question's passages, id → [title, text]: the example's documents, then any chunk
    of the index a record names, then the text a generator read (`contexts`)."""
    docs: dict[str, list[str]] = {}
    if example is not None:
        docs = {d.id: [d.title or "", d.text] for d in example.documents}
    for record in records:
        for entry in passage_entries(record):
            if entry["id"] not in docs and entry["id"] in chunks:
                docs[entry["id"]] = list(chunks[entry["id"]])
        for doc_id, text in zip(record.get("documents_read") or (),
                                record.get("contexts") or (), strict=False):
            if doc_id not in docs:
                docs[doc_id] = ["", text]
    return docs


def report_data(run: RunFolder, examples: Sequence[Example] | None) -> dict[str, Any]:
    """The embedded JSON: the run, the questions (id, text, gold, passages) and each
    pipeline's record views aligned with them (None where a pipeline has not answered)."""
    ids = question_order(run.records, examples)
    by_id = {e.id: e for e in examples or ()}
    per_question = {name: {r["id"]: r for r in rs} for name, rs in run.records.items()}
    wanted = {e["id"] for rs in run.records.values() for r in rs for e in passage_entries(r)}
    chunks = index_chunks(run, wanted - {d.id for e in by_id.values() for d in e.documents})
    questions, answers = [], {name: [] for name in run.records}
    for question_id in ids:
        records = [per_question[name][question_id] for name in run.records
                   if question_id in per_question[name]]
        first = records[0]
        docs = question_docs(question_id, by_id.get(question_id), records, chunks)
        predictions = {_normalized(r.get("prediction", "")) for r in records}
        questions.append({"id": question_id, "question": first["question"],
                          "answers": first.get("answers", []),
                          **{k: first[k] for k in ("reference", "kind") if k in first},
                          "docs": docs, "differ": len(predictions) > 1})
        for name in run.records:
            record = per_question[name].get(question_id)
            answers[name].append(None if record is None else record_view(record, docs))
    return {"run_dir": str(run.path), "pipelines": list(run.records), "questions": questions,
            "answers": answers, "page_size": PAGE_SIZE}


def write_html_report(run_dir: str | Path, examples: Sequence[Example] | None = None) -> Path:
    """Write RUN_DIR/report.html from the run folder and return its path. `examples`: the
    run's examples where the caller has them (`sieverag eval`), else read from the run's
    dataset. What could not be found (a dataset or index not here, a run not finished) is
    said on the page and on stderr."""
    run = read_run(run_dir)
    ids = question_order(run.records, None)
    if examples is None:
        examples = load_run_examples(run, ids)
    data = report_data(run, examples)
    for note in run.notes:
        print(f"report.html: {note}", file=sys.stderr)
    body = run_header(run.path, run.config, run.summaries, run.records, run.notes)
    return write_page(run.path / REPORT_FILE, f"sieverag run: {run.path.name}", body, data,
                      asset(SCRIPT, Path(__file__).parent))
