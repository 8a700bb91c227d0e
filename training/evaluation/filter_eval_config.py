"""`FilterEvalConfig`: what `sieverag eval-filter` compares and on which questions.

Its fields are the command's flags (help text included); the MCF rows' settings default to
amber's (`MCFConfig()`), and a bad value fails on construction with a message naming its flag.
"""

from __future__ import annotations

import math
from dataclasses import field

from sieverag.inference.agents.roles import ModelRoles
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import FileList, settings
from sieverag.inference.data.dataset_fields import limit_field
from sieverag.inference.filters.mcf import DEFAULT_LEXICAL_WEIGHT, EmptySentenceAnswer, MCFConfig

_MCF = MCFConfig()  # amber's defaults, which the MCF rows' settings start from


@settings
class FilterEvalConfig:
    """What `eval-filter` compares and on which questions."""

    dataset: FileList = field(metadata={
        "help": "dataset file(s) whose passages carry gold marks (hotpotqa is_gold, nq "
                "isgold, squad, common is_gold/isgold, `sieverag hard-negatives` output); "
                "several, comma-separated, give a per-dataset table (the first is the "
                "report's main one)"})
    out: str = field(metadata={"help": "report folder"})
    models: ModelRoles = field(default_factory=ModelRoles, metadata={
        "help": "the trained filter (`filter`: in-process base model + adapter, default "
                "smollm2-filter, or served) and the MAIN-RAG judge's model (`judge`; default: "
                "the in-process filter's base model, for a served filter `generator`'s)"})
    exclude_training: tuple[str, ...] = field(
        default=(), metadata={"help": "build-dataset folders whose train-split questions are "
                                      "left out; default: the adapter's training dataset"})
    question_ids_file: str | None = field(
        default=None, metadata={"help": "evaluate only the question ids listed (one a line)"})
    allow_training_questions: bool = field(
        default=False, metadata={"help": "evaluate without knowing the training questions"})
    limit: int | None = limit_field()
    threshold: float = field(default=_MCF.threshold, metadata={
        "help": "bar of the 'MCF fixed' row on s = log P(Yes) − log P(No) (MCF's threshold); "
                "0 keeps a passage when P(Yes) >= P(No)"})
    top_k: int = field(default=_MCF.top_k, metadata={
        "help": "k of the 'MCF top_k' rows and of the BM25 and dense top-k baselines"})
    bar_n: float = field(default=_MCF.bar_n, metadata={
        "help": "n of the 'MCF adaptive' rows' bar mean(s) − n·σ(s) (MCF's bar_n)"})
    judge: bool = field(default=True, metadata={
        "help": "run the MAIN-RAG judge row (the slowest: several LLM calls per passage)"})
    judge_n: float = field(default=0.0, metadata={"help": "n of the judge bar mean(r) − n·σ(r)"})
    lexical_weight: float = field(default=DEFAULT_LEXICAL_WEIGHT, metadata={
        "help": "w of the '+ BM25 prior' rows (top_k and adaptive): MCF's score z(s) + "
                "w·z(BM25) (MCF's lexical_weight); 0 leaves those rows out"})
    sentence_max_new_tokens: int = field(default=_MCF.sentence_max_new_tokens, metadata={
        "help": "length cap of MCF's sentence-number reply (MCF's sentence_max_new_tokens)"})
    empty_sentence_answer: EmptySentenceAnswer = field(
        default=_MCF.empty_sentence_answer, metadata={
            "help": "a kept passage whose sentence reply is 'none': keep_chunk or drop_chunk "
                    "(MCF's empty_sentence_answer)"})
    embedding_model: str = field(default="all-minilm-l6-v2", metadata={
        "help": "dense baseline's embedding model (run on the filter's device)"})

    def __post_init__(self) -> None:
        if not math.isfinite(self.threshold):
            raise ConfigError(f"--threshold must be a finite log-odds, got {self.threshold}")
        if self.top_k < 1:
            raise ConfigError(f"--top-k must be >= 1, got {self.top_k}")
        if self.lexical_weight < 0:
            raise ConfigError(f"--lexical-weight must be >= 0, got {self.lexical_weight}")
        if self.sentence_max_new_tokens < 1:
            raise ConfigError(f"--sentence-max-new-tokens must be >= 1, got "
                              f"{self.sentence_max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if not self.dataset:
            raise ConfigError("--dataset: give at least one dataset file")
