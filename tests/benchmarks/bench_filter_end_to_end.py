"""The filter's default selection end to end: held-out questions asked through the filtering
proxy in front of a vLLM generator, under each way of choosing what the generator reads.

The generator is vLLM's CPU build serving SmolLM2-135M-Instruct through sieverag's launcher
(`VLLMServer`, as bench_engines.py runs it: float32, `--enforce-eager`, max_model_len 4096,
prefix caching on), started once for every arm. The filter runs in the proxy: the embedded
server built as `sieverag serve --engine local --proxy-to URL` builds it (the shipped filter,
served as smollm2-filter, float32), its model loaded once, one proxy app per rule set on that
engine, driven in this process through FastAPI's TestClient (`create_app`: the app `serve`
runs). Each question is the house's answer prompt (bench_filter_anywhere.py's:
`answer_with_documents`'s instruction, `answer_direct`'s question), greedy, 32 tokens at most,
its passages sent as the request's `documents` field.

  all               every passage, straight to the generator (the `<documents>` block the
                    proxy forwards had it kept every one).
  retrieval-top-k   the top_k (MCF's, 2) passages by z(BM25) + z(dense): what ranks without a
                    filter card (`--models.filter-card retrieval-only`); the proxy under
                    `--local.rerank.bar top_k` with the filter's card left out. (The card's
                    `--local.rerank.combination priors_only` is a fitted weighting of the
                    priors, the next arm, not this fusion.)
  priors-only       `--local.rerank.combination priors_only`: the card's fit of BM25 and dense
                    alone at its own calibrated bar; skipped, with the reason, when the card
                    holds no such fit (as eval-filter skips its row).
  filter-bm25       the filter's own score fused with BM25, z(s) + z(BM25), top 2
                    (`--local.rerank.lexical-weight 1 --local.rerank.bar top_k`): the filter
                    read on every passage, the arm issue 65 compares the default with.
  default-chunk     the proxy as `serve` starts it: MCF's defaults (the card's combination at
                    its calibrated bar; where the card has a home rule, a round that looks like
                    the filter's home text ranks by it), whole passages (`"granularity":
                    "chunk"`). Its rows are also given split by the rule that ranked each
                    question (`default-chunk (home)`, `default-chunk (away)`, from the proxy's
                    `bar_rule`).
  default-home      `--local.rerank.home home`: every round ranked by the card's home rule (a
                    deployment that knows it serves the filter's home text).
  default-sentence  the same proxy, `"granularity": "sentence"`: kept passages cut to their
                    key sentences (MCF's sentence stage).
  default-budget    the same proxy under a token budget (`"sieverag": {"context_tokens":
                    BUDGET_TOKENS}`): of the passages default-chunk keeps, the best context
                    that fits BUDGET_TOKENS tokens (whole passages best first while they fit,
                    then the next one's sentences that fit).

The proxy scores every passage with the filter under every arm, used or not: the s/q of the
retrieval arms is what such a proxy costs, not what retrieval alone would.

Questions: those of each `--dataset` file (common-format jsonl with `ctxs` and gold marks, or
any format `load_examples` reads) with a gold passage that neither trained the shipped filter
nor fitted its combination (eval-filter's own `training_questions` and `select_examples`),
grouped by source, the first `--questions` of each in the files' order. Each question is
asked under every arm in turn, the arms' order rotated from one question to the next, so a
busier moment or a warm cache favours no arm.

Per source and arm: accuracy (`answer_accuracy`: a gold alias in the normalised answer),
the generator's prompt tokens a question (its `usage`) and their ratio to `all`'s, seconds
a question (the client's wall time of the request: the proxy's filtering and the
generation), the share of gold passages forwarded (a question's gold passages kept, over
its gold passages, averaged) and passages forwarded a question.

    python tests/benchmarks/bench_filter_end_to_end.py --dataset FILE[,FILE...] [--quick]
        [--questions 30] [--arms all,retrieval-top-k,priors-only,default-chunk,default-sentence,
        default-budget]

A question takes 20-50 s on 2 busy CPU cores, every arm included (the sentence arm, whose
filter also generates, the slowest), so the default (30 questions a source) takes about 20
minutes a source besides vLLM's start (~1.5 minutes); `--quick` (3 questions a source) about
5 minutes for two sources, start included.

Prints a table per source, then one line of JSON with every figure; `--results-json PATH`
also writes docs/results/filter.md's table (docs/results/data/end_to_end.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from offline_env import run_offline

run_offline()

import httpx  # noqa: E402
import results_json  # noqa: E402
from bench_engines import (  # noqa: E402
    VLLM_ACCESS_LOG_OFF,
    VLLM_EAGER,
    VLLM_MAX_MODEL_LEN,
    cpu_features,
    log,
    vllm_version,
)
from bench_filter_anywhere import MAX_ANSWER_TOKENS, free_port, question_messages  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from sieverag.inference.core.errors import SieveragError  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import example_source  # noqa: E402
from sieverag.inference.filters.adapter_files import AdapterError  # noqa: E402
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter  # noqa: E402
from sieverag.inference.filters.card.card_file import CARD_FILE, read_card  # noqa: E402
from sieverag.inference.filters.card.combination import card_combination  # noqa: E402
from sieverag.inference.filters.mcf import MCFConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.inference.metrics.answer_scores import answer_accuracy  # noqa: E402
from sieverag.serving.app import create_app  # noqa: E402
from sieverag.serving.config import LocalServerConfig, VLLMLaunchConfig  # noqa: E402
from sieverag.serving.local_server import LocalServer  # noqa: E402
from sieverag.serving.proxy.marked_documents import Granularity  # noqa: E402
from sieverag.serving.vllm.launcher import VLLMServer  # noqa: E402
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig  # noqa: E402
from sieverag.training.evaluation.held_out_questions import (  # noqa: E402
    select_examples,
    training_questions,
)

ARMS = ("all", "retrieval-top-k", "priors-only", "filter-bm25", "default-chunk",
        "default-home", "default-sentence", "default-budget")
BASELINE = "all"
QUICK_QUESTIONS = 3
BUDGET_TOKENS = 256  # the default-budget arm's context budget
CHAT_PATH = "/v1/chat/completions"
FIGURES = (  # (key, column, format)
    ("accuracy", "accuracy", ".3f"),
    ("prompt_tokens", "prompt tok/q", ".1f"),
    ("prompt_tokens_ratio", "vs all", ".3f"),
    ("seconds_per_question", "s/q", ".2f"),
    ("gold_passages_kept", "gold kept", ".3f"),
    ("passages_kept", "passages/q", ".2f"),
)


@dataclass(frozen=True)
class Proxied:
    """How an arm goes through the proxy: the proxy's rules, whether the filter's card is
    left out (retrieval's fusion ranks), and the request's granularity."""

    rules: MCFConfig
    without_card: bool = False
    granularity: Granularity = "chunk"
    context_tokens: int | None = None  # the request's context budget

    @property
    def proxy_key(self) -> tuple[MCFConfig, bool]:
        """Arms with the same key share one proxy app."""
        return self.rules, self.without_card


PROXIED = {
    "retrieval-top-k": Proxied(MCFConfig(bar="top_k"), without_card=True),
    "priors-only": Proxied(MCFConfig(combination="priors_only")),
    "filter-bm25": Proxied(MCFConfig(bar="top_k", lexical_weight=1.0)),
    "default-home": Proxied(MCFConfig(home="home")),
    "default-chunk": Proxied(MCFConfig()),
    "default-sentence": Proxied(MCFConfig(), granularity="sentence"),
    "default-budget": Proxied(MCFConfig(), context_tokens=BUDGET_TOKENS),
}

# One question asked under one arm: its figures (None where it has no gold passage).
Row = dict[str, float | None]
Ask = Callable[[Example], tuple[dict, float]]


# ----- questions -----

def held_out_by_source(files: Sequence[str], per_source: int) -> dict[str, list[Example]]:
    """Each source's first `per_source` questions with a gold passage that neither trained the
    shipped filter nor fitted its combination (eval-filter's `training_questions`, read from
    the card), in the files' order; a question in two files counts once."""
    folder = resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL)
    config = FilterEvalConfig(dataset=tuple(files), out="")
    trained = training_questions(config, read_card(folder) or {}, f"{folder}/{CARD_FILE}")
    by_source: dict[str, list[Example]] = {}
    seen: set[tuple[str, str]] = set()
    for file in files:
        for example in select_examples(config, trained, file).examples:
            key = (example_source(example), example.id)
            if key not in seen:
                seen.add(key)
                by_source.setdefault(key[0], []).append(example)
    return {source: examples[:per_source] for source, examples in by_source.items()}


