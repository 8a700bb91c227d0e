"""The built-in dataset formats, each registered under its name (see ../shared/data/README.md
for the files themselves):

- `hotpotqa`: `{id, question, answers, passages[{title, text, sentences?, is_gold}],
  supporting_facts}`; supporting facts become each passage's `supporting_sentences`.
- `nq`: NQ-open with its oracle passage, `{question, answers, ctxs[{title, text, hasanswer,
  isgold}], nq_annotated_gold}`, usually gzip-compressed.
- `popqa`: PopQA long-tail with two CRAG knowledge texts per question as its documents; the
  original PopQA (hub `akariasai/PopQA`, `possible_answers` a JSON list string) has none.
- `squad`: the official nested SQuAD v1.1 JSON, zipped or not; one example per question whose
  single document is its gold paragraph.
- `common`: `{id?, question, answers | golden_answers, ctxs[{title, text, is_gold? | isgold? |
  hasanswer?}]}` as written by Self-RAG and FlashRAG (FlashRAG's `{id, question,
  golden_answers, metadata}` rows have no documents).
- `triviaqa`: `{id, question, answers}`, no documents.
- `arc`: ARC-Challenge, `{id, question, choices{text, label}, answerKey}` (also the hub's
  `ai2_arc`).

The benchmarks' own published schemas (hub datasets and official releases) are in
`standard_schemas`. Documents get ids stable across runs: `f"{example_id}/{position}"`
(`squad-p{n}` for SQuAD paragraphs); rows without an id get `f"{format}-{line_number}"` (a
table's rows: `f"{format}-{row}"`, from 0). The SQuAD paragraphs are also a retrieval corpus
(`load_squad_paragraphs`, `load_squad_corpus`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.files import Record, check_readable, json_type, load_json_document
from sieverag.inference.data.formats import register_format, register_record_format
from sieverag.inference.data.record_fields import (
    RecordSource,
    answer_aliases,
    example_metadata,
    gold_flag,
    list_field,
    literal_list,
    optional_str,
    optional_strings,
    question_only_example,
    question_text,
    record_id,
    sentence_text,
    supporting_facts,
    titled_passage,
)


def load_squad_paragraphs(path: str | Path) -> list[Document]:
    """The paragraphs of an official SQuAD file as a retrieval corpus, ids `squad-p{n}`.

    `n` counts paragraphs from 0 in file order; titles are the article titles with
    underscores as spaces; `is_gold` is None (gold-ness belongs to a question).
    """
    return [paragraph for paragraph, _ in _iter_squad(Path(path))]


def load_squad_corpus(path: str | Path) -> tuple[list[Document], list[Example]]:
    """The SQuAD paragraphs (as `load_squad_paragraphs`) and every question as an Example.

    Each example's single document is its paragraph marked gold, and
    `metadata["gold_doc_id"]` names that paragraph's id in the corpus.
    """
    paragraphs: list[Document] = []
    examples: list[Example] = []
    for paragraph, questions in _iter_squad(Path(path)):
        paragraphs.append(paragraph)
        examples.extend(questions)
    return paragraphs, examples


@register_record_format(
    "hotpotqa",
    documents_from="'passages'",
    name_hints=("hotpotqa", "hotpot"),
    record_signatures=(("question", "answers", "passages"),),
)
def _parse_hotpotqa(record: Record, source: RecordSource) -> Example:
    """HotpotQA distractor: 10 passages, gold marked, supporting facts on some rows.

    Where the row has `supporting_facts`, every passage gets `supporting_sentences` (see
    `titled_passage`).
    """
    example_id = record_id(record, source)
    supporting = supporting_facts(record.get("supporting_facts"), source)
    documents = []
    for index, passage in enumerate(list_field(record, "passages", source)):
        where = f"passages[{index}]"
        if not isinstance(passage, dict):
            raise source.error(f"{where} is {json_type(passage)}, expected an object")
        sentences = optional_strings(passage.get("sentences"), source, f"{where}.sentences")
        text = passage.get("text")
        if text is None and sentences is not None:
            text = sentence_text(sentences)
        if not isinstance(text, str):
            raise source.error(f"{where} has no 'text' string")
        title = optional_str(passage, "title", source, where)
        documents.append(titled_passage(example_id, index, title, text, sentences,
                                        gold_flag(passage, ("is_gold",), source, where),
                                        supporting))
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(record.get("answers"), source, "answers"),
        documents=tuple(documents),
        metadata=example_metadata("hotpotqa", record, ("type", "level"), source),
    )


@register_record_format(
    "nq",
    documents_from="'ctxs'",
    name_hints=("nq",),
    record_signatures=(("question", "answers", "ctxs", "nq_annotated_gold"),),
)
def _parse_nq(record: Record, source: RecordSource) -> Example:
    """NQ-open oracle: `isgold` marks the gold passage, `hasanswer` stands in where absent."""
    return _parse_ctxs_record("nq", record, source)


@register_record_format(
    "common",
    documents_from="'ctxs'",
    record_signatures=(
        ("question", "answers", "ctxs"),
        ("question", "golden_answers", "ctxs"),
        ("question", "golden_answers"),
    ),
)
def _parse_common(record: Record, source: RecordSource) -> Example:
    """Self-RAG / FlashRAG jsonl; `golden_answers` is read where `answers` is absent. An
    optional `source` string names the dataset the row came from (as `sieverag
    hard-negatives` writes it); without one the row's source is `common`."""
    name = optional_str(record, "source", source, "record").strip() or "common"
    return _parse_ctxs_record(name, record, source)


