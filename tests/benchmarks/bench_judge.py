"""Judge-stage throughput: batched MAIN-RAG judge vs a naive one-document-at-a-time judge.

Batched: per question, Agent-1's answers for all its documents generated as one batch;
Agent-2 scored by `label_logprobs` (one forward pass, nothing decoded) on the prompt KV that
Agent-1 left in the backend's prompt cache (Agent-2 continues Agent-1's conversation, so only
its short request runs). Naive: per document, Agent-1 at batch size 1, then Agent-2's verdict
*generated* with its evidence (up to 48 new tokens) and parsed for Yes/No, on a backend with
no prompt cache. Same model weights, same (question, document) pairs, same prompts (the naive
judge's prompt adds the request for a verdict with evidence). The batched stage is also timed
without the prompt cache (`ratio_without_prompt_cache`), to show what each part brings.
The scoring part alone: `label_logprobs` over exactly the naive judge's prompts against the
time it took to generate their verdicts, and whether the two read the same decision
(log P(Yes) > log P(No) vs a verdict starting with Yes) where the verdict starts with Yes or
No. The batched judge's speed must not change what it decides: its kept/dropped decisions
(r ≥ τq) and Agent-1 answers are compared with those of one document at a time (the naive
side's Agent-1 answers, Agent-2 scored on them without the prompt cache). Last, `main-rag`
seconds and LLM calls per 10-document question.

    python tests/benchmarks/bench_judge.py [--quick] [--pairs 64] [--dataset PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_data import HOTPOT  # noqa: E402

from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.data.demo import write_demo_dataset  # noqa: E402
from sieverag.inference.filters.judge import NO, YES, MainRagJudge, judge_selection  # noqa: E402
from sieverag.inference.llm.backend_protocol import GenerationSettings  # noqa: E402
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.pipelines import PipelineContext, build_pipeline  # noqa: E402

# The naive judge asks for its verdict with evidence in place of the one-word reply.
ONE_WORD = "One word: Yes or No."
VERDICT_REQUEST = ('Answer in this form: "Yes, because <evidence from the document>" or '
                   '"No, because <reason>".')


def load_questions(dataset: Path, n_pairs: int) -> list[tuple[str, list]]:
    """Whole questions with their documents, cut so that exactly `n_pairs` pairs remain."""
    grouped, remaining = [], n_pairs
    for example in load_examples(dataset, limit=n_pairs):
        if remaining <= 0:
            break
        grouped.append((example.question, list(example.documents[:remaining])))
        remaining -= len(grouped[-1][1])
    return grouped


def batched_judge(judge: MainRagJudge, question: str, documents: list
                  ) -> tuple[list[str], list[float], float]:
    """(Agent-1's answers, Agent-2's scores, seconds) of the judge stage on one question as
    the pipeline runs it: Agent-1 answers all its documents in one batch, Agent-2 scores them
    in one forward pass."""
    start = time.perf_counter()
    answers = judge.predict_answers(question, documents)
    scores = judge.judge_scores(question, documents, answers)
    return answers, scores, time.perf_counter() - start


def kept_flags(judge: MainRagJudge, question: str, documents: list, scores: list[float]
               ) -> list[bool]:
    """The judge's decision on each document: kept (r ≥ τq) or dropped."""
    result = judge_selection(question, documents, scores, [{}] * len(documents), judge.config)
    return [scored.kept for scored in result.scored]


def parse_verdict(text: str) -> str | None:
    word = text.strip().lstrip("*\"' ").split(maxsplit=1)
    first = word[0].strip(".,:;!*").lower() if word else ""
    return {"yes": YES, "no": NO}.get(first)


def naive_judge(judge: MainRagJudge, pairs
                ) -> tuple[list, list[str], list[str], float, float]:
    """(judge prompts, verdict texts, Agent-1's answers, total seconds, verdict-generation
    seconds), one document at a time."""
    start = time.perf_counter()
    verdict_seconds = 0.0
    prompts, verdicts, answers = [], [], []
    predictor = GenerationSettings(max_new_tokens=judge.config.predictor_max_new_tokens,
                                   stop=("\n",))
    for question, document in pairs:
        prompt = judge.predictor_prompt.messages(question=question, document=document.as_context())
        answer = judge.backend.generate([prompt], predictor, agent="predictor")[0].strip()
        answers.append(answer)
        judge_prompt = judge.judge_messages(question, document, answer)
        assert ONE_WORD in judge_prompt[-1]["content"], "the evaluator template changed"
        judge_prompt[-1]["content"] = judge_prompt[-1]["content"].replace(ONE_WORD,
                                                                          VERDICT_REQUEST)
        prompts.append(judge_prompt)
        t = time.perf_counter()
        verdicts.append(judge.backend.generate([judge_prompt],
                                               GenerationSettings(max_new_tokens=48),
                                               agent="judge")[0])
        verdict_seconds += time.perf_counter() - t
    return prompts, verdicts, answers, time.perf_counter() - start, verdict_seconds


