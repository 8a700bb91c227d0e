"""One pass against two stages: what the one-pass filter reads, and what it costs.

On each question's passages, side by side in one process (the order of the three calls
alternated question by question, so a busier moment hits them alike):

  chunk stage     the two-stage filter's (the shipped one by default) chunk stage: one batched
                  `label_logprobs` call, one verdict per passage;
  one pass        the one-pass filter: one batched `marked_label_logprobs` call, a verdict
                  per passage and per sentence, from one forward pass per passage;
  sentence stage  the two-stage filter's sentence stage on the gold passages: one batched
                  generation of the key sentence numbers (up to 16 tokens).

It prints, per source, AUROC over every passage (the one-pass filter's verdict, the
two-stage filter's, BM25 and dense, their IDF over the question's passages); AUROC over every
sentence of the question's passages where the source has sentence gold (the one-pass
filter's sentence verdict, BM25 and dense of the sentence, IDF over the question's
sentences); the sentence F1 on the gold passages (the two-stage filter's sentence stage
against the one-pass key sentences under each rule of `SENTENCE_RULES`: P(relevant) at a
bar, and at least the best one); then the seconds per passage of each
call and the ratio one pass ÷ chunk stage. Sentence gold: HotpotQA's supporting facts where
a row has them; elsewhere the sentences of the gold passages that hold an answer alias
(STRINC), so those figures say how well the filter finds the answer's sentence.

    python tests/benchmarks/bench_one_pass.py --filter runs/filter-one-pass-cpu \\
        --set hotpotqa=D/hotpotqa_distractor.jsonl --set nq=runs/sources/nq.jsonl \\
        --question-ids held_out_ids.txt [--limit 60] [--shipped smollm2-filter] [--quick]
        [--one-pass-only] [--skip N]

`--question-ids` keeps only those questions (held out: neither filter trained on them);
`--quick` takes 3 questions a source; `--one-pass-only` reads with the one-pass filter
alone (choosing its sentence rule on training questions). Ends with one line of JSON
holding the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offline_env import run_offline

run_offline()

from sieverag.data_gen.strinc import strinc  # noqa: E402
from sieverag.inference.core.types import Document, Example  # noqa: E402
from sieverag.inference.filters.adapter_store import resolve_filter  # noqa: E402
from sieverag.inference.filters.card.combination import passage_priors  # noqa: E402
from sieverag.inference.filters.document_filter import ScoredDocument  # noqa: E402
from sieverag.inference.filters.filter_format import (  # noqa: E402
    CHUNK_LABELS,
    chunk_prompt,
    passage_prompt,
    passage_verdicts,
    relevance_log_odds,
)
from sieverag.inference.filters.mcf import (  # noqa: E402
    MCFConfig,
    MultiGranularFilter,
    document_sentences,
    key_sentence_indices,
    source_positions,
)
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.inference.metrics.filter_scores import auroc, decision_quality  # noqa: E402

# The one-pass sentence rules measured: (sentence_p_min, sentence_min_keep).
SENTENCE_RULES = ((0.5, 0), (0.5, 1), (0.3, 1), (0.2, 1), (0.1, 1), (0.05, 1))


def rule_name(p_min: float, min_keep: int) -> str:
    return f"one-pass, P >= {p_min:g}" + (f", min {min_keep}" if min_keep else "")


@dataclass
class SourceFigures:
    """Every passage's and sentence's label and scores of one source, and the seconds."""

    passage_labels: list[bool] = field(default_factory=list)
    passage_scores: dict[str, list[float]] = field(default_factory=dict)
    sentence_labels: list[bool] = field(default_factory=list)
    sentence_scores: dict[str, list[float]] = field(default_factory=dict)
    sentence_f1: dict[str, list[tuple[set, set]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    passages: int = 0
    sentence_stage_passages: int = 0
    questions: int = 0

    def add(self, table: dict, key: str, values: Sequence) -> None:
        table.setdefault(key, []).extend(values)


def sentence_gold(example: Example, document: Document) -> set[int] | None:
    """The key sentences of a passage, as positions in `document_sentences(document)`:
    supporting facts where the row has them, else (a gold passage) the sentences with an
    answer alias, else (a passage not gold) none; None where the row says nothing."""
    sentences = document_sentences(document)
    if any(d.supporting_sentences for d in example.documents):
        positions = source_positions(document)
        return {i for i, p in enumerate(positions) if p in (document.supporting_sentences or ())}
    if document.is_gold is None:
        return None
    if not document.is_gold:
        return set()
    return {i for i, s in enumerate(sentences) if strinc(s, example.answers)}


def timed(figures: SourceFigures, name: str, call):
    started = time.perf_counter()
    result = call()
    figures.seconds[name] = figures.seconds.get(name, 0.0) + time.perf_counter() - started
    return result


def measure(example: Example, turn: int, one_pass: HFBackend, two_stage: HFBackend | None,
            figures: SourceFigures) -> None:
    """Read one question's passages with each filter and add what they gave to `figures`
    (`two_stage` None: the one-pass filter only)."""
    question, documents = example.question, list(example.documents)
    sentences = [document_sentences(d) or [d.text] for d in documents]
    golds = [sentence_gold(example, d) for d in documents]
    kept_gold = [ScoredDocument(d, 0.0, True) for d in documents if d.is_gold]
    sentence_stage = (MultiGranularFilter(two_stage, MCFConfig(sentence_stage=True))
                      if two_stage is not None else None)

    def chunk_stage():
        return two_stage.label_logprobs([chunk_prompt(question, d.text, d.title)
                                         for d in documents], CHUNK_LABELS,
                                        agent="filter_chunk")

    def one_pass_call():
        return one_pass.marked_label_logprobs(
            [passage_prompt(question, s, d.title) for d, s in zip(documents, sentences,
                                                                  strict=True)],
            CHUNK_LABELS, agent="filter_passage")

    def sentence_call():
        return sentence_stage.sentence_stage(question, kept_gold) if kept_gold else []

    calls = [("one pass", one_pass_call)]
    if two_stage is not None:
        calls += [("chunk stage", chunk_stage), ("sentence stage", sentence_call)]
    shift = turn % len(calls)
    results = {name: timed(figures, name, call) for name, call in calls[shift:] + calls[:shift]}

    figures.questions += 1
    figures.passages += len(documents)
    figures.sentence_stage_passages += len(kept_gold)
    reads = [passage_verdicts(read, len(s)) for read, s in zip(results["one pass"], sentences,
                                                              strict=True)]
    bm25, dense = passage_priors(question, [d.as_context() for d in documents])
    figures.passage_labels.extend(bool(d.is_gold) for d in documents)
    figures.add(figures.passage_scores, "one-pass filter", [passage for passage, _ in reads])
    if two_stage is not None:
        figures.add(figures.passage_scores, "two-stage filter",
                    [relevance_log_odds(r) for r in results["chunk stage"]])
    figures.add(figures.passage_scores, "BM25", bm25)
    figures.add(figures.passage_scores, "dense", dense)

    if any(g is None for g in golds) or not any(g for g in golds):
        return
    flat = [s for sents in sentences for s in sents]
    s_bm25, s_dense = passage_priors(question, flat)
    figures.sentence_labels.extend(i in gold for gold, sents in zip(golds, sentences, strict=True)
                                   for i in range(len(sents)))
    figures.add(figures.sentence_scores, "one-pass filter",
                [-1e6 if v is None else v for _, per in reads for v in per])
    figures.add(figures.sentence_scores, "BM25", s_bm25)
    figures.add(figures.sentence_scores, "dense", s_dense)
    gold_pairs = {(d.id, i) for d, g in zip(documents, golds, strict=True) if d.is_gold
                  for i in g}
    if two_stage is not None:
        staged = {(s.document.id, i) for s in results["sentence stage"] if s.kept
                  for i in s.details["key_sentences"]}
        figures.sentence_f1.setdefault("two-stage sentence stage", []).append((staged,
                                                                               gold_pairs))
    for p_min, min_keep in SENTENCE_RULES:
        chosen = {(d.id, i) for d, (_, per) in zip(documents, reads, strict=True) if d.is_gold
                  for i in key_sentence_indices(per, p_min, min_keep)}
        figures.sentence_f1.setdefault(rule_name(p_min, min_keep), []).append(
            (chosen, gold_pairs))


def load_set(path: str, ids: set[str] | None, limit: int, skip: int = 0) -> list[Example]:
    """The dataset's questions (those in `ids`, when given), in order: `limit` of them after
    the first `skip`."""
    from sieverag.inference.data.loading import load_examples

    examples = [e for e in load_examples(path) if ids is None or e.id in ids]
    return examples[skip:skip + limit]


def summarise(name: str, figures: SourceFigures) -> dict:
    passage = {method: auroc(figures.passage_labels, values)
               for method, values in figures.passage_scores.items()}
    sentence = {method: auroc(figures.sentence_labels, values)
                for method, values in figures.sentence_scores.items()}
    f1 = {method: decision_quality(pairs)["f1"] for method, pairs in figures.sentence_f1.items()}
    per_passage = {call: seconds / max(figures.passages, 1)
                   for call, seconds in figures.seconds.items()}
    if "sentence stage" in per_passage:
        per_passage["sentence stage"] = (figures.seconds["sentence stage"]
                                         / max(figures.sentence_stage_passages, 1))
    return {"source": name, "questions": figures.questions, "passages": figures.passages,
            "sentences": len(figures.sentence_labels), "passage_auroc": passage,
            "sentence_auroc": sentence, "sentence_f1_on_gold_passages": f1,
            "seconds_per_passage": per_passage,
            "one_pass_vs_chunk_stage": (per_passage["one pass"] / per_passage["chunk stage"]
                                        if "chunk stage" in per_passage else None)}


def print_table(rows: Sequence[dict]) -> None:
    def cell(value: float | None, digits: int = 3) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    print("\nAUROC over every passage (held-out questions)")
    print("| source | q | passages | one-pass filter | two-stage filter | BM25 | dense |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a = r["passage_auroc"]
        print(f"| {r['source']} | {r['questions']} | {r['passages']} | "
              f"{cell(a.get('one-pass filter'))} | {cell(a.get('two-stage filter'))} | "
              f"{cell(a.get('BM25'))} | {cell(a.get('dense'))} |")
    print("\nAUROC over every sentence of the question's passages")
    print("| source | sentences | one-pass filter | BM25 | dense | one-pass − better prior |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        a = r["sentence_auroc"]
        priors = [v for v in (a.get("BM25"), a.get("dense")) if v is not None]
        margin = (a["one-pass filter"] - max(priors)
                  if priors and a.get("one-pass filter") is not None else None)
        print(f"| {r['source']} | {r['sentences']} | {cell(a.get('one-pass filter'))} | "
              f"{cell(a.get('BM25'))} | {cell(a.get('dense'))} | {cell(margin)} |")
    rules = ["two-stage sentence stage", *(rule_name(*rule) for rule in SENTENCE_RULES)]
    print("\nsentence F1 on the gold passages (the two-stage filter's sentence stage; the "
          "one-pass filter's key sentences at each bar, at least the best where min 1)")
    print("| source | " + " | ".join(rules) + " |")
    print("|---|" + "---:|" * len(rules))
    for r in rows:
        f = r["sentence_f1_on_gold_passages"]
        print(f"| {r['source']} | " + " | ".join(cell(f.get(rule)) for rule in rules) + " |")
    print("\nseconds per passage (sentence stage: per gold passage it read)")
    print("| source | chunk stage | one pass (both granularities) | sentence stage | "
          "one pass ÷ chunk stage |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        s = r["seconds_per_passage"]
        print(f"| {r['source']} | {cell(s.get('chunk stage'), 4)} | {cell(s['one pass'], 4)} | "
              f"{cell(s.get('sentence stage'), 4)} | {cell(r['one_pass_vs_chunk_stage'], 2)} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--filter", required=True, help="the one-pass filter (name or folder)")
    parser.add_argument("--shipped", default="smollm2-filter",
                        help="the two-stage filter to compare (name or folder)")
    parser.add_argument("--base-model", default=DEFAULT_MODEL)
    parser.add_argument("--set", action="append", required=True, metavar="NAME=FILE",
                        help="a source: its name and dataset file (repeatable)")
    parser.add_argument("--question-ids", help="file of question ids to keep, one a line")
    parser.add_argument("--limit", type=int, default=60, help="questions per source")
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first N questions of each source (those reported "
                             "on, when choosing a rule on the next ones)")
    parser.add_argument("--quick", action="store_true", help="3 questions a source")
    parser.add_argument("--one-pass-only", action="store_true",
                        help="read with the one-pass filter only (no two-stage rows, no "
                             "timing against it): to choose its sentence rule quickly")
    args = parser.parse_args(argv)

    ids = None
    if args.question_ids:
        ids = {line.strip() for line in Path(args.question_ids).read_text().splitlines()
               if line.strip()}
    limit = 3 if args.quick else args.limit
    backends: dict[str, HFBackend | None] = {"two stage": None}
    for role, name in (("one pass", args.filter),
                       *(() if args.one_pass_only else (("two stage", args.shipped),))):
        folder = resolve_filter(name, args.base_model)
        backends[role] = HFBackend(HFBackendConfig(model=args.base_model, adapter=str(folder),
                                                   dtype="float32", prompt_cache_tokens=0))
    rows = []
    for spec in args.set:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--set {spec!r}: give NAME=FILE")
        figures = SourceFigures()
        for turn, example in enumerate(load_set(path, ids, limit, args.skip)):
            measure(example, turn, backends["one pass"], backends["two stage"], figures)
        rows.append(summarise(name, figures))
        print(f"{name}: {figures.questions} questions measured", file=sys.stderr)
    print_table(rows)
    ratios = [r["one_pass_vs_chunk_stage"] for r in rows
              if r["one_pass_vs_chunk_stage"] is not None]
    print(json.dumps({"filter": args.filter, "shipped": None if args.one_pass_only
                      else args.shipped, "sources": rows,
                      "one_pass_vs_chunk_stage_median": (statistics.median(ratios)
                                                         if ratios else None)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
