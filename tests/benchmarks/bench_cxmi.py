"""CXMI labelling throughput (shared-prefix, batched vs naive) and label agreement with gold.

Data: the first HotpotQA distractor questions of ../shared/data that carry sentence-level
supporting facts (50 by default, 3 with --quick), all 10 passages each (3 with --quick),
sentence level, on the embedded SmolLM2-135M-Instruct.

(a) Speed: `SharedPrefixCXMI` (the no-context pass once per question; the prompt part shared
    by all of a question's sentences — instruction + question — computed once and its KV
    cache reused; only the per-sentence part after it computed, in batches) against
    `naive_cxmi` (two forward passes per sentence, batch size 1, same prompt format). Both
    run on every question, in alternating order per question so load from other processes
    weighs on both alike. `ratio` = naive seconds / fast seconds (target >= 3);
    `cpu_ratio` is the same from this process's CPU time, steadier on shared cores;
    `max_abs_diff` = the largest |fast − naive| CXMI score (target <= 1e-4).
(b) Agreement with gold: precision / recall / F1 of STRINC and CXMI (several thresholds)
    against HotpotQA's gold passages (chunk level; chunk CXMI computed with the fast scorer,
    untimed) and supporting sentences (sentence level), pooled over the benchmark questions;
    STRINC also over the whole file (it needs no model).

    python tests/benchmarks/bench_cxmi.py [--quick] [--questions N] [--passages N] [--threads N]

Prints tables, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_data import HOTPOT  # noqa: E402

from sieverag.data_gen.cxmi import SharedPrefixCXMI, naive_cxmi  # noqa: E402
from sieverag.data_gen.labelling import chunk_sentences  # noqa: E402
from sieverag.data_gen.strinc import strinc  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402

DATA = HOTPOT
THRESHOLDS = (0.0, 0.5, 1.0, 2.0, 4.0)


class Pooled:
    """Pooled precision / recall / F1 counts."""

    def __init__(self) -> None:
        self.tp = self.fp = self.fn = 0

    def add(self, predicted: bool, gold: bool) -> None:
        self.tp += predicted and gold
        self.fp += predicted and not gold
        self.fn += gold and not predicted

    def scores(self) -> dict[str, float]:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        return {"precision": round(p, 3), "recall": round(r, 3), "f1": round(f1, 3)}


def sentence_items(example: Example, passages: int) -> list[tuple[str, bool]]:
    """(sentence, is a gold supporting sentence) over the example's first passages."""
    items = []
    for document in example.documents[:passages]:
        sentences, _ = chunk_sentences(document)
        gold = set(document.supporting_sentences or ())
        items.extend((s, i in gold) for i, s in enumerate(sentences))
    return items


