"""Scores through vLLM against in-process, at float32 and at bfloat16, side by side in one run.

The shipped filter's P(Yes) (MCF's chunk score s = log P(Yes) − log P(No), P(Yes) its
logistic) and the MAIN-RAG judge's r on held-out HotpotQA chunks (tests/data/
hotpotqa_heldout_sample.jsonl: 5 questions with 10 passages each, none of which trained the
filter), computed three ways on the same inputs:

  in-process   the `hf` backend, float32 (the reference);
  vLLM fp32    vLLM's CPU build (.venv-vllm) through `sieverag serve --engine vllm`'s launcher,
               `--vllm.dtype float32`, read by the `openai` backend as every served role is;
  vLLM bf16    the same at `--vllm.dtype bfloat16`.

The judge's r is scored on the in-process Agent-1 answers (greedy answers may part at a bf16
near-tie, after which the whole answer differs; the test suite checks the answers themselves
at float32). The comparison is the GPU check's (tests/gpu/gpu_check.py `compare_filter`,
`compare_judge`): the largest difference, and the keep/drop verdicts that flipped outside the
tolerance's margin. The tests hold float32 to 1e-3 and bf16 to the GPU check's tolerances
(|ΔP(Yes)| <= 0.05, |Δr| <= 0.5 nats).

    python tests/benchmarks/bench_vllm_scores.py [--quick] [--questions 5] \\
        [--results-json docs/results/data/vllm_scores.json]

About 4 minutes on 2 CPU cores (two vLLM starts of ~40 s each); `--quick` (1 question) about 2.
Prints a table, then one line of JSON; `--results-json` also writes docs/results/serving.md's
table.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from offline_env import run_offline

run_offline()

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "gpu"))
import results_json  # noqa: E402
from gpu_check import compare_filter, compare_judge  # noqa: E402

from sieverag.inference.data.loading import load_examples  # noqa: E402
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, find_adapter  # noqa: E402
from sieverag.inference.filters.judge import MainRagJudge  # noqa: E402
from sieverag.inference.filters.mcf import MultiGranularFilter  # noqa: E402
from sieverag.inference.llm.backend_protocol import LLMBackend  # noqa: E402
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model  # noqa: E402
from sieverag.inference.llm.openai_backend import (  # noqa: E402
    OpenAIBackend,
    OpenAIBackendConfig,
)
from sieverag.serving.config import VLLMLaunchConfig  # noqa: E402
from sieverag.serving.vllm.launcher import VLLMServer  # noqa: E402

HELD_OUT = TESTS / "data" / "hotpotqa_heldout_sample.jsonl"
FILTER = "filter"
DTYPES = ("float32", "bfloat16")

Scores = dict[str, list[float]]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def filter_scores(backend: LLMBackend, examples: list) -> Scores:
    mcf = MultiGranularFilter(backend)
    return {e.id: [s["score"] for s in mcf.chunk_scores(e.question, e.documents)]
            for e in examples}


def judge_scores(backend: LLMBackend, examples: list, answers: dict[str, list[str]]) -> Scores:
    judge = MainRagJudge(backend)
    return {e.id: judge.judge_scores(e.question, e.documents, answers[e.id]) for e in examples}


def served(url: str, model: str) -> OpenAIBackend:
    return OpenAIBackend(OpenAIBackendConfig(
        base_url=url, model=model, chat_template_model=str(resolve_model(DEFAULT_MODEL)),
        timeout_s=600))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 question (10 chunks)")
    parser.add_argument("--questions", type=int, default=5,
                        help="held-out questions, 10 chunks each (at most 5)")
    results_json.add_option(parser)
    args = parser.parse_args()
    questions = 1 if args.quick else args.questions
    if not 1 <= questions <= 5:
        sys.exit(f"--questions must be in 1..5 (the sample holds 5), got {questions}")
    examples = load_examples(HELD_OUT, "hotpotqa", limit=questions)

    adapter = str(find_adapter(DEFAULT_FILTER_NAME).path)
    local_filter = HFBackend(HFBackendConfig(model=DEFAULT_MODEL, adapter=adapter,
                                             dtype="float32"))
    local_base = HFBackend(HFBackendConfig(model=DEFAULT_MODEL, dtype="float32"))
    reference_filter = filter_scores(local_filter, examples)
    predictor = MainRagJudge(local_base)
    answers = {e.id: predictor.predict_answers(e.question, e.documents) for e in examples}
    reference_judge = judge_scores(local_base, examples, answers)

    reports: dict[str, dict] = {}
    for dtype in DTYPES:
        print(f"vLLM at {dtype}: starting ...", file=sys.stderr, flush=True)
        config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=(f"{FILTER}={adapter}",),
                                  port=free_port(), dtype=dtype, cpu_cores="all",
                                  max_model_len=4096, extra_args="--enforce-eager")
        with VLLMServer(config) as server:
            with served(server.base_url, FILTER) as remote:
                measured_filter = filter_scores(remote, examples)
            with served(server.base_url, DEFAULT_MODEL) as remote:
                measured_judge = judge_scores(remote, examples, answers)
        reports[dtype] = {"filter": compare_filter(reference_filter, measured_filter),
                          "judge": compare_judge(reference_judge, measured_judge)}

    chunks = sum(len(e.documents) for e in examples)
    print(f"\nvLLM (CPU build) against in-process float32, shipped filter on "
          f"{DEFAULT_MODEL}, {chunks} held-out HotpotQA chunks")
    print(f"{'vLLM dtype':<12}{'max |dP(Yes)|':>15}{'filter flips':>14}"
          f"{'max |dr| (nats)':>17}{'judge flips':>13}")
    for dtype, report in reports.items():
        print(f"{dtype:<12}{report['filter']['max_abs_delta_p_yes']:>15.6f}"
              f"{len(report['filter']['verdict_flips_outside_margin']):>14}"
              f"{report['judge']['max_abs_delta_log_odds']:>17.6f}"
              f"{len(report['judge']['verdict_flips_outside_margin']):>13}")
    print("(flips: keep/drop verdicts that changed outside the GPU check's margin)")
    print(json.dumps({"chunks": chunks, **{
        f"{dtype}_{key}": value for dtype, report in reports.items() for key, value in (
            ("max_abs_delta_p_yes", report["filter"]["max_abs_delta_p_yes"]),
            ("max_abs_delta_judge_r", report["judge"]["max_abs_delta_log_odds"]),
            ("filter_flips", len(report["filter"]["verdict_flips_outside_margin"])),
            ("judge_flips", len(report["judge"]["verdict_flips_outside_margin"])))}}))
    if args.results_json:
        results_json.write(args.results_json, {"main": results_table(reports)})
    return 0


def results_table(reports: dict[str, dict]) -> dict:
    """docs/results/serving.md's table: per vLLM dtype the largest differences, and the
    keep/drop verdicts (filter's and judge's together) that flipped outside the margin."""
    return results_json.table(
        ["vLLM dtype", "max |ΔP(Yes)|", "max |Δr| (nats)", "keep/drop flips outside the margin"],
        [[dtype, report["filter"]["max_abs_delta_p_yes"],
          report["judge"]["max_abs_delta_log_odds"],
          len(report["filter"]["verdict_flips_outside_margin"])
          + len(report["judge"]["verdict_flips_outside_margin"])]
         for dtype, report in reports.items()],
        align=["", "right", "right", "right"], formats=[None, ".6f", ".6f", "d"])


if __name__ == "__main__":
    sys.exit(main())
