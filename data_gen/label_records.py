"""The typed label record: one line of a `sieverag label` folder's labels.jsonl (written by
`data_gen.labelling`, read by `data_gen.labels` and `data_gen.dataset`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from sieverag.inference.core.io_utils import JsonlLog, JsonlRecord


class CXMIEntry(JsonlRecord):
    """CXMI of one chunk or sentence under the scorer (`cxmi.CXMIScore`, 5 decimals)."""

    score: float = Field(description="log p(alias | context, q) − log p(alias | q), nats")
    alias: str = Field(description="the gold alias that scored best")
    logprob_with: float = Field(description="log p(alias | context, q)")
    logprob_without: float = Field(description="log p(alias | q)")


class TeacherEntry(JsonlRecord):
    """The teacher's verdict on one chunk (`teacher.TeacherVerdict.as_json()`)."""

    status: Literal["valid", "invalid"] = Field(description="invalid: both replies broke format")
    relevant: bool | None = Field(description="the verdict; None when invalid")
    key_sentences: list[int] = Field(description="0-based key sentences it chose")
    reply: str = Field(description="its raw reply")
    error: str = Field(description="how the reply broke the format; empty when valid")
    attempts: int = Field(description="replies asked for (1, or 2 after a broken one)")


class ChunkLabels(JsonlRecord):
    """Every signal of one chunk of a question."""

    id: str = Field(description="the chunk's id")
    title: str
    text: str
    sentences: list[str] = Field(description="the chunk's sentences")
    sentences_given: bool = Field(description="the data's own split (else ours)")
    gold: bool | None = Field(description="the data's gold mark; None where unmarked")
    gold_sentences: list[int] | None = Field(
        description="the data's 0-based supporting sentences; None where unmarked")
    strinc: bool = Field(description="the chunk contains a gold alias")
    sentence_strinc: list[bool] = Field(description="STRINC per sentence")
    cxmi: CXMIEntry | None = Field(description="the chunk's CXMI; None when not scored")
    sentence_cxmi: list[CXMIEntry] | None = Field(
        description="CXMI per sentence; None when not scored")
    teacher: TeacherEntry | None = Field(description="the teacher's verdict; None without one")


class LabelRecord(JsonlRecord):
    """One labelled question."""

    question_id: str
    source: str = Field(description="the dataset format it came from (hotpotqa, nq, ...)")
    question: str
    answers: list[str] = Field(description="the gold aliases")
    no_context_logprobs: dict[str, float] | None = Field(
        description="log p(alias | q) of the aliases that scored best somewhere; None "
                    "without a scorer")
    chunks: list[ChunkLabels]
    position: int | None = Field(
        default=None, description="the question's place in the whole dataset (0-based), kept "
                                  "by a sharded run (`label --shard`) so merged shards keep "
                                  "the dataset's order; absent otherwise")


def read_labels(path: str | Path) -> list[LabelRecord]:
    """The question records of a labels.jsonl (a torn last line from a killed run is dropped);
    a line that is not a `LabelRecord` is a `DatasetError` naming the line and the key."""
    return JsonlLog(path).read_records(LabelRecord)