_POPQA_KNOWLEDGE_FIELDS = ("crag_refined_retrieved_knowledge", "crag_web_search_knowledge")


@register_record_format(
    "popqa",
    documents_from=" or ".join(f"'{field}'" for field in _POPQA_KNOWLEDGE_FIELDS),
    name_hints=("popqa",),
    record_signatures=(("question", "answers", "s_wiki_title"),
                       ("question", "possible_answers", "s_wiki_title")),
)
def _parse_popqa(record: Record, source: RecordSource) -> Example:
    """PopQA: documents are the non-empty CRAG knowledge texts, titled by `s_wiki_title`.

    A document's id keeps its field's position (`/0` refined retrieval, `/1` web search) even
    when the other is empty. `answers` may be a JSON list or a string holding a JSON or Python
    list literal; a string not starting with "[" is one answer. `possible_answers` (the
    original PopQA's field, as in the hub's `akariasai/PopQA`, whose rows have no knowledge
    texts and so no documents) is read where `answers` is absent.
    """
    example_id = record_id(record, source)
    title = optional_str(record, "s_wiki_title", source, "record")
    documents = []
    for index, field in enumerate(_POPQA_KNOWLEDGE_FIELDS):
        text = optional_str(record, field, source, "record").strip()
        if text:
            documents.append(Document(id=f"{example_id}/{index}", text=text, title=title))
    field = "answers" if "answers" in record else "possible_answers"
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(literal_list(record.get(field), source, field), source, field),
        documents=tuple(documents),
        metadata=example_metadata("popqa", record,
                                  ("prop", "pop", "s_pop", "s_wiki_title", "question_id"),
                                  source),
    )


@register_record_format(
    "triviaqa",
    documents_from=None,
    name_hints=("triviaqa", "tqa"),
    record_signatures=(("question", "answers"),),
)
def _parse_triviaqa(record: Record, source: RecordSource) -> Example:
    """TriviaQA questions with their answer aliases, no documents."""
    return question_only_example("triviaqa", record, source, "answers", ("question_id",))


@register_record_format(
    "arc",
    documents_from=None,
    name_hints=("arc",),
    record_signatures=(("question", "choices", "answerKey"),),
)
def _parse_arc(record: Record, source: RecordSource) -> Example:
    """ARC multiple choice: `choices` label → text, answers = (correct text, its label).

    Score ARC with `metrics.choice_accuracy`; the answers are there for the answer metrics,
    where the one-letter label alias would match any prediction holding that letter as a word.
    """
    choices = record.get("choices")
    if not isinstance(choices, dict):
        raise source.error("record has no 'choices' object ({text: [...], label: [...]})")
    texts = optional_strings(choices.get("text"), source, "choices.text") or ()
    labels = optional_strings(choices.get("label"), source, "choices.label") or ()
    if not labels or len(labels) != len(texts):
        raise source.error(
            f"'choices' needs as many labels as texts, got {len(labels)} and {len(texts)}"
        )
    options = dict(zip(labels, texts, strict=True))
    key = record.get("answerKey")
    if key not in options:
        raise source.error(f"answerKey {key!r} is not one of the labels {', '.join(labels)}")
    return Example(
        id=record_id(record, source),
        question=question_text(record, source),
        answers=answer_aliases([options[key], key], source, "answerKey"),
        choices=options,
        answer_key=key,
        metadata=example_metadata("arc", record, (), source),
    )


