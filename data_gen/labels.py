"""The label policy: how STRINC, CXMI, the teacher and gold combine into training labels.

Signals, per chunk of a question (all kept in the label files, see `data_gen.labelling`):

* STRINC — the chunk (or sentence) contains a gold answer alias (`data_gen.strinc`);
* CXMI — the chunk's (sentence's) CXMI score is above a threshold (`data_gen.cxmi`; default
  6.0 nats at both levels: with the embedded SmolLM2-135M scorer, the threshold among 2, 4,
  5, 6 and 8 at which the `auto` rule (STRINC or CXMI) agrees best with HotpotQA gold, on the
  80 training questions of the shipped filter's label set (chunk F1 0.605 vs 0.545 at 2.0;
  sentence F1 0.494 vs 0.409); README "The shipped filter");
* teacher — the teacher's verdict and key sentences, when a teacher was asked and its reply
  was valid (`data_gen.teacher`);
* gold — the dataset's own marks: `is_gold` per chunk, supporting sentences per sentence.

Chunk rules (`chunk_rule`), giving relevant / irrelevant:

* `teacher_and_auto` (default): relevant when the teacher says so AND (STRINC or CXMI);
* `auto`: STRINC or CXMI;
* `teacher`: the teacher's verdict;
* `strinc`, `cxmi`: that signal alone.

Sentence rules (`sentence_rule`), giving the key sentences of a relevant chunk:

* `teacher_or_strinc` (default): the sentences the teacher selects plus those carrying the
  answer string;
* `auto`: STRINC or CXMI per sentence;
* `teacher`: the teacher's selection;
* `strinc`, `cxmi`: that signal alone.

Where a rule needs the teacher and its verdict is absent or invalid, the `auto` rule decides
instead; where CXMI was not computed, "STRINC or CXMI" is STRINC alone.

Gold (`gold`): `prefer` (default) — where the data marks gold, gold decides and the automatic
signals stay in the evidence; `ignore` — automatic labels only; `only` — gold labels only,
chunks (and sentence sets) without gold marks are left out.

Every record's evidence keeps each signal and the list of signals that disagree with the
final label (`disagree`), so disagreements can be audited.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sieverag.data_gen.label_records import ChunkLabels, LabelRecord
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import settings

ChunkRule = Literal["teacher_and_auto", "auto", "teacher", "strinc", "cxmi"]
SentenceRule = Literal["teacher_or_strinc", "auto", "teacher", "strinc", "cxmi"]
GoldUse = Literal["prefer", "ignore", "only"]
CHUNK_RULES: tuple[ChunkRule, ...] = ("teacher_and_auto", "auto", "teacher", "strinc", "cxmi")
SENTENCE_RULES: tuple[SentenceRule, ...] = ("teacher_or_strinc", "auto", "teacher", "strinc",
                                            "cxmi")
GOLD_USES: tuple[GoldUse, ...] = ("prefer", "ignore", "only")


@settings
class LabelPolicy:
    """How the signals of `data_gen.labels` combine into chunk and sentence labels."""

    chunk_rule: ChunkRule = field(default="teacher_and_auto",
                                  metadata={"help": "|".join(CHUNK_RULES)})
    sentence_rule: SentenceRule = field(default="teacher_or_strinc",
                                        metadata={"help": "|".join(SENTENCE_RULES)})
    gold: GoldUse = field(default="prefer", metadata={"help": "|".join(GOLD_USES)})
    chunk_cxmi_threshold: float = field(
        default=6.0, metadata={"help": "a chunk is CXMI-positive above this score (nats)"})
    sentence_cxmi_threshold: float = field(
        default=6.0, metadata={"help": "a sentence is CXMI-positive above this score (nats)"})


@dataclass(frozen=True)
class ChunkSignals:
    """The signals of one chunk, read from a label record's chunk entry."""

    strinc: bool
    cxmi: float | None
    teacher: bool | None
    gold: bool | None
    sentence_strinc: tuple[int, ...]
    sentence_cxmi: tuple[float, ...] | None
    teacher_sentences: tuple[int, ...] | None
    gold_sentences: tuple[int, ...] | None
    teacher_status: str

    @classmethod
    def from_entry(cls, chunk: ChunkLabels) -> ChunkSignals:
        teacher = chunk.teacher
        valid = teacher is not None and teacher.status == "valid"
        return cls(
            strinc=chunk.strinc,
            cxmi=None if chunk.cxmi is None else chunk.cxmi.score,
            teacher=teacher.relevant if valid else None,
            gold=chunk.gold,
            sentence_strinc=tuple(i for i, hit in enumerate(chunk.sentence_strinc) if hit),
            sentence_cxmi=(None if chunk.sentence_cxmi is None
                           else tuple(s.score for s in chunk.sentence_cxmi)),
            teacher_sentences=tuple(teacher.key_sentences) if valid else None,
            gold_sentences=(None if chunk.gold_sentences is None
                            else tuple(chunk.gold_sentences)),
            teacher_status="absent" if teacher is None else teacher.status,
        )

    def cxmi_positive(self, threshold: float) -> bool | None:
        return None if self.cxmi is None else self.cxmi > threshold

    def cxmi_sentences(self, threshold: float) -> tuple[int, ...] | None:
        if self.sentence_cxmi is None:
            return None
        return tuple(i for i, score in enumerate(self.sentence_cxmi) if score > threshold)