def timed(function, *args):
    """The result, wall seconds and CPU seconds of this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 questions x 3 passages")
    parser.add_argument("--questions", type=int, help="questions (default 50; 3 with --quick)")
    parser.add_argument("--passages", type=int, help="passages per question (default 10)")
    parser.add_argument("--data", default=str(DATA), help="HotpotQA distractor jsonl")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="scorer model")
    parser.add_argument("--batch-size", type=int, default=16, help="fast scorer batch size")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on cores shared with other jobs "
                             "more threads run several times slower; 0 = torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n_questions = args.questions or (3 if args.quick else 50)
    n_passages = args.passages or (3 if args.quick else 10)
    if not Path(args.data).is_file():
        print(f"bench_cxmi: {args.data} not found; give --data", file=sys.stderr)
        return 2

    all_examples = load_examples(args.data, "hotpotqa")
    examples = [e for e in all_examples
                if any(d.supporting_sentences for d in e.documents)][:n_questions]
    backend = HFBackend(HFBackendConfig(model=args.model, device="cpu",
                                        batch_size=args.batch_size))
    fast_scorer = SharedPrefixCXMI(backend)
    warm = examples[0]
    fast_scorer.score(warm.question, warm.answers, [warm.documents[0].text])
    naive_cxmi(backend, warm.question, warm.answers, [warm.documents[0].text])

    fast_s = naive_s = fast_cpu_s = naive_cpu_s = 0.0
    max_abs_diff = 0.0
    sentences_scored = 0
    sentence_cxmi: list[tuple[float, bool]] = []
    sentence_strinc = Pooled()
    for number, example in enumerate(examples, start=1):
        items = sentence_items(example, n_passages)
        contexts = [s for s, _ in items]
        runs = [("fast", fast_scorer.score),
                ("naive", lambda q, a, c: naive_cxmi(backend, q, a, c))]
        if number % 2 == 0:
            runs.reverse()
        results = {}
        for name, score in runs:
            results[name], seconds, cpu = timed(score, example.question, example.answers,
                                                contexts)
            if name == "fast":
                fast_s, fast_cpu_s = fast_s + seconds, fast_cpu_s + cpu
            else:
                naive_s, naive_cpu_s = naive_s + seconds, naive_cpu_s + cpu
        max_abs_diff = max([max_abs_diff] + [abs(f.score - n.score) for f, n in
                                             zip(results["fast"], results["naive"], strict=True)])
        sentences_scored += len(contexts)
        for (sentence, gold), score in zip(items, results["fast"], strict=True):
            sentence_cxmi.append((score.score, gold))
            sentence_strinc.add(strinc(sentence, example.answers), gold)
        print(f"  [{number}/{len(examples)}] {len(contexts)} sentences, fast {fast_s:.1f}s, "
              f"naive {naive_s:.1f}s so far", file=sys.stderr)

    chunk_cxmi: list[tuple[float, bool]] = []
    chunk_strinc = Pooled()
    for example in examples:
        documents = example.documents[:n_passages]
        scores = fast_scorer.score(example.question, example.answers,
                                   [d.as_context() for d in documents])
        for document, score in zip(documents, scores, strict=True):
            chunk_cxmi.append((score.score, bool(document.is_gold)))
            chunk_strinc.add(strinc(document.as_context(), example.answers),
                             bool(document.is_gold))

    file_chunk, file_sentence = Pooled(), Pooled()
    for example in all_examples:
        for document in example.documents:
            file_chunk.add(strinc(document.as_context(), example.answers), bool(document.is_gold))
            if document.supporting_sentences is not None and document.sentences:
                gold = set(document.supporting_sentences)
                for i, sentence in enumerate(chunk_sentences(document)[0]):
                    file_sentence.add(strinc(sentence, example.answers), i in gold)

    def by_threshold(pairs: list[tuple[float, bool]]) -> dict[str, dict[str, float]]:
        table = {}
        for threshold in THRESHOLDS:
            pooled = Pooled()
            for score, gold in pairs:
                pooled.add(score > threshold, gold)
            table[f"cxmi>{threshold:g}"] = pooled.scores()
        return table

    agreement = {
        "chunk": {"strinc": chunk_strinc.scores(), **by_threshold(chunk_cxmi)},
        "sentence": {"strinc": sentence_strinc.scores(), **by_threshold(sentence_cxmi)},
        "file_strinc": {"chunk": file_chunk.scores(), "sentence": file_sentence.scores()},
    }
    ratio = naive_s / fast_s
    print(f"\nCXMI, {len(examples)} HotpotQA questions x {n_passages} passages, sentence level, "
          f"{sentences_scored} sentences, model {args.model}, {torch.get_num_threads()} "
          "CPU thread(s)")
    print(f"{'implementation':<34}{'seconds':>10}{'CPU seconds':>13}{'sentences/s':>14}")
    print(f"{'shared-prefix KV cache, batched':<34}{fast_s:>10.1f}{fast_cpu_s:>13.1f}"
          f"{sentences_scored / fast_s:>14.1f}")
    print(f"{'naive (2 passes/sentence, bs 1)':<34}{naive_s:>10.1f}{naive_cpu_s:>13.1f}"
          f"{sentences_scored / naive_s:>14.1f}")
    print(f"ratio {ratio:.2f}x (CPU time {naive_cpu_s / fast_cpu_s:.2f}x), "
          f"max |fast - naive| = {max_abs_diff:.2e}")
    print(f"\nagreement with gold ({len(examples)} questions; chunk gold = is_gold, "
          "sentence gold = supporting facts)")
    print(f"{'level':<10}{'signal':<12}{'precision':>10}{'recall':>8}{'F1':>8}")
    for level in ("chunk", "sentence"):
        for name, s in agreement[level].items():
            print(f"{level:<10}{name:<12}{s['precision']:>10.3f}{s['recall']:>8.3f}"
                  f"{s['f1']:>8.3f}")
    for level, s in agreement["file_strinc"].items():
        print(f"{level:<10}{'strinc*':<12}{s['precision']:>10.3f}{s['recall']:>8.3f}"
              f"{s['f1']:>8.3f}")
    print(f"* over the whole file ({len(all_examples)} questions; sentence level: the rows "
          "with supporting facts)")
    print(json.dumps({
        "questions": len(examples), "passages": n_passages,
        "threads": torch.get_num_threads(), "sentences": sentences_scored,
        "fast_s": round(fast_s, 2), "naive_s": round(naive_s, 2),
        "fast_sentences_per_s": round(sentences_scored / fast_s, 2),
        "naive_sentences_per_s": round(sentences_scored / naive_s, 2),
        "ratio": round(ratio, 2), "cpu_ratio": round(naive_cpu_s / fast_cpu_s, 2),
        "max_abs_diff": float(f"{max_abs_diff:.3g}"),
        "agreement": agreement,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
