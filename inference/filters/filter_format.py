"""The trained filter's prompt/answer contract, shared by data_gen, training, serving and MCF.

Two formats: the one-pass `passage` format (a filter card with `"filter_format":
"one_pass"`), and the two-stage format of the earlier filters (`chunk` + `sentence` tasks,
cards without the key), which still run as they were trained.

* `passage` (one pass, both granularities) — prompt: the `filter_passage` template
  (instruction, question, the chunk's sentences one per line, each followed by
  `LABEL_MARK`); the filter's Yes/No is read after each sentence (that sentence's verdict)
  and after the assistant prefix (the passage's), all from one forward pass
  (`LLMBackend.marked_label_logprobs`). Its training record carries the passage's label as
  the completion and one label per sentence (`sentence_labels`); training reads every
  verdict at the positions `passage_training_ids` gives, so one record teaches both
  granularities.

The two-stage tasks:

* `chunk` — prompt: the `filter_chunk` template (instruction, question, one chunk);
  answer: `RELEVANT` ("Yes") or `IRRELEVANT` ("No"). Both labels are one token each in the
  SmolLM2 tokenizer right after the assistant prefix, so the filter reads its verdict from a
  single next-token step (`label_logprobs`) instead of generating.
* `sentence` — prompt: the `filter_sentence` template (instruction, question, the chunk's
  sentences numbered [1], [2], ...); answer: the key sentence numbers in increasing order,
  joined by ", " ("1, 3"), or `NO_KEY_SENTENCES` ("none").

Sentence indices are 0-based everywhere in code (as in `Document.supporting_sentences`);
only the prompt text and the answer text number sentences from 1.

Training records are conversational prompt/completion pairs, so the trainer computes the
loss on the completion only; the other keys are provenance columns the trainer ignores:

    {"prompt": [{"role": "system", ...}, {"role": "user", ...}],
     "completion": [{"role": "assistant", "content": "Yes"}],
     "task": "chunk", "source": "hotpotqa", "question_id": "...", "evidence": {...}}
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import LABEL_MARK, chat_prompt_text, marked_prompt_ids

CHUNK_TEMPLATE = "filter_chunk"
SENTENCE_TEMPLATE = "filter_sentence"
PASSAGE_TEMPLATE = "filter_passage"
FilterFormat = Literal["two_stage", "one_pass"]
FORMAT_KEY = "filter_format"  # a card's key; absent: two_stage (the cards before one_pass)
FORMAT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "two_stage": (CHUNK_TEMPLATE, SENTENCE_TEMPLATE),
    "one_pass": (PASSAGE_TEMPLATE,),
}
RELEVANT = "Yes"
IRRELEVANT = "No"
CHUNK_LABELS = (RELEVANT, IRRELEVANT)
NO_KEY_SENTENCES = "none"
Task = Literal["chunk", "sentence", "passage"]
TASKS: tuple[Task, ...] = ("chunk", "sentence", "passage")
IGNORED = -100  # a position without a label in a training record's `labels`

_SENTENCE_ANSWER = re.compile(r"[1-9][0-9]*(?:, [1-9][0-9]*)*")


class FilterAnswerError(ValueError):
    """A filter reply does not follow the answer format."""


def chunk_block(text: str, title: str = "") -> str:
    """A chunk as the filter reads it: its title line (if any), then its text."""
    return f"{title}\n{text}" if title else text


def numbered_sentences(sentences: Sequence[str], title: str = "") -> str:
    """The sentences one per line as "[1] ...", "[2] ...", after the title line (if any)."""
    lines = [title] if title else []
    lines.extend(f"[{number}] {sentence.strip()}"
                 for number, sentence in enumerate(sentences, start=1))
    return "\n".join(lines)


def chunk_prompt(question: str, chunk_text: str, title: str = "") -> Conversation:
    """The chunk-task prompt: instruction, question, one chunk."""
    return load_template(CHUNK_TEMPLATE).messages(
        question=question, chunk=chunk_block(chunk_text, title))


def sentence_prompt(question: str, chunk_sentences: Sequence[str], title: str = "") -> Conversation:
    """The sentence-task prompt: instruction, question, the chunk's numbered sentences."""
    if not chunk_sentences:
        raise ValueError("sentence_prompt needs at least one sentence")
    return load_template(SENTENCE_TEMPLATE).messages(
        question=question, sentences=numbered_sentences(chunk_sentences, title))


