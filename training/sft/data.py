"""The multi-task filter dataset as training reads it (written by `sieverag build-dataset`).

The data_gen output folder holds `dataset/` (a `DatasetDict.save_to_disk` with `train` and
`validation` splits, split by question), `train.jsonl`, `validation.jsonl` and `stats.json`.
Records follow `inference.filters.filter_format`: conversational `prompt` / `completion`
plus provenance columns (`task`, `source`, `question_id`, `evidence`) that training drops.
A one-pass dataset's `passage` records also carry `sentence_labels`; the trainer reads them
already tokenised (`trained_columns`: `input_ids` and `labels` at the verdict positions).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.filters.filter_format import (
    RELEVANT,
    FilterFormat,
    passage_training_ids,
    training_token_count,
)

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedTokenizerBase

DATASET_SUBDIR = "dataset"
STATS_FILE = "stats.json"
LABELLED_KEY = "labelled"  # stats.json: each label folder and the dataset it labelled
RECORD_COLUMNS = ("prompt", "completion", "task", "source", "question_id")
TRAINED_COLUMNS = ["prompt", "completion"]
SENTENCE_LABELS = "sentence_labels"  # a passage record's per-sentence verdicts


def dataset_dict_dir(path: str | Path) -> Path:
    """The `save_to_disk` folder inside a build-dataset output folder (or the folder itself)."""
    folder = Path(path)
    for candidate in (folder / DATASET_SUBDIR, folder):
        if (candidate / "dataset_dict.json").is_file():
            return candidate
    what = "does not exist" if not folder.exists() else "holds no dataset/dataset_dict.json"
    raise DatasetError(f"filter dataset {folder} {what}: give the output folder of "
                       "`sieverag build-dataset --out DIR`")


def load_filter_dataset(path: str | Path, splits: Iterable[str] = ("train", "validation")
                        ) -> DatasetDict:
    """The dataset's splits, each checked to hold the filter record columns."""
    from datasets import load_from_disk

    folder = dataset_dict_dir(path)
    try:
        dataset = load_from_disk(str(folder))
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot load filter dataset {folder}: {err}") from err
    except IndexError:  # a split saved with no shard at all (older build-dataset, empty split)
        raise DatasetError(f"filter dataset {folder} has an empty split saved without its "
                           "columns, which cannot be read: rebuild it with `sieverag "
                           "build-dataset`") from None
    for split in splits:
        if split not in dataset:
            raise DatasetError(f"filter dataset {folder} has no {split!r} split "
                               f"(it has {', '.join(dataset) or 'none'})")
        missing = [c for c in RECORD_COLUMNS if c not in dataset[split].column_names]
        if missing and len(dataset[split]) > 0:
            raise DatasetError(f"filter dataset {folder}, split {split!r}: missing column(s) "
                               f"{', '.join(missing)}; records must follow "
                               "sieverag.inference.filters.filter_format")
    return dataset


def load_training_splits(path: str | Path, train_split: str,
                         eval_split: str | None) -> DatasetDict:
    """The splits a run trains and evaluates on (`eval_split` None: it does not evaluate),
    refusing a dataset training cannot use: no training records, or none to evaluate on."""
    splits = (train_split,) if eval_split is None else (train_split, eval_split)
    dataset = load_filter_dataset(path, splits)
    if len(dataset[train_split]) == 0:
        raise DatasetError(f"filter dataset {path} holds no training records (split "
                           f"{train_split!r} is empty): rebuild it with `sieverag build-dataset` "
                           "from labels of more questions")
    if eval_split is not None and len(dataset[eval_split]) == 0:
        raise DatasetError(f"filter dataset {path} has no records in split {eval_split!r} to "
                           "evaluate on: rebuild it with a --validation-fraction above 0 and at "
                           "least two questions, or train with --overrides eval_strategy=no")
    return dataset


def question_ids(path: str | Path, split: str = "train") -> set[tuple[str, str]]:
    """The (source, question_id) pairs of one split: the questions a split was built from."""
    records = load_filter_dataset(path, splits=(split,))[split]
    if len(records) == 0:
        return set()
    return set(zip(records["source"], records["question_id"], strict=True))


def labelled_datasets(path: str | Path) -> list[str]:
    """The datasets the questions of a build-dataset folder were labelled from (its
    stats.json records each label folder's): where their passages are read again, e.g. to fit
    the filter's combination on the validation questions. `DatasetError` saying what is
    missing where the folder records none."""
    from sieverag.inference.core.io_utils import parse_json, read_text

    stats = Path(path) / STATS_FILE
    if not stats.is_file():
        raise DatasetError(f"{path} holds no {STATS_FILE} naming the datasets it was labelled "
                           "from: is it a folder written by `sieverag build-dataset`?")
    recorded = parse_json(read_text(stats), str(stats))
    labelled = recorded.get(LABELLED_KEY) if isinstance(recorded, dict) else None
    if not labelled:
        raise DatasetError(f"{stats} names no labelled datasets (written by a build-dataset "
                           "from before it recorded them): rebuild the folder")
    if not isinstance(labelled, list) or not all(isinstance(e, dict) for e in labelled):
        raise DatasetError(f"{stats}: {LABELLED_KEY!r} is not a list of label folders: "
                           "rebuild the folder with `sieverag build-dataset`")
    unnamed = [entry.get("labels") for entry in labelled if not entry.get("dataset")]
    if unnamed:
        raise DatasetError(f"{stats}: label folder(s) {', '.join(map(str, unnamed))} name no "
                           "dataset (no label_config.json): label them with `sieverag label`")
    return list(dict.fromkeys(str(entry["dataset"]) for entry in labelled))