def score_verdict_prompts(judge: MainRagJudge, prompts, per_question: list[int]
                          ) -> tuple[list[float], float]:
    """(log P(Yes) − log P(No) per prompt, seconds): the naive judge's own prompts read by
    `label_logprobs`, one batched call per question as the pipeline would."""
    margins: list[float] = []
    start = time.perf_counter()
    for n in per_question:
        batch, prompts = prompts[:n], prompts[n:]
        margins += [lp[YES] - lp[NO]
                    for lp in judge.backend.label_logprobs(batch, [YES, NO], agent="judge")]
    return margins, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 pairs, 1 main-rag question")
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--questions", type=int, default=5, help="main-rag questions to time")
    parser.add_argument("--dataset", type=Path, default=None,
                        help="default: ../shared/data/hotpotqa_distractor.jsonl, else the demo set")
    args = parser.parse_args()
    n_pairs, n_questions = (16, 1) if args.quick else (args.pairs, args.questions)
    dataset = args.dataset or (HOTPOT if HOTPOT.is_file() else
                               write_demo_dataset(Path("/tmp/sieverag-bench-demo.jsonl")))
    backend = HFBackend(HFBackendConfig(batch_size=16))
    judge = MainRagJudge(backend)
    # The same loaded weights without the prompt cache: the naive judge, and the batched
    # judge with every prompt read whole.
    uncached = HFBackend(HFBackendConfig(batch_size=16, prompt_cache_tokens=0))
    plain_judge = MainRagJudge(uncached)
    questions = load_questions(dataset, n_pairs)
    pairs = [(q, d) for q, documents in questions for d in documents]
    backend.generate([[{"role": "user", "content": "warm up"}]], GenerationSettings(4))

    # Alternate question by question, so that a busier moment hits both sides alike.
    batched_s = uncached_s = naive_s = verdict_s = 0.0
    prompts, verdicts = [], []
    same_decisions = same_answers = 0
    for question, documents in questions:
        answers, scores, seconds = batched_judge(judge, question, documents)
        batched_s += seconds
        uncached_s += batched_judge(plain_judge, question, documents)[2]
        p, v, alone, seconds, verdict_seconds = naive_judge(plain_judge,
                                                            [(question, d) for d in documents])
        prompts, verdicts = prompts + p, verdicts + v
        naive_s, verdict_s = naive_s + seconds, verdict_s + verdict_seconds
        # Untimed: what one document at a time decides, Agent-2 reading each prompt whole.
        reference = plain_judge.judge_scores(question, documents, alone)
        same_answers += sum(a == b for a, b in zip(answers, alone, strict=True))
        same_decisions += sum(a == b for a, b in zip(
            kept_flags(judge, question, documents, scores),
            kept_flags(judge, question, documents, reference), strict=True))
    margins, scoring_s = score_verdict_prompts(plain_judge, prompts, [len(d) for _, d in questions])
    parsed = [parse_verdict(v) for v in verdicts]
    comparable = [(m, p) for m, p in zip(margins, parsed, strict=True) if p is not None]
    agree = sum((m > 0) == (p == YES) for m, p in comparable)

    pipeline = build_pipeline("main-rag", PipelineContext(generator=backend,
                                                          judge_backend=backend))
    timed = load_examples(dataset, limit=n_questions)
    before = backend.meter.snapshot()
    start = time.perf_counter()
    for example in timed:
        pipeline.run(example)
    main_rag_s = (time.perf_counter() - start) / len(timed)
    calls = sum(u.calls for u in backend.meter.since(before).values()) / len(timed)
    docs_per_q = sum(len(e.documents) for e in timed) / len(timed)

    n = len(pairs)
    figures = {
        "pairs": n,
        "judge_docs_per_s": round(n / batched_s, 3),
        "naive_docs_per_s": round(n / naive_s, 3),
        "ratio": round(naive_s / batched_s, 2),
        "same_decisions_as_one_at_a_time": f"{same_decisions}/{len(pairs)}",
        "same_answers_as_one_at_a_time": f"{same_answers}/{len(pairs)}",
        "judge_docs_per_s_without_prompt_cache": round(n / uncached_s, 3),
        "ratio_without_prompt_cache": round(naive_s / uncached_s, 2),
        "prompt_tokens_reused": backend.prompt_cache.reused_tokens,
        "scoring_docs_per_s": round(n / scoring_s, 3),
        "verdict_generation_docs_per_s": round(n / verdict_s, 3),
        "scoring_ratio": round(verdict_s / scoring_s, 2),
        "decision_agreement": round(agree / len(comparable), 3) if comparable else None,
        "verdicts_parsed": len(comparable),
        "verdict_yes_share": (round(sum(p == YES for _, p in comparable) / len(comparable), 3)
                              if comparable else None),
        "mean_verdict_words": round(sum(len(v.split()) for v in verdicts) / n, 1),
        "main_rag_seconds_per_question": round(main_rag_s, 2),
        "main_rag_llm_calls_per_question": calls,
        "main_rag_documents_per_question": docs_per_q,
    }
    print(f"dataset: {dataset}  model: {backend.model_name}  pairs: {n}")
    print(f"{'stage':<40}{'batched':>12}{'naive':>12}{'ratio':>8}")
    print(f"{'judge stage (Agent-1 + Agent-2), docs/s':<40}{figures['judge_docs_per_s']:>12}"
          f"{figures['naive_docs_per_s']:>12}{figures['ratio']:>8}")
    print(f"{'  the same without the prompt cache':<40}"
          f"{figures['judge_docs_per_s_without_prompt_cache']:>12}"
          f"{figures['naive_docs_per_s']:>12}{figures['ratio_without_prompt_cache']:>8}")
    print(f"{'scoring only (log-probs vs verdict), docs/s':<40}"
          f"{figures['scoring_docs_per_s']:>12}{figures['verdict_generation_docs_per_s']:>12}"
          f"{figures['scoring_ratio']:>8}")
    print(f"batched judge vs one document at a time: decisions (kept/dropped) the same for "
          f"{same_decisions} of {n} documents, Agent-1 answers for {same_answers} of {n}")
    print(f"Yes/No agreement where the verdict starts with Yes/No: {figures['decision_agreement']}"
          f" over {len(comparable)} of {n} verdicts")
    print(f"main-rag: {main_rag_s:.2f} s/question, {calls:.1f} LLM calls/question, "
          f"{docs_per_q:.1f} documents/question")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
