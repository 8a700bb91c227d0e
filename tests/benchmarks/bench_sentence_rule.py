"""Sentences by the best rule (issue 53): which rule names a kept passage's key sentences,
the filter's sentence stage or the priors rule, side by side on the same passages.

Chunk selection is held fixed: each held-out question's gold passages are narrowed, so the
sentence rule alone is measured. On them, per source:

  whole chunk     no narrowing: every sentence of the gold passages;
  first sentence  each passage's first sentence alone (the position prior by itself);
  filter          MCF's sentence stage as shipped (`--filter`, a two-stage filter: one
                  generating pass naming the key sentence numbers; `sentence_rule filter`);
  priors +w ≥ b   the priors rule (inference/filters/sentence_priors.py: z(BM25) + z(dense)
                  over the chunk's sentences plus w for the first sentence, at least the best
                  kept) at bar b: MCF's sentence stage under `sentence_rule priors` for the
                  module's FIRST_SENTENCE_PRIOR, the rule's own functions for other w.

Figures: sentence-level precision, recall and F1 (per question, averaged over questions:
`metrics.filter_scores.decision_quality`) against the sentence gold, and the tokens (the filter's
tokenizer) of the kept sentences as a share of the whole gold passages'. Sentence gold: HotpotQA's
supporting facts (the rows that carry them); elsewhere the sentences of a gold passage that
hold a gold answer alias (STRINC), gold passages without one left out. Questions of the
filter's card's `dataset.train_questions` are left out (eval-filter's `training_questions`;
the combination's fit questions stay: the combination ranks chunks, held fixed here).

The priors rule's bar and first-sentence prior are chosen leave-one-source-out: for each
source, the (w, b) with the best mean F1 over the other sources, measured on it. The verdict
compares that left-out F1 with the filter's on the worst source (the smallest margin).
`default_rule` is the (w, b) chosen on every source, the one `sentence_priors` holds
(FIRST_SENTENCE_PRIOR, DEFAULT_SENTENCE_BAR).

    python tests/benchmarks/bench_sentence_rule.py [--limit 30] [--quick] \\
        [--set hotpotqa=D/hotpotqa_distractor.jsonl --set nq=runs/sources/nq.jsonl ...] \\
        [--filter smollm2-filter] [--cache runs/bench-sentence-rule/replies.json]

Default sets: HotpotQA from the shared data folder and runs/sources/{nq,squad,popqa,
popqa-web}.jsonl (tests/benchmarks/filter_sources.py writes them). The filter's replies are
kept in `--cache` after every question, so an interrupted run resumes (its seconds count
only the replies asked this run). `--quick`: 5 questions a source. Prints the tables, then
one line of JSON; `--results-json PATH` also writes them for docs/results/filter.md
(docs/results/data/sentence_rule.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offline_env import run_offline

run_offline()
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results_json  # noqa: E402
from bench_data import HOTPOT, ROOT  # noqa: E402
from tqdm import tqdm  # noqa: E402

from sieverag.data_gen.strinc import strinc  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import example_source  # noqa: E402
from sieverag.inference.filters.adapter_store import resolve_filter  # noqa: E402
from sieverag.inference.filters.card.card_file import CARD_FILE, read_card  # noqa: E402
from sieverag.inference.filters.card.combination import (  # noqa: E402
    COMBINATION_KEY,
    adapter_combination,
    passage_priors,
)
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument  # noqa: E402
from sieverag.inference.filters.mcf import (  # noqa: E402
    MCFConfig,
    MultiGranularFilter,
    document_sentences,
    source_positions,
)
from sieverag.inference.filters.sentence_priors import (  # noqa: E402
    FIRST_SENTENCE_PRIOR,
    fused_sentence_scores,
    prior_key_sentences,
)
from sieverag.inference.filters.windows import token_offsets_of  # noqa: E402
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.inference.metrics.filter_scores import decision_quality  # noqa: E402
from sieverag.training.evaluation.caching_backend import CachingBackend  # noqa: E402
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig  # noqa: E402
from sieverag.training.evaluation.held_out_questions import (  # noqa: E402
    select_examples,
    training_questions,
)

SOURCES = {"hotpotqa": HOTPOT, "nq": ROOT / "runs/sources/nq.jsonl",
           "squad": ROOT / "runs/sources/squad.jsonl", "popqa": ROOT / "runs/sources/popqa.jsonl",
           "popqa-web": ROOT / "runs/sources/popqa-web.jsonl"}
# The priors rules measured: first-sentence priors w and bars b (z units over a chunk's
# sentences; inf: the best alone).
FIRST_PRIORS = (0.0, 0.5, 1.0, 2.0)
BARS = (-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, math.inf)
RULES = tuple((w, b) for w in FIRST_PRIORS for b in BARS)
WHOLE, FIRST, FILTER = "whole chunk", "first sentence", "filter"

Pairs = set[tuple[str, int]]


def bar_cell(bar: float) -> str:
    return "best only" if math.isinf(bar) else f"{bar:g}"


def priors_name(rule: tuple[float, float]) -> str:
    first_prior, bar = rule
    return f"priors +{first_prior:g}, " + ("best only" if math.isinf(bar) else f"≥ {bar:g}")


@dataclass
class SourceFigures:
    """Per rule, each question's (kept, gold) sentence pairs and the tokens kept."""

    kept: dict[str, list[tuple[Pairs, Pairs]]] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    timed_chunks: dict[str, int] = field(default_factory=dict)
    chunks: int = 0
    asked: int = 0  # chunks of more than one sentence the filter named sentences of
    first_only: int = 0  # ... naming the first alone
    sentences: int = 0

    def add(self, rule: str, kept: Pairs, gold: Pairs, tokens: int) -> None:
        self.kept.setdefault(rule, []).append((kept, gold))
        self.tokens[rule] = self.tokens.get(rule, 0) + tokens

    def time(self, rule: str, seconds: float, chunks: int) -> None:
        self.seconds[rule] = self.seconds.get(rule, 0.0) + seconds
        self.timed_chunks[rule] = self.timed_chunks.get(rule, 0) + chunks