@register_format("squad", name_hints=("squad",), record_signatures=(("data",),))
def _read_squad(path: Path, require_documents: bool) -> Iterator[Example]:
    """Official SQuAD JSON (zipped or plain): one example per question, paragraph as gold."""
    for _, questions in _iter_squad(path):
        yield from questions


def squad_title(title: Any) -> str:
    """A SQuAD article title as text: its underscores as spaces ("Super_Bowl_50")."""
    return str(title or "").replace("_", " ")


def squad_answer_texts(answers: Any) -> Any:
    """SQuAD answers as their texts: from `[{text, answer_start}]` (the official file) or
    from the hub's columns `{text: [...], answer_start: [...]}`; anything else unchanged."""
    if isinstance(answers, dict):
        return answers.get("text")
    if isinstance(answers, list):
        return [answer.get("text") if isinstance(answer, dict) else answer for answer in answers]
    return answers


def _parse_ctxs_record(name: str, record: Record, source: RecordSource) -> Example:
    """A `{question, answers, ctxs}` record; gold from is_gold, else isgold, else hasanswer."""
    example_id = record_id(record, source)
    documents = []
    for index, ctx in enumerate(list_field(record, "ctxs", source)):
        where = f"ctxs[{index}]"
        if not isinstance(ctx, dict):
            raise source.error(f"{where} is {json_type(ctx)}, expected an object")
        text = ctx.get("text")
        if not isinstance(text, str):
            raise source.error(f"{where} has no 'text' string")
        documents.append(
            Document(
                id=f"{example_id}/{index}",
                text=text,
                title=optional_str(ctx, "title", source, where),
                is_gold=gold_flag(ctx, ("is_gold", "isgold", "hasanswer"), source, where),
            )
        )
    field = "answers" if "answers" in record else "golden_answers"
    return Example(
        id=example_id,
        question=question_text(record, source),
        answers=answer_aliases(record.get(field), source, field),
        documents=tuple(documents),
        metadata=example_metadata(name, record, (), source),
    )


def _iter_squad(path: Path) -> Iterator[tuple[Document, list[Example]]]:
    """Each SQuAD paragraph (is_gold None) with its questions as examples."""
    check_readable(path)
    document = load_json_document(path)
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list):
        raise DatasetError(
            f"{path}: not the official SQuAD layout (expected {{'data': [{{'title', "
            "'paragraphs': [{'context', 'qas'}]}]}); pass the official dev/train file"
        )
    paragraph_count = 0
    question_count = 0
    for a, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DatasetError(f"{path}, data[{a}]: has no 'paragraphs' array")
        title = squad_title(article.get("title"))
        paragraphs = article["paragraphs"]
        for p, paragraph in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str):
                raise DatasetError(f"{path}, {where}: has no 'context' string")
            corpus_doc = Document(id=f"squad-p{paragraph_count}", text=context, title=title)
            gold_doc = replace(corpus_doc, is_gold=True)
            paragraph_count += 1
            questions = []
            for q, qa in enumerate(paragraph.get("qas") or []):
                source = RecordSource(path, f"{where}.qas[{q}]", f"squad-q{question_count}")
                question_count += 1
                if not isinstance(qa, dict):
                    raise source.error(f"is {json_type(qa)}, expected an object")
                questions.append(
                    Example(
                        id=record_id(qa, source),
                        question=question_text(qa, source),
                        answers=answer_aliases(squad_answer_texts(qa.get("answers") or []),
                                               source, "answers"),
                        documents=(gold_doc,),
                        metadata={"dataset": "squad", "gold_doc_id": corpus_doc.id},
                    )
                )
            yield corpus_doc, questions