# ----- the servers -----

@contextmanager
def vllm_generator() -> Iterator[str]:
    """vLLM serving the base model (no adapter: it only generates), as bench_engines.py runs
    it; yields its OpenAI base URL."""
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, port=free_port(), dtype="float32",
                              max_model_len=VLLM_MAX_MODEL_LEN,
                              extra_args=f"{VLLM_EAGER} {VLLM_ACCESS_LOG_OFF}", cpu_cores="all")
    with VLLMServer(config) as server:
        yield server.base_url


@contextmanager
def proxy_apps(upstream_url: str, arms: Sequence[str]
               ) -> Iterator[tuple[dict[str, TestClient], LocalServer]]:
    """One proxy app per rule set of `arms`, all on one engine loaded as `sieverag serve
    --engine local --proxy-to UPSTREAM` loads it (the proxy's default filter); yields a client
    per arm and the server object (its cards and rankings)."""
    server = LocalServer(LocalServerConfig(model=DEFAULT_MODEL, port=0, dtype="float32",
                                           access_log=False, log_level="warning",
                                           proxy_to=upstream_url))
    assert server.proxy is not None  # proxy_to is set
    filter_model = server.proxy.filter_model
    server.engine.start()
    try:
        with ExitStack() as stack:
            clients: dict[tuple[MCFConfig, bool], TestClient] = {}
            for arm in arms:
                key = PROXIED[arm].proxy_key
                if key not in clients:
                    rules, without_card = key
                    cards = {name: card for name, card in server.cards.items()
                             if not (without_card and name == filter_model)}
                    app = create_app(server.engine,
                                     dataclasses.replace(server.config, rerank=rules),
                                     proxy=server.proxy, cards=cards)
                    clients[key] = stack.enter_context(TestClient(app))
            yield {arm: clients[PROXIED[arm].proxy_key] for arm in arms}, server
    finally:
        server.engine.close()