# ----- questions and their sentence gold ---------------------------------------------------


def held_out(sets: dict[str, Path], filter_folder: Path, limit: int
             ) -> dict[str, list[tuple[Example, list]]]:
    """Per source, its first `limit` questions that did not train the filter and hold
    sentence gold, each with its gold passages that hold a gold sentence and those sentences
    (positions in `document_sentences`)."""
    card = read_card(filter_folder) or {}
    config = FilterEvalConfig(dataset=tuple(str(p) for p in sets.values()), out="")
    # The combination ranks chunks; chunks are held fixed here, so its fit questions may stay.
    trained = training_questions(config, {k: v for k, v in card.items() if k != COMBINATION_KEY},
                                 f"{filter_folder}/{CARD_FILE}")
    chosen: dict[str, list[tuple[Example, list]]] = {}
    for name, path in sets.items():
        if not path.exists():
            sys.exit(f"--set {name}={path}: no such file (tests/benchmarks/filter_sources.py "
                     "writes the runs/sources files)")
        picked = []
        for example in select_examples(config, trained, str(path)).examples:
            assert (example_source(example), example.id) not in trained.pairs
            golds = [(d, g) for d in example.documents if d.is_gold
                     for g in [sentence_gold(example, d)] if g]
            if golds:
                picked.append((example, golds))
            if len(picked) == limit:
                break
        chosen[name] = picked
    return chosen


def sentence_gold(example: Example, document) -> set[int]:
    """A gold passage's key sentences (positions in `document_sentences`): its supporting
    facts where the row has them, else those holding a gold answer alias (STRINC); a row
    with passage-level gold only (no sentence split of its own, no answers) has none."""
    if any(d.supporting_sentences is not None for d in example.documents):
        positions = source_positions(document)
        return {i for i, p in enumerate(positions) if p in (document.supporting_sentences or ())}
    if example_source(example) == "hotpotqa":  # gold by passage only: no sentence gold
        return set()
    return {i for i, s in enumerate(document_sentences(document)) if strinc(s, example.answers)}


# ----- one question ------------------------------------------------------------------------


