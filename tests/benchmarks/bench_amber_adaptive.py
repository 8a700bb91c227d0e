"""Amber pays its way (issue 55): the adaptive loop's gate fitted on training questions of three
sources, its rule chosen leave-one-source-out, then vanilla, the paper's loop (`amber-paper`)
and the adaptive default (`amber-mcf`) side by side on held-out questions of a fourth source —
over an index and on the given passages.

Data (`tests/benchmarks/filter_sources.py` writes the sources; HotpotQA is read as it is):

* **Training:** `--per-source` questions of each of `--train-sources` (default NQ, SQuAD and
  PopQA, 50 each: 150), over one index of every passage of the training and held-out
  questions (`--out`/index, hybrid, built once).
* **Held-out:** the first `--limit` HotpotQA distractor questions outside the shipped filter's
  training questions (its card's `dataset.train_questions`): a source no fit saw.

Steps:

1. **Fit** (training questions, over the index, the `amber-open` preset): `vanilla`,
   `amber-mcf` answering right after round 1 (`--amber.answer-at 0`) and, in a run of its own,
   `amber-mcf` with the adaptive branch off never stopping early (`--no-amber.adaptive
   --amber.collector.sufficiency-threshold 1`: the adaptive loop's "not strong enough" branch,
   plus the sufficiency prompt it records, whose seconds are taken off). The adaptive loop
   answers from round 1 where its signal (`max_p` or `sum_p` of MCF's calibrated P(relevant)
   of the kept evidence) reaches the bar and loops elsewhere, so its accuracy and seconds at
   every bar follow from these runs question by question (`simulate`).
2. **The rule, leave-one-source-out.** A rule is a signal and a way to choose its bar: the
   most accurate bar whose seconds stay within a cap (1.5× or 2× vanilla's; ties: the
   cheaper), or a fixed choice (always answer after round 1; always loop). Each rule is fitted
   on all training sources but one and measured on the one left out (accuracy against
   vanilla's, seconds ÷ vanilla's); the rule chosen is the one whose worst left-out accuracy
   margin is best (ties within one question of the smallest source: the cheaper worst
   ratio), then fitted on every training question for the default.
3. **Held-out, over the index:** vanilla, amber-paper and amber-mcf with the chosen gate, and
   the round-1 answer once more (the signals' held-out AUROC).
4. **Held-out, given passages** (no index, the default settings: all 10 passages in round 1):
   vanilla, amber-paper, amber-mcf.

    python tests/benchmarks/filter_sources.py --data ../shared/data --out runs/sources
    python tests/benchmarks/bench_amber_adaptive.py \\
        --hotpotqa ../shared/data/hotpotqa_distractor.jsonl --sources runs/sources \\
        [--per-source 50] [--limit 60] [--out runs/bench-adaptive] [--quick]

Each step writes its own run folder under `--out`, and a rerun adds only what is new. Prints
the tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from offline_env import run_offline

run_offline()

import numpy as np  # noqa: E402
import results_json  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from sieverag.inference.cli.run import EvalCommand  # noqa: E402
from sieverag.inference.composition.config import RunConfig  # noqa: E402
from sieverag.inference.core.io_utils import write_atomic  # noqa: E402
from sieverag.inference.core.settings import narrow, parse_settings  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.eval import runner  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.index_folder import build_index  # noqa: E402

SIGNALS = ("sufficiency", "max_p", "sum_p")
GATE_SIGNALS = ("max_p", "sum_p")  # what the loop reads without an extra call
CAPS = (1.5, 2.0)
HELD_OUT = ("vanilla", "amber-paper", "amber-mcf")
SHIPPED_CARD = (Path(__file__).resolve().parents[2] / "inference" / "filters" / "shipped"
                / "smollm2-filter" / "sieverag_adapter.json")
NEVER = 1e9  # an answer_at no evidence strength reaches: always loop

def evaluate(flags: list[str], out: Path) -> dict[str, list[dict]]:
    """One `sieverag eval` run; its records by pipeline."""
    config = narrow(parse_settings(EvalCommand, [*flags, "--no-trust.enabled"],
                                   "bench_amber_adaptive"), RunConfig)
    runner.run_evaluation(config, out, progress=True)
    return {name: [json.loads(line) for line in
                   (out / "results" / f"{name}.jsonl").open(encoding="utf-8")]
            for name in config.pipelines}


def kept_p(record: dict) -> list[float]:
    """MCF's calibrated P(relevant) of the chunks round 1 kept."""
    first = record["trace"]["rounds"][0]
    return [s["p_relevant"] for s in first["scored"] if s["id"] in first["kept"]]


