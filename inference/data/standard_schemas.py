"""The benchmarks' own published schemas, as the Hugging Face hub and the official releases
ship them (read from jsonl or parquet files, save_to_disk folders or `hf:NAME[:CONFIG]:SPLIT`),
each mapped to `Example` by one adapter registered under its format name:

- `hotpotqa-original`: HotpotQA (hub `hotpot_qa` distractor / fullwiki; the official release
  as jsonl): `{id | _id, question, answer, type, level, context, supporting_facts}`, where
  context and supporting facts are `[title, x]` pairs (official) or columns `{title: [...],
  sentences | sent_id: [...]}` (hub). Passages are the context; a passage is gold when a
  supporting fact names its title, and those facts are its key sentences.
- `2wikimultihopqa`: 2WikiMultihopQA, HotpotQA's layout plus `evidences`.
- `triviaqa-original`: hub `trivia_qa` (rc, unfiltered and their nocontext configs),
  `{question_id, question, answer{value, aliases}, entity_pages, search_results}`; documents
  are the Wikipedia pages (`wiki_context`) then the web results (`search_context`), where
  the row has them.
- `nq-open`: hub `nq_open`, `{question, answer: [...]}`, no documents.
- `squad-flat`: hub `squad`'s rows `{id, title, context, question, answers{text,
  answer_start}}`; the context is the gold document.
- `asqa`: hub `din0s/asqa`, `{sample_id, ambiguous_question, qa_pairs[{question,
  short_answers, context, wikipage}], wikipages, annotations[{long_answer, knowledge}]}`;
  answers are every disambiguation's short answers, documents the disambiguations' Wikipedia
  contexts (gold); `metadata` keeps `qa_pairs` (question, short answers) and `long_answers`.

PopQA (hub `akariasai/PopQA`), ARC (hub `ai2_arc`) and FlashRAG's `{id, question,
golden_answers, metadata}` jsonl are read by the `popqa`, `arc` and `common` formats
(`readers`).
"""

from __future__ import annotations

from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.files import Record, json_type
from sieverag.inference.data.formats import register_record_format
from sieverag.inference.data.readers import squad_answer_texts, squad_title
from sieverag.inference.data.record_fields import (
    RecordSource,
    answer_aliases,
    example_metadata,
    object_rows,
    optional_str,
    optional_strings,
    question_only_example,
    question_text,
    record_id,
    sentence_text,
    supporting_facts,
    title_pairs,
    titled_passage,
)

_HOTPOT_KEYS = ("question", "answer", "context", "supporting_facts")


@register_record_format(
    "hotpotqa-original",
    documents_from="'context'",
    record_signatures=(_HOTPOT_KEYS,),
)
def _parse_hotpotqa_original(record: Record, source: RecordSource) -> Example:
    """HotpotQA as released (or on the hub): passages from `context`, gold by supporting facts."""
    return _titled_sentences_example("hotpotqa", record, source, ("type", "level"))


@register_record_format(
    "2wikimultihopqa",
    documents_from="'context'",
    name_hints=("2wikimultihopqa", "2wiki"),
    record_signatures=((*_HOTPOT_KEYS, "evidences"),),
)
def _parse_2wikimultihopqa(record: Record, source: RecordSource) -> Example:
    """2WikiMultihopQA: HotpotQA's layout (its `evidences` triples are not kept)."""
    return _titled_sentences_example("2wikimultihopqa", record, source, ("type",))


def _titled_sentences_example(name: str, record: Record, source: RecordSource,
                              kept: tuple[str, ...]) -> Example:
    """A record in HotpotQA's layout: one passage per `(title, sentences)` of `context`; where
    the record has supporting facts, the passages they name are gold and the rest not."""
    example_id = record_id(record, source, ("id", "_id"))
    supporting = supporting_facts(record.get("supporting_facts"), source)
    documents = []
    pairs = title_pairs(record.get("context"), source, "context", "sentences")
    for index, (title, raw_sentences) in enumerate(pairs):
        sentences = optional_strings(raw_sentences, source, f"context[{index}] sentences") or ()
        is_gold = None if supporting is None else title in supporting
        documents.append(titled_passage(example_id, index, title, sentence_text(sentences),
                                        sentences, is_gold, supporting))
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(record.get("answer"), source, "answer"),
        documents=tuple(documents),
        metadata=example_metadata(name, record, kept, source),
    )