def kept_pairs(result: FilterResult) -> Pairs:
    return {(s.document.id, k) for s in result.kept for k in s.details["key_sentences"]}


def prior_rules(question: str, sentences: dict[str, list[str]], embedding_model: str,
                first_prior: float) -> dict[str, Pairs]:
    """What the priors rule with `first_prior` keeps at every bar (its own functions, as MCF
    calls them; at least the best sentence, a one-sentence passage whole)."""
    fused = fused_sentence_scores(question, list(sentences.values()), passage_priors,
                                  embedding_model, first_prior)
    return {priors_name((first_prior, bar)): {
        (doc, k) for doc, scores in zip(sentences, fused, strict=True)
        for k in (prior_key_sentences(scores, bar, 1) if len(scores) > 1
                  else range(len(scores)))} for bar in BARS}


def measure(example: Example, golds: list, turn: int, rules: dict[str, MultiGranularFilter],
            cache: CachingBackend, count_tokens, figures: SourceFigures) -> None:
    """Narrow the question's gold passages under every rule and add what each kept."""
    chunks = tuple(ScoredDocument(d, 0.0, True) for d, _ in golds)
    fixed = FilterResult(kept=chunks, scored=chunks, threshold=None)
    sentences = {d.id: document_sentences(d) for d, _ in golds}
    tokens = {(doc, i): count_tokens(s) for doc, sents in sentences.items()
              for i, s in enumerate(sents)}
    gold = {(d.id, i) for d, g in golds for i in g}
    every = set(tokens)
    figures.chunks += len(chunks)
    figures.sentences += len(every)
    figures.add(WHOLE, every, gold, sum(tokens.values()))
    firsts = {(d.id, 0) for d, _ in golds}
    figures.add(FIRST, firsts, gold, sum(tokens[p] for p in firsts))

    # The filter and the first priors rule (which computes the priors) alternate first; the
    # other bars read the priors back from passage_priors' cache.
    timed = {FILTER: "filter", priors_name((FIRST_SENTENCE_PRIOR, BARS[0])): "priors"}
    order = list(timed)[::-1] if turn % 2 else list(timed)
    results = {}
    for rule in order + [r for r in rules if r not in timed]:
        asked = len(cache.replies)
        started = time.perf_counter()
        results[rule] = rules[rule].narrow(example.question, fixed)
        elapsed = time.perf_counter() - started
        if rule in timed and (rule != FILTER or len(cache.replies) > asked):
            figures.time(timed[rule], elapsed, len(chunks))  # a cached reply costs nothing
    kept = {rule: kept_pairs(result) for rule, result in results.items()}
    named = [s.details["key_sentences"] for s in results[FILTER].kept
             if "sentence_reply" in s.details]
    figures.asked += len(named)
    figures.first_only += sum(keys == [0] for keys in named)
    model = rules[FILTER].combination.embedding_model
    for first_prior in FIRST_PRIORS:
        direct = prior_rules(example.question, sentences, model, first_prior)
        if first_prior == FIRST_SENTENCE_PRIOR:  # MCF's own run: the same rule
            assert all(kept[rule] == pairs for rule, pairs in direct.items()), example.id
        kept.update(direct)
    for rule, pairs in kept.items():
        figures.add(rule, pairs, gold, sum(tokens[p] for p in pairs))


# ----- figures -----------------------------------------------------------------------------


def summarise(figures: SourceFigures) -> dict:
    whole_tokens = figures.tokens[WHOLE]
    rules = {}
    for rule, pairs in figures.kept.items():
        quality = decision_quality(pairs)
        rules[rule] = {"precision": quality["precision"], "recall": quality["recall"],
                       "f1": quality["f1"], "token_share": figures.tokens[rule] / whole_tokens,
                       "sentences_per_question": quality["kept_per_question"]}
    seconds = {rule: figures.seconds[rule] / figures.timed_chunks[rule]
               for rule in figures.seconds if figures.timed_chunks[rule]}
    return {"questions": len(figures.kept[WHOLE]), "chunks": figures.chunks,
            "sentences": figures.sentences, "rules": rules, "seconds_per_chunk": seconds,
            "filter_names_first_alone": figures.first_only / max(figures.asked, 1)}


