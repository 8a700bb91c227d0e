"""The multi-task filter dataset: label files in, prompt/completion records out.

Records are built with `inference.filters.filter_format` (`chunk_record`, `sentence_record`):
one `chunk` record per labelled chunk, one `sentence` record per relevant chunk (its key
sentences, or "none"). Questions are split into train / validation by a hash of their id, so
no question is in both; then, within each split, the chunk task is balanced to the asked
share of positives (by dropping records of the larger class) and the tasks are mixed to the
asked shares (by dropping records of the over-represented tasks), all with a fixed seed.

Output folder: `dataset/` (Hugging Face `DatasetDict.save_to_disk`), `train.jsonl`,
`validation.jsonl`, `train_ids.txt` / `validation_ids.txt` (each split's question ids, for
held-out evaluation runs), and `stats.json` (counts per split and task, label balance, token
lengths, gold agreement, the policy used, and each label folder with the dataset it labelled:
what `sieverag train` reads the validation questions' passages from to fit the filter's
combination).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator
from tqdm import tqdm

from sieverag.data_gen.label_records import LabelRecord, read_labels
from sieverag.data_gen.labelling import CONFIG_FILE, LABELS_FILE
from sieverag.data_gen.labels import ChunkSignals, LabelPolicy, gold_agreement, label_chunk
from sieverag.data_gen.shards import shard_groups
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import check_output_folder, parse_json, read_text
from sieverag.inference.core.settings import settings
from sieverag.inference.filters.filter_format import (
    TASKS,
    FilterFormat,
    chunk_record,
    passage_record,
    sentence_record,
    training_token_count,
)
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL

SPLITS = ("train", "validation")
VERDICT_TASKS = ("chunk", "passage")  # records whose completion is a passage's Yes/No


def _zero_is_none(value: Any) -> Any:
    """A positive fraction of 0 (as a flag's "0" too) is None: chunks kept as labelled."""
    try:
        return None if value is not None and float(value) == 0 else value
    except (TypeError, ValueError):
        return value


PositiveFraction = Annotated[float | None, BeforeValidator(_zero_is_none)]


@settings
class DatasetConfig:
    """How label files become a training set."""

    labels: tuple[str, ...] = field(metadata={"help": "label folders (from `sieverag label`)"})
    out: str = field(metadata={"help": "output folder"})
    filter_format: FilterFormat = field(default="two_stage", metadata={
        "help": "one_pass: one passage record per labelled chunk, its verdict and each "
                "sentence's (the one-pass filter); two_stage: chunk and sentence records"})
    policy: LabelPolicy = field(default_factory=LabelPolicy, metadata={
        "help": "how the signals become labels (see docs/labelling.md)"})
    mix: dict[str, float] | None = field(
        default=None, metadata={"help": "task shares, e.g. chunk=0.5,sentence=0.5 (in YAML a "
                                        "mapping); unset keeps every record"})
    chunk_positive_fraction: PositiveFraction = field(
        default=0.5, metadata={"help": "share of relevant chunk records; 0 keeps them as "
                                       "labelled"})
    validation_fraction: float = field(default=0.1,
                                       metadata={"help": "share of questions held out"})
    seed: int = field(default=0, metadata={"help": "seed of the split and the sampling"})
    tokenizer: str = field(default=DEFAULT_MODEL,
                           metadata={"help": "model whose tokenizer measures token lengths"})

    def __post_init__(self) -> None:
        if not self.labels:
            raise ConfigError("give at least one label folder")
        if self.mix is not None:
            unknown = set(self.mix) - set(TASKS)
            if unknown or not self.mix or any(v < 0 for v in self.mix.values()) \
                    or not sum(self.mix.values()) > 0:
                raise ConfigError(f"mix must give shares >= 0 (not all 0) for tasks among "
                                  f"{', '.join(TASKS)}, got {self.mix}")
        if self.chunk_positive_fraction is not None and not 0 < self.chunk_positive_fraction < 1:
            raise ConfigError("chunk_positive_fraction must be between 0 and 1 (exclusive), "
                              f"or 0 to keep chunk records as labelled, got "
                              f"{self.chunk_positive_fraction}")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got "
                              f"{self.validation_fraction}")