def signals(round_one: dict, paper: dict) -> dict[str, float]:
    """The candidate signals of one question: from the round-1 answer's trace and the paper
    loop's round-1 sufficiency verdict."""
    p = kept_p(round_one)
    verdict = paper["trace"]["rounds"][0].get("sufficiency")
    return {"sufficiency": verdict["p_yes"] if verdict else 0.0,
            "max_p": max(p, default=0.0), "sum_p": sum(p)}


def correct(record: dict) -> bool:
    return bool(record["metrics"]["accuracy"])


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    return (round(float(roc_auc_score(labels, scores)), 3)
            if 0 < sum(labels) < len(labels) else None)


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def sufficiency_seconds(record: dict) -> float:
    usage = record["usage"].get("sufficiency")
    return usage["seconds"] if usage else 0.0


def simulate(bar: float, values: Sequence[float], round_one: Sequence[dict],
             paper: Sequence[dict]) -> tuple[float, float]:
    """(accuracy, s/q) of the adaptive loop at `bar`, from the two runs question by question
    (the loop branch is the paper's loop without its sufficiency prompt)."""
    right, seconds = [], []
    for value, first, loop in zip(values, round_one, paper, strict=True):
        strong = value >= bar
        right.append(correct(first) if strong else correct(loop))
        seconds.append(first["seconds"] if strong else loop["seconds"]
                       - sufficiency_seconds(loop))
    return mean(right), mean(seconds)


def llm_tokens(record: dict) -> int:
    """Every LLM call's prompt and completion tokens for one question: the cost that does not
    depend on what else the machine runs."""
    return sum(u["prompt_tokens"] + u["completion_tokens"] for u in record["usage"].values())


def table(runs: dict[str, list[dict]], reference: str = "vanilla") -> dict:
    """A row per pipeline: its answers' figures, seconds and LLM tokens, their ratios to
    `reference`'s, and the share of questions that stopped after round 1."""
    base = mean([r["seconds"] for r in runs[reference]])
    base_tokens = mean([llm_tokens(r) for r in runs[reference]])
    rows = []
    for name, records in runs.items():
        seconds = mean([r["seconds"] for r in records])
        tokens = mean([llm_tokens(r) for r in records])
        traces = [r.get("trace") or {} for r in records]
        one = [len(t["rounds"]) == 1 for t in traces if "rounds" in t]
        rows.append([name, len(records), mean([r["metrics"]["em"] for r in records]),
                     mean([r["metrics"]["f1"] for r in records]),
                     mean([correct(r) for r in records]), seconds, seconds / base,
                     tokens, tokens / base_tokens, mean(one) if one else None])
    return results_json.table(
        ["pipeline", "n", "EM", "F1", "Acc", "s/q", "÷ vanilla", "LLM tokens/q", "÷ vanilla",
         "stopped after round 1"], rows,
        align=["", *["right"] * 9],
        formats=[None, "d", ".3f", ".3f", ".3f", ".2f", ".2f", ".0f", ".2f", ".2f"])


def agent_seconds(runs: dict[str, list[dict]]) -> dict:
    """A row per pipeline: the seconds a question each agent's LLM calls took."""
    agents = sorted({a for records in runs.values() for r in records for a in r["usage"]})
    rows = [[name, *[mean([r["usage"][a]["seconds"] if a in r["usage"] else 0.0
                           for r in records]) for a in agents]]
            for name, records in runs.items()]
    return results_json.table(["seconds/q by agent", *agents], rows,
                              align=["", *["right"] * len(agents)],
                              formats=[None, *[".2f"] * len(agents)])



@dataclass(frozen=True)
class Question:
    """One training question's three records: vanilla's, the round-1 answer's and the loop's."""

    source: str
    vanilla: dict
    first: dict
    loop: dict
    values: dict[str, float]