@dataclass(frozen=True)
class ChunkLabel:
    """The policy's decision for one chunk; `key_sentences` is None when not decided."""

    relevant: bool | None
    key_sentences: tuple[int, ...] | None
    chunk_disagree: tuple[str, ...] = ()
    sentence_disagree: tuple[str, ...] = ()


def _auto_chunk(signals: ChunkSignals, policy: LabelPolicy) -> bool:
    return signals.strinc or bool(signals.cxmi_positive(policy.chunk_cxmi_threshold))


def _auto_sentences(signals: ChunkSignals, policy: LabelPolicy) -> tuple[int, ...]:
    by_cxmi = signals.cxmi_sentences(policy.sentence_cxmi_threshold) or ()
    return tuple(sorted(set(signals.sentence_strinc) | set(by_cxmi)))


def _need_cxmi(signals: ChunkSignals, level: str) -> None:
    missing = signals.cxmi is None if level == "chunk" else signals.sentence_cxmi is None
    if missing:
        raise ConfigError(f"the {level} rule 'cxmi' needs CXMI scores, but the labels have none "
                          f"at {level} level; relabel with a scorer or pick another rule")


def automatic_chunk_label(signals: ChunkSignals, policy: LabelPolicy) -> bool:
    """The chunk rule's verdict, ignoring gold."""
    rule = policy.chunk_rule
    if rule == "strinc":
        return signals.strinc
    if rule == "cxmi":
        _need_cxmi(signals, "chunk")
        return bool(signals.cxmi_positive(policy.chunk_cxmi_threshold))
    auto = _auto_chunk(signals, policy)
    if signals.teacher is None or rule == "auto":
        return auto
    return signals.teacher and auto if rule == "teacher_and_auto" else signals.teacher


def automatic_key_sentences(signals: ChunkSignals, policy: LabelPolicy) -> tuple[int, ...]:
    """The sentence rule's key sentences, ignoring gold."""
    rule = policy.sentence_rule
    if rule == "strinc":
        return signals.sentence_strinc
    if rule == "cxmi":
        _need_cxmi(signals, "sentence")
        return signals.cxmi_sentences(policy.sentence_cxmi_threshold) or ()
    if signals.teacher_sentences is None or rule == "auto":
        return _auto_sentences(signals, policy)
    if rule == "teacher_or_strinc":
        return tuple(sorted(set(signals.teacher_sentences) | set(signals.sentence_strinc)))
    return signals.teacher_sentences


def label_chunk(signals: ChunkSignals, policy: LabelPolicy) -> ChunkLabel:
    """Apply the policy to one chunk: its verdict, key sentences, and who disagreed."""
    use_gold = policy.gold != "ignore"
    if use_gold and signals.gold is not None:
        relevant: bool | None = signals.gold
    elif policy.gold == "only":
        relevant = None
    else:
        relevant = automatic_chunk_label(signals, policy)
    keys: tuple[int, ...] | None
    if use_gold and signals.gold_sentences is not None:
        keys = signals.gold_sentences
    elif policy.gold == "only":
        keys = None
    else:
        keys = automatic_key_sentences(signals, policy)
    return ChunkLabel(relevant, keys, _chunk_disagreement(signals, policy, relevant),
                      _sentence_disagreement(signals, policy, keys))