def relevance_log_odds(label_logprobs: Mapping[str, float], yes: str = RELEVANT,
                       no: str = IRRELEVANT) -> float:
    """s = log P(yes) − log P(no) from a prompt's label log-probs (default: the chunk task's
    "Yes" / "No"); read every Yes/No verdict through this and `p_relevant`."""
    return label_logprobs[yes] - label_logprobs[no]


def p_relevant(log_odds: float) -> float:
    """P("Yes") normalised over the two labels, from s = log P("Yes") − log P("No"); the
    logistic of s, clamped so that no float log-odds (±1e6 floors included) overflows."""
    return 1.0 / (1.0 + math.exp(-max(min(log_odds, 700.0), -700.0)))


def chunk_answer(relevant: bool) -> str:
    """The chunk-task completion for a verdict."""
    return RELEVANT if relevant else IRRELEVANT


def parse_chunk_answer(text: str) -> bool:
    """True for "Yes", False for "No" (surrounding white space ignored); anything else raises."""
    answer = text.strip()
    if answer not in CHUNK_LABELS:
        raise FilterAnswerError(f"chunk answer must be {RELEVANT!r} or {IRRELEVANT!r}, "
                                f"got {text!r}")
    return answer == RELEVANT


def sentence_answer(key_sentences: Iterable[int]) -> str:
    """The sentence-task completion for 0-based key sentence indices: "1, 3" or "none"."""
    indices = sorted(set(key_sentences))
    if any(i < 0 for i in indices):
        raise ValueError(f"sentence indices must be >= 0, got {indices}")
    return ", ".join(str(i + 1) for i in indices) if indices else NO_KEY_SENTENCES


def parse_sentence_answer(text: str, n_sentences: int) -> list[int]:
    """The 0-based key sentence indices named by a sentence-task reply, in increasing order.

    Strict: after stripping surrounding white space the reply must be exactly "none" or
    numbers joined by ", " in increasing order, each between 1 and `n_sentences`; anything
    else (other separators, repeats, out-of-range numbers, extra words) raises
    `FilterAnswerError`.
    """
    answer = text.strip()
    if answer == NO_KEY_SENTENCES:
        return []
    if not _SENTENCE_ANSWER.fullmatch(answer):
        raise FilterAnswerError(f"sentence answer must be {NO_KEY_SENTENCES!r} or numbers like "
                                f"'1, 3', got {text!r}")
    numbers = [int(part) for part in answer.split(", ")]
    if any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
        raise FilterAnswerError(f"sentence numbers must be increasing and distinct, got {text!r}")
    if numbers[-1] > n_sentences:
        raise FilterAnswerError(f"sentence answer {text!r} names sentence {numbers[-1]} but the "
                                f"chunk has {n_sentences}")
    return [n - 1 for n in numbers]


def card_format(card: Mapping[str, Any] | None) -> FilterFormat:
    """The filter format a card was trained in (no card, or no key: two_stage)."""
    value = (card or {}).get(FORMAT_KEY, "two_stage")
    if value not in FORMAT_TEMPLATES:
        raise FilterAnswerError(f"filter card names format {value!r}; this sieverag reads "
                                f"{' and '.join(FORMAT_TEMPLATES)}: update sieverag")
    return value


def marked_sentences(sentences: Sequence[str], title: str = "") -> str:
    """The sentences one per line, each followed by `LABEL_MARK` (marks already in the text
    removed), after the title line (if any)."""
    lines = [title.replace(LABEL_MARK, "")] if title else []
    lines.extend(sentence.replace(LABEL_MARK, "").strip() + LABEL_MARK for sentence in sentences)
    return "\n".join(lines)


def passage_prompt(question: str, sentences: Sequence[str], title: str = "") -> Conversation:
    """The one-pass prompt: instruction, question, the chunk's sentences with a label mark
    after each."""
    if not sentences:
        raise ValueError("passage_prompt needs at least one sentence")
    return load_template(PASSAGE_TEMPLATE).messages(
        question=question, sentences=marked_sentences(sentences, title))


def passage_verdicts(read: Sequence[Mapping[str, float]], n_sentences: int
                     ) -> tuple[float, list[float | None]]:
    """(the passage's s, each sentence's s) from one `marked_label_logprobs` result, where
    s = log P("Yes") − log P("No"); sentences a context cut left unread are None."""
    *sentence_reads, passage = read
    if len(sentence_reads) > n_sentences:
        raise FilterAnswerError(f"{len(sentence_reads)} sentence verdicts for {n_sentences} "
                                "sentences")
    scores: list[float | None] = [relevance_log_odds(r) for r in sentence_reads]
    scores.extend([None] * (n_sentences - len(sentence_reads)))
    return relevance_log_odds(passage), scores