@dataclass(frozen=True)
class Rule:
    """How the gate is chosen: a signal with the most accurate bar within `cap` × vanilla's
    seconds, or a fixed choice (`answer`: always after round 1; `loop`: never)."""

    signal: str
    choice: str  # "cap", "answer" or "loop"
    cap: float | None = None

    @property
    def name(self) -> str:
        if self.choice == "answer":
            return "always answer after round 1"
        if self.choice == "loop":
            return "always loop"
        return f"{self.signal}, most accurate bar within {self.cap:g}× vanilla"

    def bar(self, questions: Sequence[Question]) -> float:
        """The bar this rule chooses on `questions`."""
        if self.choice == "answer":
            return 0.0
        if self.choice == "loop":
            return NEVER
        values = [q.values[self.signal] for q in questions]
        vanilla = mean([q.vanilla["seconds"] for q in questions])
        options = [(bar, *simulate(bar, values, [q.first for q in questions],
                                   [q.loop for q in questions]))
                   for bar in sorted({0.0, *values, NEVER})]
        affordable = [o for o in options if o[2] <= self.cap * vanilla] or options
        return max(affordable, key=lambda o: (o[1], -o[2]))[0]


RULES = (Rule("max_p", "answer"), Rule("max_p", "loop"),
         *(Rule(signal, "cap", cap) for signal in GATE_SIGNALS for cap in CAPS))


def measured(rule: Rule, bar: float, questions: Sequence[Question]) -> dict:
    """The gate at `bar` on `questions`: its accuracy against vanilla's, its seconds ÷
    vanilla's."""
    signal = rule.signal
    accuracy, seconds = simulate(bar, [q.values[signal] for q in questions],
                                 [q.first for q in questions], [q.loop for q in questions])
    vanilla_accuracy = mean([correct(q.vanilla) for q in questions])
    vanilla_seconds = mean([q.vanilla["seconds"] for q in questions])
    return {"questions": len(questions), "accuracy": round(accuracy, 4),
            "vanilla_accuracy": round(vanilla_accuracy, 4),
            "margin": round(accuracy - vanilla_accuracy, 4),
            "ratio": round(seconds / vanilla_seconds, 3),
            "answered_after_round_1": round(mean([q.values[signal] >= bar
                                                  for q in questions]), 3)}


def left_out(rules: Sequence[Rule], questions: Sequence[Question]
             ) -> tuple[Rule, dict[str, dict[str, dict]]]:
    """Each rule fitted on every source but one and measured on the one left out; the rule
    whose worst left-out margin over vanilla is best (margins within one question of the
    smallest source tie: then the smaller worst seconds ratio)."""
    sources = sorted({q.source for q in questions})
    table: dict[str, dict[str, dict]] = {}
    for rule in rules:
        table[rule.name] = {}
        for source in sources:
            fit = [q for q in questions if q.source != source]
            held = [q for q in questions if q.source == source]
            table[rule.name][source] = {"bar": rule.bar(fit), **measured(rule, rule.bar(fit),
                                                                         held)}
    tie = 1 / min(sum(q.source == s for q in questions) for s in sources)
    worst = {name: min(row["margin"] for row in rows.values()) for name, rows in table.items()}
    cost = {name: max(row["ratio"] for row in rows.values()) for name, rows in table.items()}
    best = max(worst.values())
    chosen = min((r for r in rules if worst[r.name] >= best - tie - 1e-9),
                 key=lambda r: (cost[r.name], -worst[r.name]))
    return chosen, table