def _chunk_disagreement(signals: ChunkSignals, policy: LabelPolicy,
                        relevant: bool | None) -> tuple[str, ...]:
    if relevant is None:
        return ()
    votes = {"strinc": signals.strinc, "cxmi": signals.cxmi_positive(policy.chunk_cxmi_threshold),
             "teacher": signals.teacher, "gold": signals.gold}
    return tuple(name for name, vote in votes.items() if vote is not None and vote != relevant)


def _sentence_disagreement(signals: ChunkSignals, policy: LabelPolicy,
                           keys: tuple[int, ...] | None) -> tuple[str, ...]:
    if keys is None:
        return ()
    votes = {"strinc": signals.sentence_strinc,
             "cxmi": signals.cxmi_sentences(policy.sentence_cxmi_threshold),
             "teacher": signals.teacher_sentences, "gold": signals.gold_sentences}
    return tuple(name for name, vote in votes.items()
                 if vote is not None and set(vote) != set(keys))


# ----- agreement with gold ---------------------------------------------------------------


@dataclass
class _Counts:
    true_positive: int = 0
    false_positive: int = 0
    false_negative: int = 0
    items: int = 0

    def add(self, predicted: Iterable[Any], gold: Iterable[Any], universe: int) -> None:
        predicted, gold = set(predicted), set(gold)
        self.true_positive += len(predicted & gold)
        self.false_positive += len(predicted - gold)
        self.false_negative += len(gold - predicted)
        self.items += universe

    def scores(self) -> dict[str, float | int]:
        tp, fp, fn = self.true_positive, self.false_positive, self.false_negative
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
        return {"precision": round(precision, 4), "recall": round(recall, 4),
                "f1": round(f1, 4), "items": self.items, "gold_positive": tp + fn,
                "predicted_positive": tp + fp}


def gold_agreement(questions: Iterable[LabelRecord],
                   policy: LabelPolicy = LabelPolicy()) -> dict[str, dict[str, dict]]:
    """Precision / recall / F1 of each automatic signal against the data's gold marks.

    Pooled over all items (micro-average). Chunk level: chunks whose `is_gold` is known.
    Sentence level: sentences of chunks whose supporting sentences are known (all chunks,
    gold or not). Signals: STRINC, CXMI (above the policy's thresholds), the teacher (valid
    replies only), and the policy's own automatic label (`policy`, gold ignored).
    Signals absent from the labels are left out.
    """
    automatic = replace(policy, gold="ignore")
    chunk: dict[str, _Counts] = {}
    sentence: dict[str, _Counts] = {}
    for question in questions:
        for entry in question.chunks:
            signals = ChunkSignals.from_entry(entry)
            if signals.gold is not None:
                votes = {"strinc": signals.strinc,
                         "cxmi": signals.cxmi_positive(policy.chunk_cxmi_threshold),
                         "teacher": signals.teacher,
                         "policy": automatic_chunk_label(signals, automatic)}
                for name, vote in votes.items():
                    if vote is not None:
                        chunk.setdefault(name, _Counts()).add([0] if vote else [],
                                                              [0] if signals.gold else [], 1)
            if signals.gold_sentences is not None:
                n = len(entry.sentences)
                label = label_chunk(signals, automatic)
                picks: dict[str, Sequence[int] | None] = {
                    "strinc": signals.sentence_strinc,
                    "cxmi": signals.cxmi_sentences(policy.sentence_cxmi_threshold),
                    "teacher": (signals.teacher_sentences
                                if signals.teacher_status == "valid" else None),
                    "policy": label.key_sentences if label.relevant else (),
                }
                for name, pick in picks.items():
                    if pick is not None:
                        sentence.setdefault(name, _Counts()).add(pick, signals.gold_sentences, n)
    return {"chunk": {name: c.scores() for name, c in chunk.items()},
            "sentence": {name: c.scores() for name, c in sentence.items()}}