def best_rule(rows: dict[str, dict], sources: Sequence[str]) -> tuple[float, float]:
    """The (first-sentence prior, bar) with the best mean F1 over `sources` (ties: the
    smaller prior, then the lower bar)."""
    return max(RULES, key=lambda rule: (statistics.fmean(
        rows[s]["rules"][priors_name(rule)]["f1"] for s in sources), -rule[0], -rule[1]))


def left_out(rows: dict[str, dict]) -> tuple[dict[str, dict], tuple[float, float]]:
    """Per source, the rule fitted on the other sources (`best_rule`) and what it measures
    there; and the rule chosen on every source."""
    table = {}
    for source, row in rows.items():
        first_prior, bar = best_rule(rows, [s for s in rows if s != source])
        priors = row["rules"][priors_name((first_prior, bar))]
        margin = priors["f1"] - row["rules"][FILTER]["f1"]
        table[source] = {"first_prior": first_prior, "bar": bar, **priors,
                         "margin_over_filter": margin,
                         "winner": "priors" if margin > 0 else "filter" if margin < 0
                         else "tie"}
    return table, best_rule(rows, list(rows))


def cell(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def rule_cell(first_prior: float, bar: float) -> str:
    return f"+{first_prior:g}, {bar_cell(bar)}"


def results_tables(rows: dict[str, dict], table: dict[str, dict]) -> dict[str, dict]:
    """The three tables of docs/results/filter.md: left out, every rule in-sample, and the
    seconds a chunk (`--results-json` writes them; the run prints them)."""
    left_out = []
    for source, row in rows.items():
        whole, filt, priors = row["rules"][WHOLE], row["rules"][FILTER], table[source]
        left_out.append([
            source, row["questions"], row["chunks"],
            f"{cell(whole['precision'])} / {cell(whole['f1'])}", cell(row["rules"][FIRST]["f1"]),
            f"{cell(filt['precision'])} / {cell(filt['recall'])} / {cell(filt['f1'])}",
            cell(filt["token_share"], 2), rule_cell(priors["first_prior"], priors["bar"]),
            f"{cell(priors['precision'])} / {cell(priors['recall'])} / {cell(priors['f1'])}",
            cell(priors["token_share"], 2), f"{priors['margin_over_filter']:+.3f}",
            priors["winner"]])
    names = [WHOLE, FIRST, FILTER, *(priors_name(rule) for rule in RULES)]
    in_sample = [[name, *(f"{cell(row['rules'][name]['f1'])} "
                          f"({cell(row['rules'][name]['token_share'], 2)})"
                          for row in rows.values())] for name in names]
    seconds = [[source, cell(row["seconds_per_chunk"].get("filter"), 4),
                cell(row["seconds_per_chunk"].get("priors"), 4),
                f"{row['filter_names_first_alone']:.0%}"] for source, row in rows.items()]
    return {
        "left_out": results_json.table(
            ["source", "q", "chunks", "whole P / F1", "first sentence F1", "filter P / R / F1",
             "filter tokens", "priors rule", "priors P / R / F1", "priors tokens",
             "priors − filter F1", "winner"], left_out, align=["", *["right"] * 10, ""]),
        "in_sample": results_json.table(["rule", *rows], in_sample,
                                        align=["", *["right"] * len(rows)]),
        "seconds": results_json.table(
            ["source", "seconds a chunk: filter", "priors", "filter names sentence 1 alone"],
            seconds, align=["", "right", "right", "right"])}


def print_tables(tables: dict[str, dict], default_rule: tuple[float, float]) -> None:
    print("\nLeft out: the priors rule fitted on the other sources (first-sentence prior, "
          "bar), against the whole chunk, the first sentence and the filter's sentence stage "
          "(sentence P / R / F1 on the gold passages; tokens kept ÷ whole chunk)")
    print(results_json.markdown(tables["left_out"]))
    print(f"\nEvery rule on every source, in-sample: sentence F1 (tokens kept ÷ whole chunk); "
          f"the rule chosen on every source: {rule_cell(*default_rule)}")
    print(results_json.markdown(tables["in_sample"]))
    print("\nSeconds a chunk (the filter's generating pass; the priors rule with its "
          "sentence priors), and how often the filter's reply names the first sentence alone")
    print(results_json.markdown(tables["seconds"]))


# ----- the run -----------------------------------------------------------------------------


def read_cache(path: Path | None) -> dict[str, str]:
    if path is None or not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        sys.exit(f"--cache {path}: not the JSON this benchmark writes ({err}); remove it")


def write_cache(path: Path | None, replies: dict[str, str]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(dict(replies)), encoding="utf-8")
    partial.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", default=[], metavar="NAME=FILE",
                        help="a source: its name and dataset file (repeatable; default: "
                             + ", ".join(SOURCES) + ")")
    parser.add_argument("--filter", default="smollm2-filter",
                        help="the two-stage filter (name or folder)")
    parser.add_argument("--base-model", default=DEFAULT_MODEL)
    parser.add_argument("--limit", type=int, default=30, help="questions a source")
    parser.add_argument("--cache", type=Path, default=None,
                        help="JSON file keeping the filter's replies (resume, rerun)")
    parser.add_argument("--quick", action="store_true", help="5 questions a source")
    results_json.add_option(parser)
    args = parser.parse_args(argv)

    sets = dict(SOURCES)
    if args.set:
        sets = {}
        for spec in args.set:
            name, _, path = spec.partition("=")
            if not name or not path:
                parser.error(f"--set {spec!r}: give NAME=FILE")
            sets[name] = Path(path)
    limit = 5 if args.quick else args.limit
    folder = Path(resolve_filter(args.filter, args.base_model))
    combination = adapter_combination(folder)
    if combination.filter_format != "two_stage":
        sys.exit(f"--filter {args.filter} is a one-pass filter: this benchmark compares a "
                 "two-stage filter's generating sentence stage")
    questions = held_out(sets, folder, limit)
    inner = HFBackend(HFBackendConfig(model=args.base_model, adapter=str(folder),
                                      dtype="float32", prompt_cache_tokens=0))
    cache = CachingBackend(inner, replies=read_cache(args.cache))
    offsets = token_offsets_of(inner)

    def count_tokens(text: str) -> int:
        return len(offsets(text)[0])

    rules = {FILTER: MultiGranularFilter(cache, MCFConfig(sentence_stage=True), combination)}
    for bar in BARS:
        rules[priors_name((FIRST_SENTENCE_PRIOR, bar))] = MultiGranularFilter(
            cache, MCFConfig(sentence_stage=True, sentence_rule="priors", sentence_bar=bar),
            combination)

    rows = {}
    for name, picked in questions.items():
        if not picked:
            sys.exit(f"{name}: no held-out question with sentence gold")
        figures = SourceFigures()
        for turn, (example, golds) in enumerate(tqdm(picked, desc=name, file=sys.stderr)):
            measure(example, golds, turn, rules, cache, count_tokens, figures)
            write_cache(args.cache, cache.replies)
        rows[name] = summarise(figures)
    table, default_rule = left_out(rows)
    tables = results_tables(rows, table)
    print_tables(tables, default_rule)
    worst = min(table, key=lambda s: table[s]["margin_over_filter"])
    verdict = {"worst_source": worst, "worst_margin": table[worst]["margin_over_filter"],
               "priors_wins_worst_source": table[worst]["margin_over_filter"] > 0}
    print(f"\nworst source left out: {worst}, priors − filter F1 "
          f"{verdict['worst_margin']:+.3f}: "
          + ("the priors rule wins there" if verdict["priors_wins_worst_source"]
             else "the priors rule does not win there"))
    print(json.dumps({"filter": args.filter, "limit": limit,
                      "first_priors": list(FIRST_PRIORS), "bars": [bar_cell(b) for b in BARS],
                      "default_rule": {"first_prior": default_rule[0],
                                       "bar": bar_cell(default_rule[1])}, **verdict,
                      "left_out": {s: {k: (bar_cell(v) if k == "bar" else v)
                                       for k, v in row.items()} for s, row in table.items()},
                      "sources": rows}))
    if args.results_json:
        results_json.write(args.results_json, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