def unavailable_arms(server: LocalServer, arms: Sequence[str]) -> dict[str, str]:
    """The arms the filter's card cannot run, each with the reason."""
    assert server.proxy is not None
    name = server.proxy.filter_model
    skipped = {}
    if "priors-only" in arms:
        where = f"the card of {name!r}"
        try:
            card_combination(server.cards.get(name), where).priors_only_fit(where)
        except AdapterError as err:
            skipped["priors-only"] = str(err)
    return skipped


# ----- asking -----

def chat_body(example: Example, proxied: Proxied | None) -> dict:
    """The question, greedy; through the proxy its passages as the `documents` field, straight
    to the generator all of them in the block the proxy would forward."""
    body = {"model": DEFAULT_MODEL, "temperature": 0, "max_tokens": MAX_ANSWER_TOKENS,
            "messages": question_messages(example, with_block=proxied is None)}
    if proxied is not None:
        body["documents"] = [{"text": d.text, "title": d.title} for d in example.documents]
        body["granularity"] = proxied.granularity
        if proxied.context_tokens is not None:
            body["sieverag"] = {"context_tokens": proxied.context_tokens}
    return body


def checked(reply: httpx.Response, where: str) -> dict:
    if reply.status_code != 200:
        sys.exit(f"POST {where} answered {reply.status_code}: {reply.text[:500]}")
    return reply.json()


