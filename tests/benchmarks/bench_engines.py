"""The embedded engine against vLLM, side by side: the same model, adapter and requests on the
same machine in one run.

Both engines serve the embedded SmolLM2-135M-Instruct with the shipped filter's LoRA adapter
(smollm2-filter, served as `filter`), each in a process of its own, the clients in this one:
the embedded server as `sieverag serve --engine local` (float32, its default on a CPU, or
`--embedded-dtype`; its
default batching, on every core) and vLLM through sieverag's launcher (`VLLMServer`: the
CPU build in .venv-vllm, float32 by default (`--vllm-dtype`), `--enforce-eager` unless
`--vllm-compile` (vLLM's own default, torch.compile), max_model_len 4096, its threads bound to
every core, prefix caching on as the launcher sets it, its access log off
like the embedded server's). They run one after the other (vLLM first), never at once, each
started once and used for everything below. Every request is new to the engine that gets it
(no two measurements share a prompt), so vLLM's prefix cache only reuses what real traffic
shares: a prompt's instruction.

  start        seconds from launch until the server answers.
  filter       documents/s of the filter's chunk stage, with 1 and with 8 concurrent clients:
               one request per (question, passage) of held-out HotpotQA questions, each built
               as MCF builds it (`chunk_prompt`) and sent by the `openai` backend's
               `label_logprobs` (the "Yes"/"No" log-probs of the reply's first token), the
               backend's `max_concurrency` being the clients.
  generation   completion tokens/s (counted from the servers' `usage`) of chat completions
               from the base model, greedy, max_tokens 64, each asking for a summary of one
               HotpotQA passage, with 1 and with 16 concurrent clients.
  eval-filter  wall time of `sieverag eval-filter` (`run_filter_eval`, in this process) on
               held-out HotpotQA questions, the filter, its judge row's model and the
               generator all served by the engine: every row the command runs by default (MCF
               rows, BM25, dense, keep-all; `--judge` adds the MAIN-RAG judge row, its
               slowest); with the filter's AUROC (its own score) and the F1 of amber's
               default row, which should match between engines.
  amber-mcf    seconds per question of `sieverag eval` (`run_evaluation`) of the amber-mcf
               pipeline on held-out questions with their 10 passages, generator, judge and
               filter served by the engine (trust metrics off: they run in this process).

Held-out questions are those of the shipped filter's card that did not train it (its
`train_questions`, read as eval-filter reads them), in the dataset's order: the first ones go
to eval-filter, the next to amber-mcf, later ones to the filter requests; the generation
requests take passages of questions none of these use.
The ratio column is vLLM / embedded: above 1, vLLM is faster for rates; for times, below 1.
The agreement lines compare what both engines returned: the filter's score
s = log P(Yes) − log P(No) of every 1-client document, the generated replies, and the
eval-filter and amber-mcf figures.

    python tests/benchmarks/bench_engines.py [--quick] [--vllm-dtype float32] [--questions 30]
        [--amber-questions 5] [--vllm-compile] [--judge] [--skip-eval] [--data FILE]
        [--embedded-dtype bfloat16 --vllm-dtype bfloat16]

The default (filter requests of 4 and of 8 questions' passages, 8 and 32 generations,
eval-filter on 30 questions without its judge row, amber-mcf on 5) takes about 20 minutes on
2 CPU cores (`--judge` roughly doubles it). `--quick` (10 filter documents for each client
count, 2 and 16 generations, eval-filter on 3 questions without its judge row, amber-mcf on 1)
takes about 4 minutes besides vLLM's start (~40 s).
vLLM's CPU build has fast kernels only for x86-64 with AVX-512; these figures were measured on
a machine with AVX-512 (bf16, AMX), and the table's header says what this one has.

Prints a table, then one line of JSON with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offline_env import run_offline

run_offline()

import httpx  # noqa: E402
from bench_data import HOTPOT  # noqa: E402
from bench_filter_anywhere import free_port, start_server, wait_ready  # noqa: E402
from bench_server_abuse import stop_server  # noqa: E402

from sieverag.inference.composition.config import ModelRoles, RunConfig, TrustConfig  # noqa: E402
from sieverag.inference.core.errors import SieveragError  # noqa: E402
from sieverag.inference.core.io_utils import write_atomic  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import example_source, load_examples  # noqa: E402
from sieverag.inference.eval.runner import run_evaluation  # noqa: E402
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter  # noqa: E402
from sieverag.inference.filters.card.card_file import CARD_FILE, read_card  # noqa: E402
from sieverag.inference.filters.filter_format import (  # noqa: E402
    CHUNK_LABELS,
    chunk_prompt,
    relevance_log_odds,
)
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model  # noqa: E402
from sieverag.inference.llm.openai_backend import (  # noqa: E402
    OpenAIBackend,
    OpenAIBackendConfig,
)
from sieverag.serving.config import VLLMLaunchConfig  # noqa: E402
from sieverag.serving.vllm.launcher import VLLMServer  # noqa: E402
from sieverag.training.evaluation.filter_eval import run_filter_eval  # noqa: E402
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig  # noqa: E402
from sieverag.training.evaluation.held_out_questions import training_questions  # noqa: E402

ENGINES = ("embedded", "vllm")
FILTER = "filter"  # the adapter's served name on both engines
ADAPTERS = (f"{FILTER}={DEFAULT_FILTER_NAME}",)
VLLM_ACCESS_LOG_OFF = "--disable-uvicorn-access-log"
# torch.compile costs minutes at each start on 2 cores; --vllm-compile measures it anyway.
VLLM_EAGER = "--enforce-eager"
VLLM_MAX_MODEL_LEN = 4096
FILTER_CLIENTS = (1, 8)
GENERATION_CLIENTS = (1, 16)
MAX_TOKENS = 64
# The generation requests' one message: a passage to summarise, so replies run long.
GENERATION_REQUEST = "Summarise this passage in a few sentences.\n\n{passage}"
RATED = (  # (figure, unit): the figures compared by a ratio
    ("start_seconds", "s"),
    ("filter_docs_per_s_1", "docs/s"),
    ("filter_docs_per_s_8", "docs/s"),
    ("generation_tokens_per_s_1", "tokens/s"),
    ("generation_tokens_per_s_16", "tokens/s"),
    ("eval_filter_seconds", "s"),
    ("amber_seconds_per_question", "s/question"),
)


@dataclass(frozen=True)
class Sizes:
    """How much each measurement sends."""

    filter_questions: dict[int, int]  # clients -> questions whose passages are scored
    generations: dict[int, int]  # clients -> chat requests
    eval_questions: int
    amber_questions: int
    judge: bool  # eval-filter's MAIN-RAG judge row


@dataclass(frozen=True)
class Workload:
    """The requests and questions of a run, the same for both engines."""

    warm_filter: list[Example]
    filter_sets: dict[int, list[Example]]
    warm_generation: dict
    generation_sets: dict[int, list[dict]]
    eval_questions: list[Example]
    amber_questions: list[Example]


# ----- questions and requests -----

def held_out(data: Path, examples: Sequence[Example]) -> list[Example]:
    """The questions with a gold passage that did not train the shipped filter (its card's
    `train_questions`, read by eval-filter's own `training_questions`), in dataset order."""
    folder = resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL)
    card = read_card(folder) or {}
    config = FilterEvalConfig(dataset=(str(data),), out="")
    trained = training_questions(config, card, f"{folder}/{CARD_FILE}")
    if not trained.pairs:
        sys.exit(f"the card of {DEFAULT_FILTER_NAME} ({folder}) lists no training questions: "
                 "this benchmark cannot tell held-out questions")
    return [e for e in examples if any(d.is_gold for d in e.documents)
            and (example_source(e), e.id) not in trained.pairs]