def question_records(question: LabelRecord, policy: LabelPolicy,
                     filter_format: FilterFormat = "two_stage") -> list[dict[str, Any]]:
    """The training records of one labelled question under the policy, in the format."""
    if filter_format == "one_pass":
        return passage_records(question, policy)
    records = []
    for chunk in question.chunks:
        signals = ChunkSignals.from_entry(chunk)
        label = label_chunk(signals, policy)
        common = {"chunk_id": chunk.id, "teacher_status": signals.teacher_status}
        provenance = {"source": question.source, "question_id": question.question_id,
                      "question": question.question, "title": chunk.title}
        if label.relevant is not None:
            records.append(chunk_record(
                chunk_text=chunk.text, relevant=label.relevant, **provenance,
                evidence={**common, "rule": _rule_name(policy.chunk_rule, signals.gold, policy),
                          "strinc": signals.strinc, "cxmi": signals.cxmi,
                          "teacher": signals.teacher, "gold": signals.gold,
                          "disagree": list(label.chunk_disagree)}))
        if label.relevant and label.key_sentences is not None:
            records.append(sentence_record(
                sentences=chunk.sentences, key_sentences=label.key_sentences, **provenance,
                evidence={**common,
                          "rule": _rule_name(policy.sentence_rule, signals.gold_sentences,
                                             policy),
                          "strinc_sentences": list(signals.sentence_strinc),
                          "cxmi_sentences": (None if signals.sentence_cxmi is None
                                             else list(signals.sentence_cxmi)),
                          "teacher_sentences": (None if signals.teacher_sentences is None
                                                else list(signals.teacher_sentences)),
                          "gold_sentences": (None if signals.gold_sentences is None
                                             else list(signals.gold_sentences)),
                          "disagree": list(label.sentence_disagree)}))
    return records


def passage_records(question: LabelRecord, policy: LabelPolicy) -> list[dict[str, Any]]:
    """One `passage` record per chunk the policy labels: its verdict, and each sentence's
    (the key sentences of a relevant chunk; none of an irrelevant one's). A relevant chunk
    without key sentences (unmarked, and no sentence signal found: a bridge passage that
    names no answer) teaches its verdict only, its sentences' labels None (`evidence`
    keeps why each label was given)."""
    records = []
    for chunk in question.chunks:
        signals = ChunkSignals.from_entry(chunk)
        label = label_chunk(signals, policy)
        if label.relevant is None or not chunk.sentences:
            continue
        keys = (label.key_sentences or None) if label.relevant else ()
        records.append(passage_record(
            question=question.question, sentences=chunk.sentences, key_sentences=keys,
            relevant=label.relevant, source=question.source, question_id=question.question_id,
            title=chunk.title,
            evidence={"chunk_id": chunk.id, "teacher_status": signals.teacher_status,
                      "rule": _rule_name(policy.chunk_rule, signals.gold, policy),
                      "sentence_rule": _rule_name(policy.sentence_rule,
                                                  signals.gold_sentences, policy),
                      "strinc": signals.strinc, "cxmi": signals.cxmi,
                      "teacher": signals.teacher, "gold": signals.gold,
                      "strinc_sentences": list(signals.sentence_strinc),
                      "gold_sentences": (None if signals.gold_sentences is None
                                         else list(signals.gold_sentences)),
                      "disagree": list(label.chunk_disagree) + list(label.sentence_disagree)}))
    return records


def _rule_name(rule: str, gold: Any, policy: LabelPolicy) -> str:
    return "gold" if policy.gold != "ignore" and gold is not None else rule