def sample(records: Dataset, limit: int | None, seed: int) -> Dataset:
    """A seeded random subset of `limit` records (all of them when `limit` is None)."""
    if limit is None or limit >= len(records):
        return records
    return records.shuffle(seed=seed).select(range(limit))


def filter_format_of(records: Dataset) -> FilterFormat:
    """one_pass for a split of `passage` records, two_stage for chunk/sentence records;
    a split that mixes them is refused."""
    tasks = set(records["task"]) if len(records) else set()
    if "passage" in tasks and tasks != {"passage"}:
        raise DatasetError(f"the training split mixes one-pass passage records with "
                           f"{sorted(tasks - {'passage'})} records: build it with one "
                           "--filter-format")
    return "one_pass" if tasks == {"passage"} else "two_stage"


def record_length(record: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> int:
    """Tokens of the record as the trainer sees it (`filter_format.training_token_count`)."""
    return training_token_count(tokenizer, record)


def drop_long(records: Dataset, tokenizer: PreTrainedTokenizerBase,
              max_length: int) -> tuple[Dataset, int]:
    """Records of at most `max_length` tokens, and how many were dropped."""
    keep = [i for i, record in enumerate(records)
            if record_length(record, tokenizer) <= max_length]
    return records.select(keep), len(records) - len(keep)


def record_token_lengths(records: Dataset, tokenizer: PreTrainedTokenizerBase
                         ) -> dict[str, int]:
    """The tokens of the records trained on (`record_length`): the longest, the median and
    the 95th percentile (the card's `dataset.record_tokens`; the longest is the window a long
    document is read in, `inference/filters/windows.py`). Empty for no records."""
    lengths = sorted(record_length(record, tokenizer) for record in records)
    if not lengths:
        return {}
    return {"max": lengths[-1], "median": lengths[len(lengths) // 2],
            "p95": lengths[min(len(lengths) - 1, math.ceil(0.95 * len(lengths)) - 1)]}


def trained_columns(records: Dataset, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """What the trainer reads: `prompt` and `completion` (provenance columns stay out); a
    one-pass split as `input_ids` and `labels` (`filter_format.passage_training_ids`)."""
    if filter_format_of(records) == "one_pass":
        return records.map(lambda record: passage_training_ids(tokenizer, record),
                           remove_columns=records.column_names)
    return records.select_columns(TRAINED_COLUMNS)


def content_fingerprint(splits: dict[str, Dataset]) -> str:
    """SHA-256 (16 hex digits) over the prompts and completions actually used, per split
    (a one-pass split's sentence labels too)."""
    digest = hashlib.sha256()
    for name in sorted(splits):
        digest.update(name.encode() + b"\0")
        columns = [c for c in (*TRAINED_COLUMNS, SENTENCE_LABELS)
                   if c in splits[name].column_names]
        for record in splits[name].select_columns(columns):
            digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False).encode())
            digest.update(b"\n")
    return digest.hexdigest()[:16]


def base_rate_loss(records: Dataset) -> float | None:
    """The eval loss of a filter that learned only how often each kind of verdict is "Yes"
    in a one-pass split (a sentence's, a passage's): the entropy of each kind's share of Yes,
    averaged over the split's verdicts, in nats per verdict. A one-pass run that ends near it
    learned nothing but the base rates. None for a two-stage split (its loss also averages
    the completion's end token)."""
    if filter_format_of(records) != "one_pass" or not len(records):
        return None
    kinds = {"sentence": [v for labels in records[SENTENCE_LABELS] for v in labels
                          if v is not None],
             "passage": [c[0]["content"] for c in records["completion"]]}
    total = sum(len(verdicts) for verdicts in kinds.values())
    return sum(len(verdicts) * _entropy(sum(v == RELEVANT for v in verdicts) / len(verdicts))
               for verdicts in kinds.values() if verdicts) / total


def _entropy(share: float) -> float:
    """H(share) in nats (0 at 0 and 1)."""
    if share in (0.0, 1.0):
        return 0.0
    return -(share * math.log(share) + (1 - share) * math.log(1 - share))


def column_counts(records: Dataset, column: str) -> dict[str, int]:
    """Records per value of a provenance column (`task`, `source`)."""
    counts: dict[str, int] = {}
    for value in records[column] if column in records.column_names else []:
        counts[value] = counts.get(value, 0) + 1
    return counts