def generation_body(passage: str) -> dict:
    return {"model": DEFAULT_MODEL, "max_tokens": MAX_TOKENS, "temperature": 0,
            "messages": [{"role": "user",
                          "content": GENERATION_REQUEST.format(passage=passage)}]}


def plan_workload(data: Path, sizes: Sizes) -> Workload:
    """Eval-filter's questions first, then amber-mcf's, then the filter requests' (a warm-up
    question, then one set per client count), all held out; generation requests summarise
    passages of questions none of those use. No two parts share a question."""
    examples = load_examples(data, "hotpotqa")
    held = held_out(data, examples)
    scored = 1 + sum(sizes.filter_questions.values())
    wanted = sizes.eval_questions + sizes.amber_questions + scored
    if len(held) < wanted:
        sys.exit(f"{data} holds {len(held)} held-out questions with a gold passage; this run "
                 f"needs {wanted}: lower --questions or --amber-questions")
    parts = iter(held)
    eval_questions = [next(parts) for _ in range(sizes.eval_questions)]
    amber_questions = [next(parts) for _ in range(sizes.amber_questions)]
    warm_filter = [next(parts)]
    filter_sets = {c: [next(parts) for _ in range(n)] for c, n in sizes.filter_questions.items()}
    used = {e.id for e in held[:wanted]}
    passages = iter(d.as_context() for e in examples if e.id not in used for d in e.documents)
    warm_generation = generation_body(next(passages))
    generation_sets = {c: [generation_body(next(passages)) for _ in range(n)]
                       for c, n in sizes.generations.items()}
    return Workload(warm_filter, filter_sets, warm_generation, generation_sets,
                    eval_questions, amber_questions)