def split_position(question_id: str, seed: int) -> float:
    """A question's stable place in [0, 1): a hash of the seed and its id."""
    digest = hashlib.sha256(f"{seed}/{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(question_id: str, validation_fraction: float, seed: int) -> str:
    """`validation` for a stable hash-chosen share of question ids, else `train`."""
    return "validation" if split_position(question_id, seed) < validation_fraction else "train"


def split_questions(question_ids: Sequence[str], validation_fraction: float,
                    seed: int) -> dict[str, str]:
    """Each question id's split (`split_of`); with a validation share and two questions or
    more, neither split is left empty: the question placed lowest is held out when the hash
    held out none (a small set such as the README's two-question sample), and the one placed
    highest is trained on when it held out all."""
    splits = {qid: split_of(qid, validation_fraction, seed) for qid in question_ids}
    if validation_fraction > 0 and len(splits) >= 2:
        ordered = sorted(splits, key=lambda qid: split_position(qid, seed))
        if "validation" not in splits.values():
            splits[ordered[0]] = "validation"
        if "train" not in splits.values():
            splits[ordered[-1]] = "train"
    return splits


def balance_chunks(records: list[dict[str, Any]], positive_fraction: float,
                   rng: random.Random) -> list[dict[str, Any]]:
    """Drop chunk (or passage) records of the larger class until positives make
    `positive_fraction`."""
    chunks = [r for r in records if r["task"] in VERDICT_TASKS]
    positive = [r for r in chunks if _is_positive(r)]
    negative = [r for r in chunks if not _is_positive(r)]
    if not positive or not negative:
        return records
    keep_positive = min(len(positive),
                        round(len(negative) * positive_fraction / (1 - positive_fraction)))
    keep_negative = min(len(negative),
                        round(keep_positive * (1 - positive_fraction) / positive_fraction))
    kept = {id(r) for r in (rng.sample(positive, keep_positive)
                            + rng.sample(negative, keep_negative))}
    return [r for r in records if r["task"] not in VERDICT_TASKS or id(r) in kept]


def mix_tasks(records: list[dict[str, Any]], mix: Mapping[str, float],
              rng: random.Random) -> list[dict[str, Any]]:
    """Drop records of over-represented tasks so each task makes its share of the total."""
    total_share = sum(mix.values())
    shares = {task: mix.get(task, 0.0) / total_share for task in TASKS}
    by_task = {task: [r for r in records if r["task"] == task] for task in TASKS}
    available = [len(by_task[t]) / shares[t] for t in TASKS if shares[t] > 0]
    if not available:
        return []
    total = min(available)
    kept = set()
    for task in TASKS:
        count = min(len(by_task[task]), round(total * shares[task]))
        kept.update(id(r) for r in rng.sample(by_task[task], count))
    return [r for r in records if id(r) in kept]


def _is_positive(record: Mapping[str, Any]) -> bool:
    from sieverag.inference.filters.filter_format import RELEVANT

    return record["completion"][0]["content"] == RELEVANT


@dataclass
class BuildSummary:
    """What `build_dataset` wrote; saved as stats.json."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    chunk_positive_fraction: dict[str, float] = field(default_factory=dict)
    sentence_none_fraction: dict[str, float] = field(default_factory=dict)
    token_lengths: dict[str, dict[str, float]] = field(default_factory=dict)
    questions: dict[str, int] = field(default_factory=dict)
    disagreements: dict[str, int] = field(default_factory=dict)
    gold_agreement: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    mix: dict[str, float] | None = None
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    """Records per split and source: every source should keep a validation share."""
    labelled: list[dict[str, Any]] = field(default_factory=list)
    """Each label folder and the dataset it labelled (`labelled_datasets`)."""


def _load_questions(folders: Sequence[str]) -> list[LabelRecord]:
    """The folders' questions, in the order given; the shards of one run (`label --shard`)
    merged back into the dataset's order (`data_gen.shards`)."""
    questions, seen = [], set()
    for group in shard_groups(folders, CONFIG_FILE):
        records = []
        for folder in group:
            path = Path(folder) / LABELS_FILE
            if not path.is_file():
                raise DatasetError(f"{folder} holds no {LABELS_FILE}; make it with `sieverag "
                                   f"label --dataset FILE --out {folder}`")
            records.extend(read_labels(path))
        if len(group) > 1:
            records.sort(key=lambda question: question.position or 0)
        for question in records:
            key = (question.source, question.question_id)
            if key not in seen:
                seen.add(key)
                questions.append(question)
    if not questions:
        raise DatasetError(f"no labelled questions in {', '.join(folders)}")
    return questions


def labelled_datasets(folders: Sequence[str]) -> list[dict[str, Any]]:
    """Each label folder (absolute) with the dataset its labels came from, as its
    `label_config.json` names it (`dataset`: a file by its absolute path, or a hub split;
    None for a folder without one, labelled by other means)."""
    labelled = []
    for folder in folders:
        path = Path(folder) / CONFIG_FILE
        config = (parse_json(read_text(path), str(path), "relabel the folder with "
                             "`sieverag label`") if path.is_file() else {})
        dataset = config.get("dataset") if isinstance(config, dict) else None
        labelled.append({"labels": str(Path(folder).resolve()), "dataset": dataset})
    return labelled


def build_dataset(config: DatasetConfig, *, progress: bool = True) -> BuildSummary:
    """Build, save and describe the multi-task dataset; returns what went into stats.json."""
    check_output_folder(config.out)
    questions = _load_questions(config.labels)
    by_split: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    question_counts: Counter[str] = Counter()
    splits = split_questions([q.question_id for q in questions], config.validation_fraction,
                             config.seed)
    for question in tqdm(questions, desc="building records", unit="question",
                         disable=not progress):
        split = splits[question.question_id]
        question_counts[split] += 1
        by_split[split].extend(question_records(question, config.policy, config.filter_format))
    rng = random.Random(config.seed)
    for split, records in by_split.items():
        if config.chunk_positive_fraction is not None:
            records = balance_chunks(records, config.chunk_positive_fraction, rng)
        if config.mix is not None:
            records = mix_tasks(records, config.mix, rng)
        by_split[split] = records
    if not by_split["train"]:
        raise DatasetError(
            f"no training records built from {', '.join(config.labels)} "
            f"({question_counts['train']} training question(s)): the label policy, "
            "--chunk-positive-fraction or --mix left none; label more questions or loosen them")
    summary = _describe(by_split, config, question_counts)
    summary.gold_agreement = gold_agreement(questions, config.policy)
    summary.labelled = labelled_datasets(config.labels)
    _save(by_split, summary, Path(config.out))
    return summary


def _describe(by_split: Mapping[str, list[dict[str, Any]]], config: DatasetConfig,
              question_counts: Mapping[str, int]) -> BuildSummary:
    tokenizer = _tokenizer(config.tokenizer)
    summary = BuildSummary(policy=asdict(config.policy), mix=config.mix,
                           questions=dict(question_counts))
    lengths: dict[str, list[int]] = {task: [] for task in TASKS}
    disagreements: Counter[str] = Counter()
    sources: dict[str, Counter[str]] = {split: Counter() for split in by_split}
    for split, records in by_split.items():
        tasks = Counter(r["task"] for r in records)
        summary.counts[split] = {task: tasks.get(task, 0) for task in TASKS}
        chunks = [r for r in records if r["task"] in VERDICT_TASKS]
        sentences = [r for r in records if r["task"] == "sentence"]
        summary.chunk_positive_fraction[split] = _fraction(sum(map(_is_positive, chunks)),
                                                           len(chunks))
        summary.sentence_none_fraction[split] = _fraction(
            sum(r["completion"][0]["content"] == "none" for r in sentences), len(sentences))
        for record in records:
            sources[split][record["source"]] += 1
            disagreements.update(f"{record['task']}:{name}"
                                 for name in record["evidence"]["disagree"])
            lengths[record["task"]].append(training_token_count(tokenizer, record))
    summary.token_lengths = {task: _length_stats(values) for task, values in lengths.items()}
    summary.disagreements = dict(sorted(disagreements.items()))
    summary.sources = {split: dict(sorted(counts.items())) for split, counts in sources.items()}
    return summary


def _tokenizer(model: str) -> Any:
    from sieverag.inference.llm.chat_template import load_tokenizer
    from sieverag.inference.llm.model_resolution import resolve_model

    return load_tokenizer(resolve_model(model))


def _fraction(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _length_stats(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(values), "mean": round(statistics.fmean(values), 1),
            "p50": ordered[len(ordered) // 2], "p95": ordered[int(len(ordered) * 0.95)],
            "max": ordered[-1], "total": sum(values)}


def _write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _save(by_split: Mapping[str, list[dict[str, Any]]], summary: BuildSummary, out: Path) -> None:
    """Write everything into a staging folder, then swap it in (nothing half-written stays)."""
    from datasets import Dataset, DatasetDict

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for split, records in by_split.items():
            _write_jsonl(staging / f"{split}.jsonl", records)
            # The split's question ids, for `sieverag eval --question-ids` (held-out runs).
            ids = dict.fromkeys(r["question_id"] for r in records)
            (staging / f"{split}_ids.txt").write_text("".join(f"{i}\n" for i in ids),
                                                       encoding="utf-8")
        # An empty split keeps the training split's columns and one (empty) shard: saved
        # without them, `load_from_disk` cannot read the folder back.
        splits = {split: Dataset.from_list(records) for split, records in by_split.items()
                  if records}
        empty = [split for split in by_split if split not in splits]
        splits.update({split: splits["train"].select([]) for split in empty})
        DatasetDict({split: splits[split] for split in by_split}).save_to_disk(
            staging / "dataset", num_shards=dict.fromkeys(empty, 1))
        (staging / "stats.json").write_text(json.dumps(asdict(summary), indent=2),
                                            encoding="utf-8")
        if out.exists():
            retired = out.with_name(f".{out.name}-old")
            shutil.rmtree(retired, ignore_errors=True)
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
