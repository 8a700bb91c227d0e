"""Passage sets for filter training and evaluation: each question's own passages plus
negatives, the passages a filter meets at inference.

* **Hard negatives** (`mine_passages`, the `sieverag hard-negatives` command): the top
  passages a retriever (BM25, dense or their reciprocal-rank fusion) returns for the question
  from the source's own corpus — every passage of every question of the file, deduplicated,
  blank ones left out — that are not the question's own and do not contain a gold answer
  alias (the rule of DPR, Karpukhin et al., 2020: a retrieved passage holding the answer may
  well be relevant, so it is no negative).
* **Borrowed negatives** (`with_borrowed_negatives`, `label --borrowed-negatives`): random
  passages of other questions.

An added negative is marked `is_gold: false` where the question's data marks gold (NQ's
`isgold`, SQuAD's paragraph), and left unmarked (None) where it does not (PopQA), so the
label policy's `gold` setting treats it like the source's own passages (`negative_mark`).

Shapes (`--shape`): `passage` keeps each passage as it is; `snippet` turns every passage
into a short untitled web-style snippet: the window of `snippet_sentences` consecutive
sentences that BM25 ranks highest for the question (a search engine's query-biased
snippet), a gold passage's window chosen among those holding an answer alias. Short
snippets about the question's entity, without titles, are the data a filter trained on
Wikipedia paragraphs has never seen.

`unmarked_gold: strinc` marks the question's own unmarked passages by STRINC (contains a
gold alias), for evaluation sets of sources without gold marks; training sets leave them
unmarked so the label policy decides.

The output is common-format jsonl (`{id, source, question, answers, ctxs[{title, text,
is_gold}]}`), read by every command that takes a dataset; `source` keeps the name of the
dataset the rows came from, so labels, training splits and evaluation reports name it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from sieverag.data_gen.strinc import strinc
from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import write_atomic
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import PassageHandling, load_examples, odd_passages_line
from sieverag.inference.data.dataset_fields import dataset_field, dataset_format_field
from sieverag.inference.data.loading import example_source

NegativeRetriever = Literal["bm25", "dense", "hybrid"]
Shape = Literal["passage", "snippet"]
UnmarkedGold = Literal["none", "strinc"]
CANDIDATES_PER_NEGATIVE = 8
"""Retrieved candidates per negative asked (own passages and answer holders are skipped)."""


def negative_mark(example: Example) -> bool | None:
    """The gold mark of a negative added to `example`: False where its data marks gold, else
    None (unknown, like the source's own unmarked passages)."""
    return False if example.has_gold_documents else None


def with_borrowed_negatives(examples: list[Example], count: int, seed: int) -> list[Example]:
    """Each example plus `count` random passages of other examples (`negative_mark`)."""
    if count == 0:
        return examples
    pool = [(e.id, d) for e in examples for d in e.documents]
    result = []
    for example in examples:
        rng = random.Random(f"{seed}/{example.id}")
        own_texts = {d.text for d in example.documents}
        candidates = [d for owner, d in pool if owner != example.id and d.text not in own_texts]
        picked = rng.sample(candidates, min(count, len(candidates)))
        mark = negative_mark(example)
        borrowed = tuple(
            Document(id=f"{example.id}/borrowed-{k}", text=d.text, title=d.title,
                     is_gold=mark, sentences=d.sentences,
                     supporting_sentences=() if d.supporting_sentences is not None else None)
            for k, d in enumerate(picked))
        result.append(replace(example, documents=example.documents + borrowed))
    return result


@settings
class PassageSetConfig:
    """Settings of `sieverag hard-negatives`."""

    dataset: str = dataset_field()
    out: str = field(metadata={"help": "output jsonl (common format)"})
    dataset_format: str = dataset_format_field()
    negatives: int = field(default=5, metadata={"help": "hard negatives per question"})
    retriever: NegativeRetriever = field(default="bm25", metadata={
        "help": "bm25, dense (the embedding model) or hybrid (their reciprocal-rank fusion)"})
    embedding_model: str = field(default="all-minilm-l6-v2",
                                 metadata={"help": "dense retriever's embedding model"})
    sample: int | None = field(default=None, metadata={
        "help": "N questions drawn at random (seeded; spread over the corpus) instead of all"})
    seed: int = field(default=0, metadata={"help": "seed of the sample"})
    shape: Shape = field(default="passage", metadata={
        "help": "passage: as retrieved; snippet: query-biased untitled snippets"})
    snippet_sentences: int = field(default=2,
                                   metadata={"help": "sentences per snippet (shape snippet)"})
    unmarked_gold: UnmarkedGold = field(default="none", metadata={
        "help": "none: the question's unmarked passages stay unmarked; strinc: marked by "
                "whether they hold an answer alias (evaluation sets of unmarked sources)"})

    def __post_init__(self) -> None:
        at_least(0, negatives=self.negatives)
        at_least(1, sample=self.sample, snippet_sentences=self.snippet_sentences)


@dataclass
class PassageSetSummary:
    """What `mine_passages` wrote."""

    source: str
    questions: int
    passages: int
    gold: int
    negatives: int
    """Hard negatives added by this run."""
    unmarked: int
    short_of_negatives: int = 0
    """Questions that got fewer negatives than asked (the retriever found too few)."""
    shape: str = "passage"
    odd_passages: str | None = None
    """The line counting the questions' odd passages (`odd_passages_line`)."""


# What mining does with odd passages: every question keeps its own as they are; the
# negatives' candidates hold each passage once and no blank one (no text is no negative).
MINING_HANDLING = PassageHandling(
    blank="kept in their question as given, never mined as negatives",
    duplicate="kept as given, one copy among the negatives' candidates")


def mine_passages(config: PassageSetConfig) -> PassageSetSummary:
    """Write the passage set of `config` (see the module docstring); returns its summary."""
    examples = load_examples(config.dataset, config.dataset_format)
    without = [e.id for e in examples if not e.documents]
    if without:
        raise DatasetError(f"{config.dataset}: question {without[0]!r} has no passages; "
                           "hard negatives need each question's own passages")
    corpus = _corpus(examples)
    if not corpus and config.negatives:
        raise DatasetError(f"{config.dataset}: every passage is blank; there is nothing to "
                           "mine hard negatives from (give passages with text, or --negatives 0)")
    chosen = _sample(examples, config.sample, config.seed)
    if config.unmarked_gold == "strinc":
        chosen = [_mark_by_strinc(e) for e in chosen]
    rankings = (_rank(config, [e.question for e in chosen], corpus,
                      k=config.negatives * CANDIDATES_PER_NEGATIVE + 10)
                if config.negatives else [[] for _ in chosen])
    rows, short, mined = [], 0, 0
    for example, ranking in zip(chosen, rankings, strict=True):
        example, added = _with_hard_negatives(example, [corpus[p] for p in ranking],
                                              config.negatives)
        short += added < config.negatives
        mined += added
        if config.shape == "snippet":
            example = as_snippets(example, config.snippet_sentences)
        rows.append(example)
    write_atomic(Path(config.out), "".join(json.dumps(common_row(e), ensure_ascii=False) + "\n"
                                           for e in rows))
    documents = [d for e in rows for d in e.documents]
    return PassageSetSummary(
        source=example_source(rows[0]), questions=len(rows), passages=len(documents),
        gold=sum(d.is_gold is True for d in documents),
        negatives=mined,
        unmarked=sum(d.is_gold is None for d in documents), short_of_negatives=short,
        shape=config.shape, odd_passages=odd_passages_line(chosen, MINING_HANDLING))


def common_row(example: Example) -> dict:
    """The example as a common-format record, its source named."""
    return {"id": example.id, "source": example_source(example), "question": example.question,
            "answers": list(example.answers),
            "ctxs": [{"title": d.title, "text": d.text, "is_gold": d.is_gold}
                     for d in example.documents]}


def _corpus(examples: Sequence[Example]) -> list[Document]:
    """Every passage of the file with text once (by title and text), in file order."""
    seen: dict[tuple[str, str], Document] = {}
    for example in examples:
        for document in example.documents:
            if document.text.strip():
                seen.setdefault((document.title, document.text), document)
    return list(seen.values())


def _sample(examples: list[Example], size: int | None, seed: int) -> list[Example]:
    if size is None or size >= len(examples):
        return examples
    return random.Random(seed).sample(examples, size)


def _mark_by_strinc(example: Example) -> Example:
    documents = tuple(replace(d, is_gold=strinc(d.as_context(), example.answers))
                      if d.is_gold is None else d for d in example.documents)
    return replace(example, documents=documents)


def _rank(config: PassageSetConfig, questions: list[str], corpus: Sequence[Document],
          k: int) -> list[list[int]]:
    """Corpus positions per question, best first, under the configured retriever."""
    from sieverag.inference.retrieval.bm25 import BM25Index
    from sieverag.inference.retrieval.hybrid import reciprocal_rank_fusion

    texts = [d.as_context() for d in corpus]
    rankings = []
    if config.retriever in ("bm25", "hybrid"):
        rankings.append(BM25Index.build(texts, show_progress=False).search(questions, k))
    if config.retriever in ("dense", "hybrid"):
        from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

        encode = make_encoder(DenseConfig(model=config.embedding_model))
        passages, queries = encode(texts), encode(questions)
        scores = queries @ passages.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        rankings.append([[(int(p), float(row[p])) for p in positions]
                         for row, positions in zip(scores, top, strict=True)])
    if len(rankings) == 1:
        return [[p for p, _ in ranking] for ranking in rankings[0]]
    return [[p for p, _ in reciprocal_rank_fusion(pair)] for pair in zip(*rankings, strict=True)]


def _with_hard_negatives(example: Example, ranked: Sequence[Document],
                         count: int) -> tuple[Example, int]:
    """The example plus the first `count` ranked passages that are neither its own nor hold
    an answer alias; and how many it got."""
    own = {(d.title, d.text) for d in example.documents}
    mark = negative_mark(example)
    negatives: list[Document] = []
    for document in ranked:
        if len(negatives) == count:
            break
        if (document.title, document.text) in own or strinc(document.as_context(),
                                                            example.answers):
            continue
        negatives.append(Document(id=f"{example.id}/negative-{len(negatives)}",
                                  text=document.text, title=document.title, is_gold=mark))
    return replace(example, documents=example.documents + tuple(negatives)), len(negatives)


def as_snippets(example: Example, sentences: int) -> Example:
    """Each passage as its query-biased window of `sentences` sentences, untitled (a gold
    passage's window holds an answer alias when any window does)."""
    return replace(example, documents=tuple(
        replace(d, title="", text=snippet(example, d, sentences), sentences=None,
                supporting_sentences=None)
        for d in example.documents))


def snippet(example: Example, document: Document, size: int) -> str:
    """The window of `size` consecutive sentences of `document` BM25 ranks highest for the
    question (ties: the earliest), among windows holding an answer alias for a gold passage."""
    from sieverag.inference.retrieval.bm25 import question_scores
    from sieverag.inference.retrieval.sentences import split_sentences

    parts = list(document.sentences or ()) or split_sentences(document.text) or [document.text]
    windows = [" ".join(parts[i:i + size]) for i in range(max(1, len(parts) - size + 1))]
    if document.is_gold:
        holding = [w for w in windows if strinc(w, example.answers)]
        windows = holding or windows
    if len(windows) == 1:
        return windows[0]
    scores = question_scores(example.question, windows)
    return windows[max(range(len(windows)), key=lambda i: (scores[i], -i))]