def filter_prompts(examples: Sequence[Example]) -> list:
    """One chunk-stage prompt per (question, passage), as MCF's `chunk_scores` builds them."""
    return [chunk_prompt(e.question, d.text, d.title) for e in examples for d in e.documents]


def write_ids(path: Path, examples: Sequence[Example]) -> Path:
    write_atomic(path, "".join(f"{e.id}\n" for e in examples))
    return path


# ----- the engines -----

@contextmanager
def embedded_engine(dtype: str) -> Iterator[str]:
    """`sieverag serve --engine local` at `dtype` on a free port; yields its base URL, stops
    it (SIGINT) at the end."""
    server = start_server(0, "--model", DEFAULT_MODEL, "--adapters", ",".join(ADAPTERS),
                          "--local.dtype", dtype)
    try:
        wait_ready(server)
        yield server.base_url
    finally:
        stop_server(server)


@contextmanager
def vllm_engine(dtype: str, compiled: bool) -> Iterator[str]:
    """vLLM through sieverag's launcher on a free port, on every core; yields its base URL."""
    extra = VLLM_ACCESS_LOG_OFF if compiled else f"{VLLM_EAGER} {VLLM_ACCESS_LOG_OFF}"
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=ADAPTERS, port=free_port(),
                              dtype=dtype, max_model_len=VLLM_MAX_MODEL_LEN,
                              extra_args=extra, cpu_cores="all")
    with VLLMServer(config) as server:
        yield server.base_url