def write_data(hotpotqa: Path, sources: Path, names: Sequence[str], per_source: int,
               limit: int, out: Path) -> tuple[Path, Path, dict[str, str]]:
    """The training file (`per_source` questions of each source), the held-out ids (HotpotQA
    questions outside the shipped filter's training questions) and the index over every
    passage of both; returns (training file, held-out ids file, source of each training id)."""
    out.mkdir(parents=True, exist_ok=True)
    rows, source_of = [], {}
    for name in names:
        with (sources / f"{name}.jsonl").open(encoding="utf-8") as lines:
            mine = [json.loads(line) for line in lines][:per_source]
        if len(mine) < per_source:
            raise SystemExit(f"{sources / (name + '.jsonl')}: {len(mine)} questions, "
                             f"--per-source asks for {per_source}")
        rows += mine
        source_of.update((row["id"], name) for row in mine)
    training = out / "train.jsonl"
    write_atomic(training, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    seen = {question for _, question in json.loads(SHIPPED_CARD.read_text(
        encoding="utf-8"))["dataset"]["train_questions"]}  # (source, id) pairs
    held = [e for e in load_examples(str(hotpotqa)) if e.id not in seen][:limit]
    ids = out / "heldout-ids.txt"
    write_atomic(ids, "".join(f"{e.id}\n" for e in held))
    index = out / "index"
    if not (index / "index.json").exists() and not any(index.glob("*")):
        passages: dict[tuple[str, str], dict] = {}
        for title, text in ([(c["title"], c["text"]) for r in rows for c in r["ctxs"]]
                            + [(d.title, d.text) for e in held for d in e.documents]):
            passages.setdefault((title, text), {"id": f"p{len(passages)}", "title": title,
                                                "text": text})
        corpus = out / "corpus.jsonl"
        write_atomic(corpus, "".join(json.dumps(p, ensure_ascii=False) + "\n"
                                     for p in passages.values()))
        build_index(corpus, index, IndexConfig(), show_progress=False)
        print(f"index: {len(passages)} passages of {len(rows)} training and {len(held)} "
              "held-out questions")
    return training, ids, source_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hotpotqa", type=Path, required=True,
                        help="HotpotQA distractor (the held-out source)")
    parser.add_argument("--sources", type=Path, default=Path("runs/sources"),
                        help="filter_sources.py's output folder")
    parser.add_argument("--train-sources", default="nq,squad,popqa")
    parser.add_argument("--per-source", type=int, default=50)
    parser.add_argument("--limit", type=int, default=60,
                        help="held-out questions on the given passages")
    parser.add_argument("--index-limit", type=int, default=None,
                        help="held-out questions over the index (default: --limit; the paper's "
                             "loop costs about 15 s a question there on 2 cores)")
    parser.add_argument("--set", action="append", default=[],
                        help="KEY=VALUE run setting for every run")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-adaptive"))
    parser.add_argument("--skip-given", action="store_true",
                        help="leave out step 4 (the given passages)")
    parser.add_argument("--quick", action="store_true", help="4 questions a source, 4 held out")
    results_json.add_option(parser)
    args = parser.parse_args(argv)
    per_source, limit = (4, 4) if args.quick else (args.per_source, args.limit)
    index_limit = min(limit, args.index_limit or limit)
    names = [n for n in args.train_sources.split(",") if n]
    if len(names) < 2:
        raise SystemExit("--train-sources: leave-one-source-out needs at least two sources")
    out = args.out
    training, heldout_ids, source_of = write_data(args.hotpotqa, args.sources, names,
                                                  per_source, limit, out)
    settings = [f for s in args.set for f in (f"--{s.partition('=')[0].replace('_', '-')}",
                                              s.partition("=")[2])]
    over_index = ["--preset", "amber-open", "--retrieval.index", str(out / "index"), *settings]

    # 1. The training runs.
    train = [*over_index, "--dataset", str(training)]
    fit = evaluate([*train, "--pipelines", "vanilla,amber-mcf", "--amber.answer-at", "0"],
                   out / "fit")
    loop = evaluate([*train, "--pipelines", "amber-mcf", "--no-amber.adaptive",
                     "--amber.collector.sufficiency-threshold", "1"],
                    out / "fit-loop")["amber-mcf"]
    questions = [Question(source_of[first["id"]], plain, first, looped,
                          signals(first, looped))
                 for plain, first, looped in zip(fit["vanilla"], fit["amber-mcf"], loop,
                                                 strict=True)]
    sources = sorted({q.source for q in questions})
    print(f"\n1. Training: {len(questions)} questions over the index "
          f"({', '.join(f'{s} {sum(q.source == s for q in questions)}' for s in sources)})")
    print("| source | vanilla acc | round-1 acc | loop acc | vanilla s/q | round-1 s/q | "
          "loop s/q | AUROC sufficiency | AUROC max_p | AUROC sum_p |")
    print("|---|" + "---:|" * 9)
    fit_auroc = {}
    for source in [*sources, "all"]:
        mine = [q for q in questions if source in ("all", q.source)]
        labels = [correct(q.first) for q in mine]
        fit_auroc[source] = {s: auroc([q.values[s] for q in mine], labels) for s in SIGNALS}
        print(f"| {source} | {mean([correct(q.vanilla) for q in mine]):.3f} | "
              f"{mean(labels):.3f} | {mean([correct(q.loop) for q in mine]):.3f} | "
              f"{mean([q.vanilla['seconds'] for q in mine]):.2f} | "
              f"{mean([q.first['seconds'] for q in mine]):.2f} | "
              f"{mean([q.loop['seconds'] - sufficiency_seconds(q.loop) for q in mine]):.2f} | "
              + " | ".join("–" if fit_auroc[source][s] is None else f"{fit_auroc[source][s]}"
                           for s in SIGNALS) + " |")

    # 2. The rule, leave-one-source-out; the default fitted on every training question.
    rule, table_ = left_out(RULES, questions)
    rules_table = results_json.table(
        ["rule", *(f"{s}: Δ acc / × s" for s in sources), "worst Δ acc", "worst × s"],
        [[name + (" (chosen)" if name == rule.name else ""),
          *(f"{rows[s]['margin']:+.3f} / {rows[s]['ratio']:.2f}×" for s in sources),
          min(r["margin"] for r in rows.values()), max(r["ratio"] for r in rows.values())]
         for name, rows in table_.items()],
        align=["", *["right"] * (len(sources) + 2)],
        formats=[None, *[None] * len(sources), "+.3f", ".2f"])
    print("\n2. Each rule fitted on the other sources, measured on the one left out "
          "(accuracy − vanilla's / seconds ÷ vanilla's)")
    print(results_json.markdown(rules_table))
    bar = rule.bar(questions)
    whole = measured(rule, bar, questions)
    print(f"chosen: {rule.name} → amber.evidence_signal={rule.signal}, amber.answer_at="
          f"{bar if bar < NEVER else 'never'} (on all {len(questions)}: accuracy "
          f"{whole['accuracy']:.3f} vs vanilla {whole['vanilla_accuracy']:.3f}, "
          f"{whole['ratio']:.2f}× vanilla's seconds)")

    # 3. Held-out, over the index.
    chosen = ["--amber.evidence-signal", rule.signal, "--amber.answer-at", f"{bar:.6f}"]
    held_base = [*over_index, "--dataset", str(args.hotpotqa), "--question-ids",
                 str(heldout_ids), "--limit", str(index_limit)]
    held = evaluate([*held_base, *chosen, "--pipelines", ",".join(HELD_OUT)],
                    out / "heldout-index")
    once = evaluate([*held_base, "--pipelines", "amber-mcf", "--amber.answer-at", "0"],
                    out / "heldout-round1")["amber-mcf"]
    held_found = [signals(a, b) for a, b in zip(once, held["amber-paper"], strict=True)]
    held_labels = [correct(r) for r in once]
    held_auroc = {name: auroc([s[name] for s in held_found], held_labels) for name in SIGNALS}
    print(f"\n3. Held-out HotpotQA, over the index ({len(held['vanilla'])} questions)")
    print(results_json.markdown(table(held)))
    print("\n" + results_json.markdown(agent_seconds(held)))
    print("\n| signal (round 1) | held-out AUROC for a right round-1 answer |\n|---|---:|")
    for name, value in held_auroc.items():
        print(f"| {name} | {'–' if value is None else value} |")

    # 4. Held-out, given passages.
    given = {}
    if not args.skip_given:
        given = evaluate(["--dataset", str(args.hotpotqa), *settings, *chosen,
                          "--question-ids", str(heldout_ids), "--limit", str(limit),
                          "--pipelines", ",".join(HELD_OUT)], out / "heldout-given")
        print(f"\n4. Held-out HotpotQA, given passages ({len(given['vanilla'])} questions; "
              "every passage is seen in round 1, so the loop has nothing to fetch)")
        print(results_json.markdown(table(given)))
        print("\n" + results_json.markdown(agent_seconds(given)))

    def summary(runs: dict[str, list[dict]]) -> dict:
        base = mean([r["seconds"] for r in runs["vanilla"]]) if "vanilla" in runs else 0.0
        return {name: {"accuracy": round(mean([correct(r) for r in records]), 4),
                       "f1": round(mean([r["metrics"]["f1"] for r in records]), 4),
                       "seconds_per_question": round(mean([r["seconds"] for r in records]), 3),
                       "ratio": round(mean([r["seconds"] for r in records]) / base, 3)
                       if base else None}
                for name, records in runs.items()}

    if args.results_json:
        tables = {"left_out": rules_table, "heldout_index": table(held),
                  "heldout_index_agents": agent_seconds(held)}
        if given:
            tables |= {"heldout_given": table(given),
                       "heldout_given_agents": agent_seconds(given)}
        results_json.write(args.results_json, tables)
    print(json.dumps({"fit": {"questions": len(questions), "sources": sources,
                              "rule": rule.name, "signal": rule.signal,
                              "answer_at": bar if bar < NEVER else None, "auroc": fit_auroc,
                              "left_out": table_},
                      "heldout_index": summary(held), "heldout_auroc": held_auroc,
                      "heldout_given": summary(given) if given else {}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