def passage_record(
    *, question: str, sentences: Sequence[str], key_sentences: Iterable[int] | None,
    relevant: bool, source: str, question_id: str, title: str = "",
    evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `passage` training record: the one-pass prompt → the passage's "Yes"/"No", with
    `sentence_labels`: "Yes" for each of the 0-based `key_sentences`, else "No"; every entry
    None (no sentence is taught, the passage's verdict is) when `key_sentences` is None."""
    keys = None if key_sentences is None else set(key_sentences)
    if keys and (min(keys) < 0 or max(keys) >= len(sentences)):
        raise ValueError(f"key sentence indices {sorted(keys)} out of range for "
                         f"{len(sentences)} sentences")
    record = _record("passage", passage_prompt(question, sentences, title),
                     chunk_answer(relevant), source, question_id, evidence or {})
    record["sentence_labels"] = [None if keys is None else chunk_answer(i in keys)
                                 for i in range(len(sentences))]
    return record


def passage_training_ids(tokenizer: Any, record: Mapping[str, Any]) -> dict[str, list[int]]:
    """`input_ids` and `labels` of a `passage` record, as the trainer reads them: the ids a
    backend's `marked_label_logprobs` runs, then the passage's label token; `labels` holds,
    at the token after each read position (the causal shift), the verdict's token there, and
    `IGNORED` everywhere else (and for a sentence whose label is None). The verdict tokens
    are "Yes"/"No" as the model emits them after the assistant prefix."""
    text = chat_prompt_text(tokenizer, record["prompt"])
    ids, marks = marked_prompt_ids(tokenizer, text)
    verdicts = [*record["sentence_labels"], record["completion"][0]["content"]]
    if len(marks) != len(verdicts) - 1:
        raise ValueError(f"passage record {record.get('question_id')!r}: {len(marks)} label "
                         f"marks for {len(verdicts) - 1} sentence labels")
    token = {label: _label_token(tokenizer, text, ids, label) for label in CHUNK_LABELS}
    input_ids = [*ids, token[verdicts[-1]]]
    labels = [IGNORED] * len(input_ids)
    for position, verdict in zip([*marks, len(ids) - 1], verdicts, strict=True):
        if verdict is not None:
            labels[position + 1] = token[verdict]
    return {"input_ids": input_ids, "labels": labels}


def training_token_count(tokenizer: Any, record: Mapping[str, Any]) -> int:
    """Tokens the trainer reads for a record: a passage record's `passage_training_ids`, a
    chunk or sentence record's chat-templated prompt and completion."""
    if record.get("task") == "passage":
        return len(passage_training_ids(tokenizer, record)["input_ids"])
    return len(tokenizer.apply_chat_template(list(record["prompt"]) + list(record["completion"]),
                                             tokenize=True, return_dict=True)["input_ids"])


def _label_token(tokenizer: Any, text: str, ids: list[int], label: str) -> int:
    from sieverag.inference.llm.hf import reply_token_ids

    label_ids = reply_token_ids(tokenizer, text, ids, label)
    if len(label_ids) != 1:
        raise ValueError(f"the one-pass filter reads one token per verdict; {label!r} is "
                         f"{len(label_ids)} tokens in this tokenizer")
    return label_ids[0]


def _record(task: Task, prompt: Conversation, completion: str, source: str, question_id: str,
            evidence: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": completion}],
        "task": task,
        "source": source,
        "question_id": question_id,
        "evidence": dict(evidence),
    }


def chunk_record(
    *, question: str, chunk_text: str, relevant: bool, source: str, question_id: str,
    title: str = "", evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `chunk` training record: chunk prompt → "Yes"/"No", with provenance columns."""
    return _record("chunk", chunk_prompt(question, chunk_text, title), chunk_answer(relevant),
                   source, question_id, evidence or {})


def sentence_record(
    *, question: str, sentences: Sequence[str], key_sentences: Iterable[int], source: str,
    question_id: str, title: str = "", evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `sentence` training record: numbered sentences → "1, 3" / "none" (0-based input)."""
    keys = sorted(set(key_sentences))
    if keys and keys[-1] >= len(sentences):
        raise ValueError(f"key sentence index {keys[-1]} out of range for "
                         f"{len(sentences)} sentences")
    return _record("sentence", sentence_prompt(question, sentences, title), sentence_answer(keys),
                   source, question_id, evidence or {})