def askers(upstream_url: str, generator: httpx.Client, proxies: dict[str, TestClient]
           ) -> dict[str, Ask]:
    """Per arm: ask a question, giving the reply and the request's wall seconds."""
    def straight(example: Example) -> tuple[dict, float]:
        start = time.perf_counter()
        reply = generator.post(f"{upstream_url}/chat/completions",
                               json=chat_body(example, None))
        return checked(reply, upstream_url), time.perf_counter() - start

    def through(arm: str) -> Ask:
        def ask(example: Example) -> tuple[dict, float]:
            start = time.perf_counter()
            reply = proxies[arm].post(CHAT_PATH, json=chat_body(example, PROXIED[arm]))
            return checked(reply, f"the {arm} proxy"), time.perf_counter() - start
        return ask

    return {BASELINE: straight, **{arm: through(arm) for arm in proxies}}


def question_row(example: Example, reply: dict, seconds: float) -> Row:
    """One question's figures under one arm; an arm without the proxy's `sieverag` field
    forwarded every passage."""
    documents = len(example.documents)
    kept = reply.get("sieverag", {}).get("kept", list(range(documents)))
    gold = {i for i, d in enumerate(example.documents) if d.is_gold}
    answer = reply["choices"][0]["message"]["content"] or ""
    return {"home": (reply.get("sieverag", {}).get("bar_rule") or "").startswith("home_"),
            "accuracy": answer_accuracy(answer, example.answers),
            "prompt_tokens": float(reply["usage"]["prompt_tokens"]),
            "seconds_per_question": seconds,
            "gold_passages_kept": len(gold & set(kept)) / len(gold) if gold else None,
            "passages_kept": float(len(kept))}


def run_questions(questions: dict[str, list[Example]], ask: dict[str, Ask]
                  ) -> dict[str, dict[str, list[Row]]]:
    """Every question under every arm, the arms' order rotated question by question; the rows
    by source and arm."""
    arms = list(ask)
    rows: dict[str, dict[str, list[Row]]] = {s: {a: [] for a in arms} for s in questions}
    total = sum(len(e) for e in questions.values())
    done = 0
    for source, examples in questions.items():
        for example in examples:
            shift = done % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                reply, seconds = ask[arm](example)
                rows[source][arm].append(question_row(example, reply, seconds))
            done += 1
            tokens = "  ".join(f"{arm} {rows[source][arm][-1]['prompt_tokens']:.0f}"
                               for arm in arms)
            log(f"  {done}/{total} {source}: prompt tokens {tokens}")
    return rows


# ----- the report -----

def mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarise(rows: dict[str, list[Row]]) -> dict[str, dict[str, float | None]]:
    """Each arm's means, with its prompt tokens' ratio to `all`'s; the default's rows also
    split by the rule that ranked each question (home or away), where both occur."""
    rows = dict(rows)
    default = rows.get("default-chunk") or []
    if any(r["home"] for r in default) and not all(r["home"] for r in default):
        rows["default-chunk (home)"] = [r for r in default if r["home"]]
        rows["default-chunk (away)"] = [r for r in default if not r["home"]]
    figures = {arm: {key: mean([r[key] for r in arm_rows]) for key, _, _ in FIGURES
                     if key != "prompt_tokens_ratio"}
               for arm, arm_rows in rows.items()}
    baseline = figures[BASELINE]["prompt_tokens"]
    for arm_figures in figures.values():
        tokens = arm_figures["prompt_tokens"]
        arm_figures["prompt_tokens_ratio"] = (tokens / baseline if tokens is not None
                                              and baseline else None)
    return figures


def print_source(source: str, examples: Sequence[Example],
                 figures: dict[str, dict[str, float | None]]) -> None:
    passages = statistics.fmean(len(e.documents) for e in examples)
    print(f"\n{source}: {len(examples)} held-out questions, {passages:.1f} passages a question")
    print(f"{'arm':22}" + "".join(f"{column:>13}" for _, column, _ in FIGURES))
    for arm, values in figures.items():
        print(f"{arm:22}" + "".join(
            f"{'–' if values[key] is None else format(values[key], spec):>13}"
            for key, _, spec in FIGURES))


def results_table(figures: dict[str, dict[str, dict[str, float | None]]]) -> dict:
    """docs/results/filter.md's table: a row per source and arm."""
    return results_json.table(
        ["source", "arm", "accuracy", "prompt tokens/q", "vs all", "s/q", "gold kept",
         "passages/q"],
        [[source, arm, *(values[key] for key, _, _ in FIGURES)]
         for source, arms in figures.items() for arm, values in arms.items()],
        align=["", "", *["right"] * len(FIGURES)],
        formats=[None, None, ".3f", ",.0f", ".3f", ".2f", ".3f", ".2f"])


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {key: rounded(v) for key, v in value.items()}
    return value


