"""The six kinds of text the default selection is chosen on, leave-one-source-out (issue 53),
written from the public QA data as common-format passage sets (`sieverag hard-negatives`'s
output), one file per source:

* `hotpotqa` — HotpotQA distractor as it is (10 Wikipedia paragraphs, 2 gold); not copied.
* `nq`, `squad` — each question's gold passage and 5 hybrid-retrieved hard negatives.
* `popqa` — PopQA's two knowledge texts and 4 hard negatives, gold by STRINC.
* `popqa-web` — short, noisy web-style snippets: PopQA's web-search knowledge split into its
  snippets ("Title: text ; Title: text ..."), questions with at least 3 of them, and 5 hard
  negatives mined from every question's snippets; gold by STRINC.
* `triviaqa` (file `trivia-retrieved.jsonl`: a name holding "triviaqa" reads as the
  question-only TriviaQA format) — passages retrieved for TriviaQA's questions (hybrid,
  top 8) from an index of every HotpotQA, NQ, SQuAD and PopQA passage, labelled by STRINC;
  questions with at least one gold and one other passage.

    python tests/benchmarks/filter_sources.py --data ../shared/data --out runs/sources

Not a benchmark itself: `bench_default_left_out.py` reads what it writes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from sieverag.data_gen.passages import PassageSetConfig, common_row, mine_passages
from sieverag.data_gen.strinc import strinc
from sieverag.inference.core.io_utils import write_atomic
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import load_examples

WEB_SEPARATOR = " ; "
TRIVIAQA_DEPTH = 8


def mined(dataset: Path, out: Path, *, sample: int, negatives: int, strinc_gold: bool) -> None:
    """`sieverag hard-negatives` (hybrid), then STRINC marks where the source has none."""
    raw = out.with_suffix(".raw.jsonl") if strinc_gold else out
    print(mine_passages(PassageSetConfig(dataset=str(dataset), out=str(raw), sample=sample,
                                         negatives=negatives, retriever="hybrid")))
    if strinc_gold:
        print(mine_passages(PassageSetConfig(dataset=str(raw), out=str(out), negatives=0,
                                             unmarked_gold="strinc")))


def web_snippets(popqa: Path, out: Path, min_snippets: int = 3) -> None:
    """PopQA's web-search knowledge as one snippet a passage (title before the first ': ')."""
    rows = []
    for line in popqa.read_text(encoding="utf-8").splitlines():
        example = json.loads(line)
        parts = [p.strip() for p in example["crag_web_search_knowledge"].split(WEB_SEPARATOR)]
        parts = [p for p in parts if p]
        if len(parts) < min_snippets:
            continue
        ctxs = []
        for part in parts:
            title, _, text = part.partition(": ")
            ctxs.append({"title": title if text else "", "text": text or title,
                         "is_gold": None})
        answers = example["answers"]
        rows.append({"id": f"popqa-web-{len(rows)}", "source": "popqa-web",
                     "question": example["question"],
                     "answers": answers if isinstance(answers, list) else _literal(answers),
                     "ctxs": ctxs})
    write_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _literal(text: str) -> list[str]:
    import ast

    return list(ast.literal_eval(text))


def triviaqa_over_index(data: Path, out: Path, sample: int, seed: int = 0) -> None:
    """TriviaQA's questions, each with the top passages hybrid retrieval finds in every
    passage of the other sources, marked by STRINC."""
    from sieverag.data_gen.passages import _rank

    corpus: dict[tuple[str, str], Document] = {}
    for name in ("hotpotqa_distractor.jsonl", "nq-open-oracle.jsonl.gz",
                 "squad_dev_v1.1.json.zip", "popqa_longtail_with_passages.jsonl"):
        for example in load_examples(str(data / name)):
            for document in example.documents:
                corpus.setdefault((document.title, document.text),
                                  Document(id=f"c{len(corpus)}", text=document.text,
                                           title=document.title))
    passages = list(corpus.values())
    questions = load_examples(str(data / "triviaqa_test_ctrla.jsonl"))
    questions = random.Random(seed).sample(questions, min(len(questions), sample))
    print(f"triviaqa: {len(questions)} questions over {len(passages)} passages")
    rankings = _rank(PassageSetConfig(dataset="-", out="-", retriever="hybrid"),
                     [q.question for q in questions], passages, k=TRIVIAQA_DEPTH)
    rows = []
    for question, ranking in zip(questions, rankings, strict=True):
        documents = [passages[p] for p in ranking[:TRIVIAQA_DEPTH]]
        marks = [strinc(d.as_context(), question.answers) for d in documents]
        if any(marks) and not all(marks):
            rows.append(common_row(Example(
                id=question.id, question=question.question, answers=question.answers,
                documents=tuple(Document(id=f"{question.id}/{i}", text=d.text, title=d.title,
                                         is_gold=m)
                                for i, (d, m) in enumerate(zip(documents, marks, strict=True))),
                metadata={"source": "triviaqa"})) | {"source": "triviaqa"})
    print(f"triviaqa: {len(rows)} questions with gold and other passages")
    write_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("runs/sources"))
    parser.add_argument("--sample", type=int, default=160, help="questions drawn per source")
    args = parser.parse_args()
    data, out = args.data, args.out
    out.mkdir(parents=True, exist_ok=True)
    mined(data / "nq-open-oracle.jsonl.gz", out / "nq.jsonl", sample=args.sample,
          negatives=5, strinc_gold=False)
    mined(data / "squad_dev_v1.1.json.zip", out / "squad.jsonl", sample=args.sample,
          negatives=5, strinc_gold=False)
    mined(data / "popqa_longtail_with_passages.jsonl", out / "popqa.jsonl",
          sample=args.sample, negatives=4, strinc_gold=True)
    web_snippets(data / "popqa_longtail_with_passages.jsonl", out / "popqa-web.all.jsonl")
    mined(out / "popqa-web.all.jsonl", out / "popqa-web.jsonl", sample=args.sample,
          negatives=5, strinc_gold=True)
    triviaqa_over_index(data, out / "trivia-retrieved.jsonl", sample=4 * args.sample)


if __name__ == "__main__":
    main()