# (field, the key of its rows' text): TriviaQA's Wikipedia pages, then its web results.
_TRIVIAQA_CONTEXTS = (("entity_pages", "wiki_context"), ("search_results", "search_context"))


@register_record_format(
    "triviaqa-original",
    documents_from=" or ".join(f"'{field}'" for field, _ in _TRIVIAQA_CONTEXTS),
    record_signatures=(("question", "question_id", "answer"),),
)
def _parse_triviaqa_original(record: Record, source: RecordSource) -> Example:
    """TriviaQA on the hub: answers = `answer.value` then `answer.aliases`; documents = the
    non-empty contexts, pages before web results, each titled by its row's `title`."""
    example_id = record_id(record, source, ("question_id", "id"))
    answer = record.get("answer")
    if not isinstance(answer, dict):
        raise source.error(f"'answer' is {json_type(answer)}, expected an object "
                           "{value, aliases}")
    aliases = optional_strings(answer.get("aliases"), source, "answer.aliases") or ()
    values = [value for value in (answer.get("value"), *aliases) if value is not None]
    documents = []
    for field, text_key in _TRIVIAQA_CONTEXTS:
        for index, row in enumerate(object_rows(record.get(field), source, field)):
            text = optional_str(row, text_key, source, f"{field}[{index}]")
            if text.strip():
                documents.append(Document(
                    id=f"{example_id}/{len(documents)}", text=text,
                    title=optional_str(row, "title", source, f"{field}[{index}]")))
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(values, source, "answer"),
        documents=tuple(documents),
        metadata=example_metadata("triviaqa", record, ("question_source",), source),
    )


@register_record_format(
    "nq-open",
    documents_from=None,
    record_signatures=(("question", "answer"),),
)
def _parse_nq_open(record: Record, source: RecordSource) -> Example:
    """NQ-open questions with their answer list, no documents (ids `nq-open-<row>`)."""
    return question_only_example("nq", record, source, "answer")


@register_record_format(
    "squad-flat",
    documents_from="'context'",
    record_signatures=(("question", "answers", "context"),),
)
def _parse_squad_flat(record: Record, source: RecordSource) -> Example:
    """SQuAD's hub rows: one question, its paragraph as the single gold document."""
    example_id = record_id(record, source)
    context = optional_str(record, "context", source, "record")
    documents = ()
    if context.strip():
        documents = (Document(id=f"{example_id}/0", text=context, is_gold=True,
                              title=squad_title(record.get("title"))),)
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(squad_answer_texts(record.get("answers")), source, "answers"),
        documents=documents,
        metadata=example_metadata("squad", record, (), source),
    )


_ASQA_NO_CONTEXT = "No context provided"  # what ASQA writes where a pair has no context


@register_record_format(
    "asqa",
    documents_from="the 'qa_pairs' contexts",
    name_hints=("asqa",),
    record_signatures=(("ambiguous_question", "qa_pairs"),),
)
def _parse_asqa(record: Record, source: RecordSource) -> Example:
    """ASQA: the ambiguous question, answered by any disambiguation's short answers; each
    distinct disambiguation context is a gold document titled by its Wikipedia page."""
    example_id = record_id(record, source, ("sample_id", "id"))
    answers: list[str] = []
    qa_pairs = []
    documents: list[Document] = []
    for index, pair in enumerate(object_rows(record.get("qa_pairs"), source, "qa_pairs")):
        where = f"qa_pairs[{index}]"
        short = optional_strings(pair.get("short_answers"), source, f"{where}.short_answers")
        answers.extend(short or ())
        qa_pairs.append({"question": optional_str(pair, "question", source, where),
                         "short_answers": list(short or ())})
        context = optional_str(pair, "context", source, where).strip()
        if context and context != _ASQA_NO_CONTEXT and all(d.text != context for d in documents):
            documents.append(Document(id=f"{example_id}/{len(documents)}", text=context,
                                      title=optional_str(pair, "wikipage", source, where),
                                      is_gold=True))
    long_answers = [
        optional_str(annotation, "long_answer", source, f"annotations[{index}]")
        for index, annotation in enumerate(
            object_rows(record.get("annotations"), source, "annotations"))
    ]
    return Example(
        id=example_id,
        question=question_text(record, source, "ambiguous_question"),
        answers=answer_aliases(answers, source, "qa_pairs[].short_answers"),
        documents=tuple(documents),
        metadata={**example_metadata("asqa", record, (), source), "qa_pairs": qa_pairs,
                  "long_answers": long_answers},
    )