def vllm_version(base_url: str) -> str:
    try:
        return httpx.get(base_url.removesuffix("/v1") + "/version", timeout=5).json()["version"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "?"


# ----- the measurements -----

def measure_filter(base_url: str, workload: Workload) -> tuple[dict[str, float], list[float]]:
    """Documents/s per client count; and s of every document of the 1-client set."""
    figures: dict[str, float] = {}
    scores: list[float] = []
    for clients, examples in workload.filter_sets.items():
        backend = OpenAIBackend(OpenAIBackendConfig(
            base_url=base_url, model=FILTER, max_concurrency=clients,
            chat_template_model=str(resolve_model(DEFAULT_MODEL))))
        with backend:
            # Loads the tokenizer and opens the connections.
            backend.label_logprobs(filter_prompts(workload.warm_filter), CHUNK_LABELS)
            prompts = filter_prompts(examples)
            start = time.perf_counter()
            logprobs = backend.label_logprobs(prompts, CHUNK_LABELS, agent="filter_chunk")
            figures[f"filter_docs_per_s_{clients}"] = len(prompts) / (time.perf_counter() - start)
        if clients == 1:
            scores = [relevance_log_odds(lp) for lp in logprobs]
        log(f"  filter, {clients} client(s): {len(prompts)} documents, "
            f"{figures[f'filter_docs_per_s_{clients}']:.1f}/s")
    return figures, scores


async def concurrent_posts(url: str, bodies: Sequence[dict], clients: int
                           ) -> tuple[float, list[dict]]:
    """Seconds for `clients` concurrent clients to send every body once, and the replies in
    the bodies' order."""
    pending = iter(enumerate(bodies))
    replies: list[dict] = [{} for _ in bodies]

    async def client_loop(client: httpx.AsyncClient) -> None:
        for index, body in pending:
            reply = await client.post(url, json=body)
            if reply.status_code != 200:
                raise SystemExit(f"POST {url} answered {reply.status_code}: {reply.text[:500]}")
            replies[index] = reply.json()

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return time.perf_counter() - start, replies


def measure_generation(base_url: str, workload: Workload) -> tuple[dict[str, float], list[str]]:
    """Completion tokens/s per client count (the servers' `usage`); and the 1-client replies."""
    url = f"{base_url}/chat/completions"
    asyncio.run(concurrent_posts(url, [workload.warm_generation], 1))
    figures: dict[str, float] = {}
    texts: list[str] = []
    tokens_total = requests_total = 0
    for clients, bodies in workload.generation_sets.items():
        seconds, replies = asyncio.run(concurrent_posts(url, bodies, clients))
        tokens = sum(r["usage"]["completion_tokens"] for r in replies)
        figures[f"generation_tokens_per_s_{clients}"] = tokens / seconds
        tokens_total += tokens
        requests_total += len(replies)
        if clients == 1:
            texts = [r["choices"][0]["message"]["content"] or "" for r in replies]
        log(f"  generation, {clients} client(s): {len(replies)} requests, {tokens} tokens, "
            f"{tokens / seconds:.1f}/s")
    figures["generation_tokens_per_request"] = tokens_total / requests_total
    return figures, texts


def served_roles(base_url: str) -> ModelRoles:
    """Generator, judge and filter, all on the engine at `base_url`."""
    template = str(resolve_model(DEFAULT_MODEL))
    base = BackendSpec(model=DEFAULT_MODEL, endpoint=base_url, chat_template_model=template)
    return ModelRoles(generator=base, judge=base, filter=BackendSpec(
        model=FILTER, endpoint=base_url, chat_template_model=template))


def measure_eval_filter(roles: ModelRoles, data: Path, examples: Sequence[Example],
                        judge: bool, folder: Path) -> dict[str, float]:
    """`sieverag eval-filter` on `examples` (listed by id), with or without its judge row:
    wall seconds, the filter's AUROC and amber's default row's F1."""
    config = FilterEvalConfig(dataset=(str(data),), out=str(folder / "eval-filter"),
                              models=roles, limit=len(examples), judge=judge,
                              question_ids_file=str(
                                  write_ids(folder / "eval_filter_ids.txt", examples)))
    start = time.perf_counter()
    report = run_filter_eval(config)
    seconds = time.perf_counter() - start
    if report["questions"]["evaluated"] != len(examples):
        sys.exit(f"eval-filter evaluated {report['questions']['evaluated']} questions, "
                 f"{len(examples)} were listed")
    summary = next(iter(report["by_dataset"].values()))
    log(f"  eval-filter: {len(examples)} questions, {seconds:.1f} s")
    return {"eval_filter_seconds": seconds, "eval_filter_auroc": summary["filter_auroc"],
            "eval_filter_f1": summary["amber_default_f1"]}


def measure_amber(roles: ModelRoles, data: Path, examples: Sequence[Example], folder: Path
                  ) -> dict[str, float]:
    """`sieverag eval` of amber-mcf on `examples`: seconds per question (the runner's own
    per-question timing), accuracy and F1 of the answers, LLM calls per question."""
    config = RunConfig(dataset=str(data), pipelines=("amber-mcf",), models=roles,
                       question_ids=str(write_ids(folder / "amber_ids.txt", examples)),
                       trust=TrustConfig(enabled=False))
    summary = run_evaluation(config, folder / "amber")["amber-mcf"]
    log(f"  amber-mcf: {len(examples)} questions, {summary['seconds_per_question']:.1f} "
        "s/question")
    return {"amber_seconds_per_question": summary["seconds_per_question"],
            "amber_accuracy": summary.get("accuracy"), "amber_f1": summary.get("f1"),
            "amber_llm_calls_per_question": summary["llm_calls_per_question"]}


def measure_engine(base_url: str, started_s: float, workload: Workload, sizes: Sizes,
                   data: Path, skip_eval: bool, folder: Path
                   ) -> tuple[dict[str, Any], list[float], list[str]]:
    """Every measurement on one running engine: its figures, its 1-client filter scores and
    its 1-client generated replies."""
    figures: dict[str, Any] = {"start_seconds": started_s}
    filtered, scores = measure_filter(base_url, workload)
    generated, replies = measure_generation(base_url, workload)
    figures |= filtered | generated
    if not skip_eval:
        roles = served_roles(base_url)
        try:
            figures |= measure_eval_filter(roles, data, workload.eval_questions,
                                           sizes.judge, folder)
            figures |= measure_amber(roles, data, workload.amber_questions, folder)
        finally:
            for spec in (roles.generator, roles.filter):
                build_backend(spec).close()
    return figures, scores, replies


def preload_in_process_parts() -> None:
    """Load once, before any timing, what eval-filter and amber-mcf load in this process (the
    dense baseline's encoder, BM25, sklearn, matplotlib), so the engine measured first does
    not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import sklearn.metrics  # noqa: F401

    from sieverag.inference.retrieval import bm25  # noqa: F401
    from sieverag.inference.retrieval.dense import load_embedding_model

    load_embedding_model(FilterEvalConfig(dataset=(str(HOTPOT),), out="").embedding_model)


# ----- the report -----

def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_features() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "CPU flags unknown"
    has = {"AVX-512": "avx512f" in flags, "bf16": "avx512_bf16" in flags,
           "AMX": "amx_tile" in flags}
    return ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in has.items())


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def print_table(results: dict[str, dict[str, Any]], agreement: dict[str, Any],
                setup: dict[str, Any], sizes: Sizes) -> None:
    embedded, vllm = results["embedded"], results["vllm"]
    print(f"\nengines side by side: {DEFAULT_MODEL} + LoRA {DEFAULT_FILTER_NAME} (served as "
          f"{FILTER!r}), {setup['cpu_cores']} CPU core(s) ({cpu_features()})")
    print(f"embedded: `sieverag serve --engine local`, {setup['embedded_dtype']}, every core "
          f"| vLLM "
          f"{setup['vllm_version']} (CPU build): {setup['vllm_dtype']}, every core, "
          f"{'torch.compile' if setup['vllm_compiled'] else VLLM_EAGER}, prefix caching on")
    labels = {"start_seconds": "start",
              "filter_docs_per_s_1": f"filter, 1 client ({setup['filter_docs_1']} docs)",
              "filter_docs_per_s_8": f"filter, 8 clients ({setup['filter_docs_8']} docs)",
              "generation_tokens_per_s_1": f"generation, 1 client ({sizes.generations[1]} req.)",
              "generation_tokens_per_s_16":
                  f"generation, 16 clients ({sizes.generations[16]} req.)",
              "eval_filter_seconds": f"eval-filter, {sizes.eval_questions} q."
                                     + ("" if sizes.judge else ", no judge row"),
              "amber_seconds_per_question": f"amber-mcf, {sizes.amber_questions} question(s)"}
    print(f"{'':36}{'unit':>11}{'embedded':>10}{'vLLM':>10}{'vLLM/emb.':>11}")
    for key, unit in RATED:
        if key in embedded:
            print(f"{labels[key]:36}{unit:>11}{fmt(embedded[key]):>10}{fmt(vllm[key]):>10}"
                  f"{fmt(agreement[f'{key}_ratio'], 2):>11}")
    print("(vLLM / embedded: for a rate, above 1 is vLLM faster; for a time, below 1)")
    print(f"\nagreement{'':38}{'embedded':>10}{'vLLM':>10}")
    print(f"{'generation tokens per request':47}"
          f"{fmt(embedded['generation_tokens_per_request']):>10}"
          f"{fmt(vllm['generation_tokens_per_request']):>10}")
    for key, label in (("eval_filter_auroc", "eval-filter: filter AUROC"),
                       ("eval_filter_f1", "eval-filter: amber default row F1"),
                       ("amber_accuracy", "amber-mcf: accuracy")):
        if key in embedded:
            print(f"{label:47}{fmt(embedded[key], 3):>10}{fmt(vllm[key], 3):>10}")
    print(f"filter s = log P(Yes) - log P(No), largest |difference| over "
          f"{setup['filter_docs_1']} documents: {fmt(agreement['filter_score_max_abs_diff'], 4)}")
    print(f"generation, 1 client: identical replies {agreement['generation_identical']} of "
          f"{sizes.generations[1]}")


def rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 10 filter documents for each client count, 2 and 16 "
                             "generations, eval-filter on 3 questions without its judge row, "
                             "amber-mcf on 1")
    parser.add_argument("--embedded-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the embedded server's --local.dtype (bfloat16: AMX or AVX-512 "
                             "bf16 products where the CPU has them)")
    parser.add_argument("--vllm-dtype", default="float32",
                        choices=("float32", "bfloat16", "float16", "auto"),
                        help="vLLM's --dtype")
    parser.add_argument("--questions", type=int, default=None,
                        help="eval-filter's held-out questions (default 30; --quick 3)")
    parser.add_argument("--amber-questions", type=int, default=None,
                        help="amber-mcf's held-out questions (default 5; --quick 1)")
    parser.add_argument("--vllm-compile", action="store_true",
                        help="let vLLM compile its model (torch.compile, its default) instead "
                             "of --enforce-eager: minutes more at start")
    parser.add_argument("--judge", action="store_true",
                        help="run eval-filter's MAIN-RAG judge row too (its slowest; off by "
                             "default: the filter's own rows are what the engine serves)")
    parser.add_argument("--skip-eval", action="store_true",
                        help="only start, filter scoring and generation")
    parser.add_argument("--data", type=Path, default=HOTPOT,
                        help="HotpotQA distractor jsonl (default: the shared data folder's)")
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"HotpotQA data {args.data} not found: put hotpotqa_distractor.jsonl in the "
                 "shared data folder ($SIEVERAG_DATA_DIR, else ../shared/data beside the "
                 "checkout), or pass --data")
    for name in ("questions", "amber_questions"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    sizes = Sizes(
        filter_questions={1: 1, 8: 1} if args.quick else {1: 4, 8: 8},
        generations={1: 2, 16: 16} if args.quick else {1: 8, 16: 32},
        eval_questions=args.questions or (3 if args.quick else 30),
        amber_questions=args.amber_questions or (1 if args.quick else 5),
        judge=args.judge and not args.quick)
    workload = plan_workload(args.data, sizes)
    if not args.skip_eval:
        preload_in_process_parts()

    results: dict[str, dict[str, Any]] = {}
    scores: dict[str, list[float]] = {}
    replies: dict[str, list[str]] = {}
    version = "?"
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        for engine in ("vllm", "embedded"):  # vLLM first: a start that fails, fails early
            log(f"{engine}: starting ...")
            start = time.perf_counter()
            try:
                serving = (vllm_engine(args.vllm_dtype, args.vllm_compile) if engine == "vllm"
                           else embedded_engine(args.embedded_dtype))
                with serving as base_url:
                    started_s = time.perf_counter() - start
                    log(f"{engine}: ready at {base_url} after {started_s:.1f} s")
                    if engine == "vllm":
                        version = vllm_version(base_url)
                    folder = Path(tmp) / engine
                    results[engine], scores[engine], replies[engine] = measure_engine(
                        base_url, started_s, workload, sizes, args.data, args.skip_eval,
                        folder)
            except SieveragError as error:
                sys.exit(f"{engine}: {error}")

    agreement: dict[str, Any] = {
        f"{key}_ratio": results["vllm"][key] / results["embedded"][key]
        for key, _ in RATED if key in results["embedded"]}
    agreement["filter_score_max_abs_diff"] = max(
        abs(a - b) for a, b in zip(scores["vllm"], scores["embedded"], strict=True))
    agreement["generation_identical"] = sum(
        a == b for a, b in zip(replies["vllm"], replies["embedded"], strict=True))
    setup = {"vllm_version": version, "vllm_dtype": args.vllm_dtype,
             "vllm_compiled": args.vllm_compile,
             "embedded_dtype": args.embedded_dtype, "cpu_cores": len(os.sched_getaffinity(0)),
             "quick": args.quick,
             "filter_docs_1": sum(len(e.documents) for e in workload.filter_sets[1]),
             "filter_docs_8": sum(len(e.documents) for e in workload.filter_sets[8]),
             "generation_requests_1": sizes.generations[1],
             "generation_requests_16": sizes.generations[16], "max_tokens": MAX_TOKENS,
             **({} if args.skip_eval else {"eval_filter_questions": sizes.eval_questions,
                                           "eval_filter_judge": sizes.judge,
                                           "amber_questions": sizes.amber_questions})}
    print_table(results, agreement, setup, sizes)
    figures = {**setup, **{f"{engine}_{key}": value for engine in ENGINES
                           for key, value in results[engine].items()}, **agreement}
    print(json.dumps({key: rounded(value) for key, value in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