def parse_arms(value: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in value.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown or BASELINE not in arms:
        raise argparse.ArgumentTypeError(
            f"arms are {', '.join(ARMS)}, `{BASELINE}` among them (the ratios' base); got "
            f"{value!r}")
    return tuple(a for a in ARMS if a in arms)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True,
                        help="comma-separated files of gold-marked questions, any source mix")
    parser.add_argument("--questions", type=int, default=None,
                        help=f"held-out questions a source (default 30; --quick "
                             f"{QUICK_QUESTIONS})")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK_QUESTIONS} questions a source")
    parser.add_argument("--arms", type=parse_arms, default=ARMS,
                        help=f"comma-separated arms (default every one: {','.join(ARMS)})")
    results_json.add_option(parser)
    args = parser.parse_args()
    files = [f for f in args.dataset.split(",") if f]
    missing = [f for f in files if not os.path.exists(f)]
    if missing or not files:
        sys.exit(f"--dataset: {', '.join(missing) or 'no file given'} not found; give "
                 "gold-marked question files (e.g. the shared data folder's "
                 "hotpotqa_distractor.jsonl, `sieverag hard-negatives` outputs)")
    per_source = args.questions or (QUICK_QUESTIONS if args.quick else 30)
    if per_source < 1:
        sys.exit(f"--questions must be >= 1, got {per_source}")
    try:
        questions = held_out_by_source(files, per_source)
    except SieveragError as error:
        sys.exit(f"--dataset: {error}")
    log("held-out questions: " + ", ".join(f"{s} {len(e)}" for s, e in questions.items()))

    try:
        with vllm_generator() as upstream_url, httpx.Client(timeout=600) as generator:
            version = vllm_version(upstream_url)
            log(f"vLLM {version} ready at {upstream_url}; loading the proxy's filter ...")
            proxied_arms = [a for a in args.arms if a != BASELINE]
            with proxy_apps(upstream_url, proxied_arms) as (proxies, server):
                skipped = unavailable_arms(server, proxied_arms)
                for arm, reason in skipped.items():
                    log(f"{arm}: skipped: {reason}")
                ranking = server.rankings[server.proxy.filter_model][1]
                ask = askers(upstream_url, generator,
                             {a: c for a, c in proxies.items() if a not in skipped})
                rows = run_questions(questions, ask)
    except SieveragError as error:
        sys.exit(str(error))

    figures = {source: summarise(arm_rows) for source, arm_rows in rows.items()}
    print(f"\nend to end through the filtering proxy: generator {DEFAULT_MODEL} on vLLM "
          f"{version} (CPU build, float32, {VLLM_EAGER}; greedy, {MAX_ANSWER_TOKENS} tokens), "
          f"filter {server.proxy.filter_model} in the proxy; {len(os.sched_getaffinity(0))} "
          f"CPU core(s) ({cpu_features()})")
    print(f"default: {ranking}")
    for source, source_figures in figures.items():
        print_source(source, questions[source], source_figures)
    for arm, reason in skipped.items():
        print(f"{arm}: not run: {reason}")
    print("(vs all: the arm's prompt tokens over all's; gold kept: the share of a question's "
          "gold passages forwarded)")
    setup = {"generator": DEFAULT_MODEL, "vllm_version": version, "filter":
             server.proxy.filter_model, "max_tokens": MAX_ANSWER_TOKENS, "quick": args.quick,
             "questions_per_source": per_source, "datasets": files,
             "top_k": MCFConfig().top_k, "cpu_cores": len(os.sched_getaffinity(0))}
    print(json.dumps({"setup": setup, "skipped": skipped, "sources": {
        source: {"questions": len(questions[source]), "arms": rounded(source_figures)}
        for source, source_figures in figures.items()}}))
    if args.results_json:
        results_json.write(args.results_json, {"main": results_table(figures)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
