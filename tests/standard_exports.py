"""Rows of the benchmarks' published schemas (as the Hugging Face hub ships them), built from
the project's own layouts: the test helper that turns `../shared/data` files (and the sample
files in tests/data) into what a user exports from the hub, so measurements and tests load
them through the same adapters a user's export goes through — never converted by hand.

Each `*_rows` function takes the rows of one file in the project's layout and returns
`(questions, passages)`: the question rows in the hub schema, and the passages the rows
carried (`{id, title, text}`, a retrieval corpus; empty where the dataset has none).

- HotpotQA → hub `hotpot_qa` (distractor): `{id, question, answer, type, level, context
  {title, sentences}, supporting_facts {title, sent_id}}`. A row whose gold is marked per
  passage only (no sentence indices) lists every sentence of its gold passages.
- NQ-open → hub `nq_open`: `{question, answer}`; the passages are its `ctxs`.
- TriviaQA → hub `trivia_qa` (`*.nocontext`): `{question_id, question, answer{value, aliases,
  normalized_aliases}}`.
- PopQA → hub `akariasai/PopQA`: `{id, subj, prop, question, possible_answers (a JSON
  string), s_wiki_title, s_pop}`; the passages are its retrieved knowledge texts.
- ARC → hub `ai2_arc` rows are already the project's layout: copied.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def read_jsonl(path: Path, limit: int | None = None) -> list[Row]:
    """The first `limit` rows of a (gzipped) jsonl file."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def write_jsonl(path: Path, rows: Iterable[Row]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _sentences(passage: Row) -> list[str]:
    given = passage.get("sentences")
    if given:
        return list(given)
    return [s for s in _SENTENCE_END.split(passage["text"].strip()) if s]


def hotpotqa_rows(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    questions, passages = [], {}
    for row in rows:
        titles = [p["title"] for p in row["passages"]]
        sentences = [_sentences(p) for p in row["passages"]]
        facts = row.get("supporting_facts")
        if facts:
            fact_titles, fact_ids = [t for t, _ in facts], [i for _, i in facts]
        else:  # gold marked per passage only: every sentence of a gold passage is key
            fact_titles, fact_ids = [], []
            for passage, its_sentences in zip(row["passages"], sentences, strict=True):
                if passage.get("is_gold"):
                    fact_titles += [passage["title"]] * len(its_sentences)
                    fact_ids += list(range(len(its_sentences)))
        questions.append({
            "id": row["id"], "question": row["question"], "answer": row["answers"][0],
            "type": row.get("type", ""), "level": row.get("level", ""),
            "supporting_facts": {"title": fact_titles, "sent_id": fact_ids},
            "context": {"title": titles, "sentences": sentences},
        })
        for title, its_sentences in zip(titles, sentences, strict=True):
            passages.setdefault(title, {"id": f"wiki:{title}", "title": title,
                                        "text": " ".join(its_sentences)})
    return questions, list(passages.values())


def nq_open_rows(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    questions = [{"question": row["question"], "answer": list(row["answers"])} for row in rows]
    passages: dict[tuple[str, str], Row] = {}
    for row in rows:
        for ctx in row.get("ctxs", []):
            key = (ctx.get("title", ""), ctx["text"])
            passages.setdefault(key, {"id": f"nq-ctx:{len(passages)}", "title": key[0],
                                      "text": key[1]})
    return questions, list(passages.values())


def triviaqa_rows(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    questions = [{
        "question_id": str(row.get("id", row.get("question_id"))), "question": row["question"],
        "answer": {"value": row["answers"][0], "aliases": list(row["answers"]),
                   "normalized_aliases": sorted({a.lower() for a in row["answers"]})},
    } for row in rows]
    return questions, []


def popqa_rows(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    questions, passages = [], []
    for row in rows:
        answers = row["answers"]
        if isinstance(answers, str):
            answers = ast.literal_eval(answers) if answers.startswith("[") else [answers]
        questions.append({
            "id": row["id"], "subj": row["s_wiki_title"], "prop": row["prop"],
            "question": row["question"], "possible_answers": json.dumps(list(answers)),
            "s_wiki_title": row["s_wiki_title"], "s_pop": row.get("pop", 0),
        })
        for index, field in enumerate(("crag_refined_retrieved_knowledge",
                                       "crag_web_search_knowledge")):
            text = (row.get(field) or "").strip()
            if text:
                passages.append({"id": f"popqa:{row['id']}/{index}",
                                 "title": row["s_wiki_title"], "text": text})
    return questions, passages


def arc_rows(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    return [dict(row) for row in rows], []


EXPORTS = {"hotpotqa": hotpotqa_rows, "nq-open": nq_open_rows, "triviaqa": triviaqa_rows,
           "popqa": popqa_rows, "arc-challenge": arc_rows}
