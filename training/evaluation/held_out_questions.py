"""Which questions `eval-filter` evaluates: a dataset's rows with a gold passage, minus the
questions any training split was built from (and those the card's combination was fitted on),
matched by (source, question id), within an optional id list and limit.

`training_questions` finds the questions to leave out (--exclude-training, the adapter's
card, or the dataset the card names); `select_examples` applies them to one dataset and says
how many rows each rule removed (`Selection`). The benchmarks choose their held-out questions
with the same two functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import read_text
from sieverag.inference.core.types import Example
from sieverag.inference.data import example_source
from sieverag.inference.filters.card.card_file import CARD_FILE
from sieverag.inference.filters.card.combination import fitted_questions
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig


@dataclass(frozen=True)
class Selection:
    """The evaluated questions of one dataset and how they were chosen."""

    dataset: str
    examples: list[Example]
    rows: int
    excluded_training: int
    training_sources: tuple[str, ...]
    outside_id_list: int
    without_gold: int = 0


@dataclass(frozen=True)
class TrainingQuestions:
    """The (source, question id) pairs that trained the filter, and where they were read."""

    pairs: frozenset[tuple[str, str]]
    sources: tuple[str, ...]


def training_questions(config: FilterEvalConfig, metadata: Mapping[str, Any],
                       card: str = CARD_FILE) -> TrainingQuestions:
    """The questions to leave out: the train splits of --exclude-training, else the
    list in the adapter's card (it travels with a shipped or installed filter), else the train
    split of the dataset the card names; and always the questions the card's combination was
    fitted on."""
    from sieverag.training.sft.data import question_ids

    fitted = fitted_questions(metadata)

    def from_datasets(folders: Sequence[str]) -> TrainingQuestions:
        pairs = frozenset().union(*(question_ids(f, "train") for f in folders))
        return TrainingQuestions(pairs | fitted, tuple(folders))

    if config.exclude_training:
        return from_datasets(config.exclude_training)
    dataset = metadata.get("dataset") or {}
    if dataset.get("train_questions") is not None:
        return TrainingQuestions(frozenset(tuple(q) for q in dataset["train_questions"])
                                 | fitted, (card,))
    trained_on = dataset.get("path")
    if trained_on:
        if not Path(trained_on).exists():
            raise ConfigError(f"the adapter was trained on {trained_on}, which is gone: pass "
                              "--exclude-training DATASET_DIR (its build-dataset "
                              "output) so training questions are left out")
        return from_datasets((trained_on,))
    if config.question_ids_file or config.allow_training_questions:
        return TrainingQuestions(fitted, ())
    raise ConfigError("cannot tell which questions trained the filter: pass "
                      "--exclude-training DATASET_DIR, or --question-ids-file FILE, or "
                      "--allow-training-questions")


def select_examples(config: FilterEvalConfig, trained: TrainingQuestions,
                    dataset: str | None = None) -> Selection:
    """The dataset's rows with a gold passage minus training questions (by source and id),
    within the id list, limited; `dataset` defaults to the first of the config's."""
    from sieverag.inference.data import load_examples

    dataset = dataset or config.dataset[0]
    examples = load_examples(dataset)
    with_gold = [e for e in examples if any(d.is_gold for d in e.documents)]
    if not with_gold:
        raise DatasetError(f"{dataset}: eval-filter needs gold-marked passages (is_gold, "
                           "isgold); no question has one (for a source without marks, "
                           "`sieverag hard-negatives --unmarked-gold strinc` makes them)")
    eligible = [e for e in with_gold if (example_source(e), e.id) not in trained.pairs]
    excluded = len(with_gold) - len(eligible)
    outside = 0
    if config.question_ids_file:
        wanted = _read_ids(Path(config.question_ids_file))
        listed = [e for e in eligible if e.id in wanted]
        outside = len(eligible) - len(listed)
        eligible = listed
    if config.limit is not None:
        eligible = eligible[:config.limit]
    if not eligible:
        raise DatasetError(f"{dataset}: no question left to evaluate ({len(examples)} "
                           f"rows, {len(examples) - len(with_gold)} without a gold passage, "
                           f"{excluded} used for training, {outside} outside the id list)")
    return Selection(dataset, eligible, len(examples), excluded, trained.sources, outside,
                     len(examples) - len(with_gold))


def _read_ids(path: Path) -> set[str]:
    if not path.is_file():
        raise ConfigError(f"--question-ids {path}: file not found")
    ids = {line.strip() for line in read_text(path).splitlines()}
    return ids - {""}
