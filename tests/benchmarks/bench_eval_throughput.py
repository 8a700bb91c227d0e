"""Questions in flight: `sieverag eval` at N = 1 and N = 16 questions at once, three ways.

The same held-out HotpotQA questions (with their 10 given passages; held out: not among the
shipped filter's training questions) run through vanilla, main-rag and amber-mcf, each at
`--concurrency 1` and `--concurrency 16`, side by side in one run:

  in-process  the models in this process (N = 16: the questions' calls batched together on
              one worker, `llm.call_batching.CallBatcher`);
  embedded    `sieverag serve --engine local` in its own process (its batching engine);
  vllm        vLLM's CPU build through sieverag's launcher (`--enforce-eager`, prefix
              caching off: the N = 16 run reads the questions N = 1 just read, and a cache
              would hand it their prompts; the embedded server keeps no prefix cache).

Each way is warmed up on one other question first (models loaded, connections open), then
every pipeline runs N = 1, then N = 16, into fresh run folders; questions/s is the number of
questions over the run's wall time. Served roles allow 64 requests in flight
(`max_concurrency`), at both N.

**The engine's limit.** At 16 clients the benchmark measures each engine's own prefill rate
(prompt tokens/s: 16 one-token completions of different questions' passages at once) and decode
rate (completion tokens/s of 16 greedy 64-token replies at once, less their prefill time).
A pipeline that reads P prompt tokens and writes C completion tokens a question (its N = 16
run's mean usage) can run at most 1 / (P / prefill + C / decode) questions/s on that engine:
the "limit" column; "share" is the achieved questions/s over that limit.

**Agreement.** N = 16 against N = 1 of the same way and pipeline: questions whose prediction is
identical, whose documents read are identical, and the largest difference of any filter or
judge score (batching changes which rows share a forward pass: float rounding).

    python tests/benchmarks/bench_eval_throughput.py [--questions 16]
        [--ways in-process,embedded,vllm] [--pipelines vanilla,main-rag,amber-mcf] [--quick]

The issue's figure is `--questions 60` (about 2.5 hours on 2 CPU cores); the default, 16
questions, about 50 minutes; `--quick` (4 questions, vanilla only, in-process and embedded)
a few minutes. Prints a table, then one line of JSON with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from offline_env import run_offline

run_offline()

from bench_data import HOTPOT  # noqa: E402
from bench_engines import (  # noqa: E402
    ADAPTERS,
    VLLM_ACCESS_LOG_OFF,
    VLLM_EAGER,
    VLLM_MAX_MODEL_LEN,
    concurrent_posts,
    cpu_features,
    embedded_engine,
    generation_body,
    held_out,
    log,
    served_roles,
    write_ids,
)
from bench_filter_anywhere import free_port  # noqa: E402

from sieverag.inference.composition.config import ModelRoles, RunConfig, TrustConfig  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.eval.runner import run_evaluation  # noqa: E402
from sieverag.inference.llm.backend_protocol import GenerationSettings  # noqa: E402
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.serving.config import VLLMLaunchConfig  # noqa: E402
from sieverag.serving.vllm.launcher import VLLMServer  # noqa: E402

WAYS = ("in-process", "embedded", "vllm")
PIPELINES = ("vanilla", "main-rag", "amber-mcf")
CLIENTS = 16  # N of the batched runs, and the clients of the engine's own rates
SERVED_REQUESTS_IN_FLIGHT = 64
DECODE_TOKENS = 64


# ----- the engine's own rates at 16 clients -----

def rate_prompts(examples: Sequence[Example]) -> list[str]:
    """One prompt per question: its passages, as a reader would see them (no shared prefix)."""
    return ["\n\n".join(d.as_context() for d in e.documents) + f"\n\nQuestion: {e.question}"
            for e in examples]


def served_rates(base_url: str, prompts: Sequence[str], passages: Sequence[str]
                 ) -> dict[str, float]:
    """Prefill tokens/s and decode tokens/s of the server at `base_url`, 16 clients."""
    prefill_bodies = [{"model": DEFAULT_MODEL, "prompt": p, "max_tokens": 1, "temperature": 0}
                      for p in prompts]
    asyncio.run(concurrent_posts(f"{base_url}/completions", prefill_bodies[:1], 1))  # warm
    seconds, replies = asyncio.run(concurrent_posts(f"{base_url}/completions",
                                                    prefill_bodies, CLIENTS))
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in replies)
    prefill = prompt_tokens / seconds
    decode_bodies = [generation_body(p) for p in passages]
    seconds, replies = asyncio.run(concurrent_posts(f"{base_url}/chat/completions",
                                                    decode_bodies, CLIENTS))
    read = sum(r["usage"]["prompt_tokens"] for r in replies)
    written = sum(r["usage"]["completion_tokens"] for r in replies)
    return {"prefill_tokens_per_s": prefill,
            "decode_tokens_per_s": written / max(seconds - read / prefill, 1e-9)}


def in_process_rates(prompts: Sequence[str], passages: Sequence[str]) -> dict[str, float]:
    """The same two rates for the in-process model (the generator's backend), 16 prompts in
    one call as the batcher merges them."""
    backend = build_backend(BackendSpec())
    chats = [[{"role": "user", "content": p}] for p in prompts]
    backend.label_logprobs(chats[:1], ["Yes", "No"])  # warm
    before = backend.meter.snapshot()
    start = time.perf_counter()
    backend.label_logprobs(chats, ["Yes", "No"], agent="rate")
    seconds = time.perf_counter() - start
    prefill = backend.meter.since(before)["rate"].prompt_tokens / seconds
    asks = [[{"role": "user", "content": generation_body(p)["messages"][0]["content"]}]
            for p in passages]
    before = backend.meter.snapshot()
    start = time.perf_counter()
    backend.generate(asks, GenerationSettings(max_new_tokens=DECODE_TOKENS), agent="rate")
    seconds = time.perf_counter() - start
    used = backend.meter.since(before)["rate"]
    return {"prefill_tokens_per_s": prefill,
            "decode_tokens_per_s": used.completion_tokens / max(
                seconds - used.prompt_tokens / prefill, 1e-9)}


# ----- the runs -----

def roles_for(way: str, base_url: str | None) -> ModelRoles:
    if base_url is None:
        return ModelRoles()
    roles = served_roles(base_url)
    wide = {"max_concurrency": SERVED_REQUESTS_IN_FLIGHT}
    return ModelRoles(generator=replace(roles.generator, **wide),
                      judge=replace(roles.judge, **wide), filter=replace(roles.filter, **wide))


def run_once(roles: ModelRoles, pipeline: str, ids: Path, folder: Path, concurrency: int
             ) -> tuple[float, list[dict]]:
    """Wall seconds of one `eval` run and its records (dataset order)."""
    config = RunConfig(dataset=str(HOTPOT), pipelines=(pipeline,), models=roles,
                       question_ids=str(ids), trust=TrustConfig(enabled=False))
    start = time.perf_counter()
    run_evaluation(config, folder, progress=False, concurrency=concurrency)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (folder / "results" / f"{pipeline}.jsonl").open()]
    order = [line.strip() for line in ids.read_text().splitlines()]
    records.sort(key=lambda r: order.index(r["id"]))
    return seconds, records


def agreement(one: list[dict], many: list[dict]) -> dict[str, Any]:
    """Identical predictions and documents read, and the largest score difference."""
    same_prediction = sum(a["prediction"] == b["prediction"] for a, b in zip(one, many,
                                                                             strict=True))
    same_read = sum(a["documents_read"] == b["documents_read"] for a, b in zip(one, many,
                                                                               strict=True))
    largest = 0.0
    for a, b in zip(one, many, strict=True):
        if a.get("filter") and b.get("filter"):
            left = {s["id"]: s["score"] for s in a["filter"]["scores"]}
            right = {s["id"]: s["score"] for s in b["filter"]["scores"]}
            largest = max([largest] + [abs(left[k] - right[k]) for k in left.keys() & right])
    return {"questions": len(one), "same_predictions": same_prediction,
            "same_documents_read": same_read, "largest_score_difference": largest}


def tokens_per_question(records: list[dict]) -> tuple[float, float]:
    """Mean prompt and completion tokens a question, every agent."""
    prompt = sum(u["prompt_tokens"] for r in records for u in r["usage"].values())
    written = sum(u["completion_tokens"] for r in records for u in r["usage"].values())
    return prompt / len(records), written / len(records)


def measure_way(way: str, base_url: str | None, pipelines: Sequence[str],
                examples: Sequence[Example], warm: Example, rate_set: Sequence[Example],
                passages: Sequence[str], folder: Path) -> dict[str, Any]:
    roles = roles_for(way, base_url)
    warm_ids = write_ids(folder / "warm_ids.txt", [warm])
    for pipeline in pipelines:  # models loaded, connections open
        run_once(roles, pipeline, warm_ids, folder / f"warm-{pipeline}", 1)
    prompts = rate_prompts(rate_set)
    rates = (in_process_rates(prompts, passages) if base_url is None
             else served_rates(base_url, prompts, passages))
    log(f"{way}: prefill {rates['prefill_tokens_per_s']:.0f} tokens/s, decode "
        f"{rates['decode_tokens_per_s']:.0f} tokens/s at {CLIENTS} clients")
    ids = write_ids(folder / "ids.txt", examples)
    figures: dict[str, Any] = {"rates": rates}
    for pipeline in pipelines:
        one_s, one = run_once(roles, pipeline, ids, folder / f"{pipeline}-1", 1)
        many_s, many = run_once(roles, pipeline, ids, folder / f"{pipeline}-{CLIENTS}", CLIENTS)
        prompt, written = tokens_per_question(many)
        limit = 1 / (prompt / rates["prefill_tokens_per_s"]
                     + written / rates["decode_tokens_per_s"])
        row = {"qps_1": len(examples) / one_s, "qps_16": len(examples) / many_s,
               "prompt_tokens_per_q": prompt, "completion_tokens_per_q": written,
               "limit_qps": limit, **agreement(one, many)}
        row["ratio"] = row["qps_16"] / row["qps_1"]
        row["share_1"], row["share_16"] = row["qps_1"] / limit, row["qps_16"] / limit
        log(f"{way} {pipeline}: {row['qps_1']:.3f} -> {row['qps_16']:.3f} q/s "
            f"({row['ratio']:.2f}x), limit {limit:.3f} q/s, share {row['share_16']:.0%}")
        figures[pipeline] = row
        log(json.dumps({"way": way, "pipeline": pipeline, **row}))  # kept if a later way fails
    return figures


@contextmanager
def engine(way: str) -> Iterator[str | None]:
    if way == "in-process":
        yield None
    elif way == "embedded":
        with embedded_engine("float32") as base_url:
            yield base_url
    else:
        # Prefix caching off: the N = 16 run reads the same questions right after N = 1, and
        # a cache would serve it their prompts for free.
        config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=ADAPTERS, port=free_port(),
                                  dtype="float32", max_model_len=VLLM_MAX_MODEL_LEN,
                                  extra_args=f"{VLLM_EAGER} {VLLM_ACCESS_LOG_OFF}",
                                  cpu_cores="all", prefix_caching=False)
        with VLLMServer(config) as server:
            yield server.base_url


def print_table(results: dict[str, dict[str, Any]], pipelines: Sequence[str]) -> None:
    print(f"questions in flight, N = 1 against N = {CLIENTS}; CPU: {cpu_features()}\n")
    print("| way | pipeline | q/s N=1 | q/s N=16 | ratio | limit q/s | share N=1 | share N=16 "
          "| same predictions | same documents read | largest score diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for way, figures in results.items():
        for pipeline in pipelines:
            r = figures[pipeline]
            print(f"| {way} | {pipeline} | {r['qps_1']:.3f} | {r['qps_16']:.3f} | "
                  f"{r['ratio']:.2f} | {r['limit_qps']:.3f} | {r['share_1']:.0%} | "
                  f"{r['share_16']:.0%} | {r['same_predictions']}/{r['questions']} | "
                  f"{r['same_documents_read']}/{r['questions']} | "
                  f"{r['largest_score_difference']:.2e} |")
    print("\nengine rates at 16 clients (tokens/s):")
    for way, figures in results.items():
        rates = figures["rates"]
        print(f"  {way}: prefill {rates['prefill_tokens_per_s']:.0f}, decode "
              f"{rates['decode_tokens_per_s']:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    ways = args.ways.split(",")
    pipelines = args.pipelines.split(",")
    questions = args.questions
    if args.quick:
        ways, pipelines, questions = ["in-process", "embedded"], ["vanilla"], 4
    unknown = [w for w in ways if w not in WAYS] + [p for p in pipelines if p not in PIPELINES]
    if unknown:
        parser.error(f"unknown way(s) or pipeline(s): {', '.join(unknown)}")
    if not HOTPOT.is_file():
        sys.exit(f"{HOTPOT} not found (set SIEVERAG_DATA_DIR)")
    examples = held_out(HOTPOT, load_examples(HOTPOT, "hotpotqa"))
    if len(examples) < questions + 1 + CLIENTS + CLIENTS:
        sys.exit(f"{HOTPOT} holds {len(examples)} held-out questions; fewer are needed")
    run_set, warm = examples[:questions], examples[questions]
    rate_set = examples[questions + 1:questions + 1 + CLIENTS]
    passages = [e.documents[0].as_context()
                for e in examples[questions + 1 + CLIENTS:questions + 1 + 2 * CLIENTS]]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-eval-throughput-") as scratch:
        for way in ways:  # one after the other, never two engines at once
            with engine(way) as base_url:
                folder = Path(scratch) / way
                folder.mkdir()
                results[way] = measure_way(way, base_url, pipelines, run_set, warm, rate_set,
                                           passages, folder)
    print_table(results, pipelines)
    print(json.dumps({"questions": questions, "clients": CLIENTS, "ways": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
