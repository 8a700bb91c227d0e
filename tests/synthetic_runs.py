"""A synthetic `sieverag eval` run folder, with no model: a dataset of invented questions with
gold-marked passages, config.yaml, results/<pipeline>.jsonl (each line validated as an
`EvalRecord`, so its shape is the runner's) and summary.json (`summarize`). What the HTML report
tests and tests/benchmarks/bench_html_report.py read.

Five pipelines, each recording what its kind records: `direct` (no passages), `vanilla` (reads
all), `main-rag` (a judge's scores), `amber-mcf` (a trace of rounds: scored passages with key
sentences, the adaptive branch, memory agents, memory, sufficiency, next query) and `auto` (a
router's decision). Who answers right, and which gold passage a filter drops, follow fixed
rules of the question's number (`wrong`, `drops_gold`), so tests know what the filters show.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.eval.summary import summarize

PIPELINES = ("direct", "vanilla", "main-rag", "amber-mcf", "auto")
HOSTILE = 'He wrote "</script><script>alert(1)</script>" & <b>bold</b> in <!-- a note -->.'
TOWNS = ("Quorrin", "Ashgrove", "Selvane", "Elsewassen", "Marrowby", "Tolland")


def passage_text(rng: random.Random, name: str, town: str, sentences: int) -> str:
    """A passage of `sentences` sentences about `name`, its first naming the birthplace."""
    text = [f"{name} was born in {town} in {rng.randint(1700, 1950)}."]
    fillers = (f"{name} later worked as a cartographer of the northern coast.",
               f"The archive of {town} keeps letters that {name} wrote to a brother.",
               f"Most of {name}'s maps were printed by a small press near the harbour.",
               "Historians still argue about which of the surveys came first.",
               f"A street in {town} was renamed after the family in the last century.")
    text += [fillers[i % len(fillers)] for i in range(sentences - 1)]
    return " ".join(text)


def wrong(pipeline: str, number: int) -> bool:
    """Whether `pipeline` answers question `number` wrong: direct every second, vanilla every
    third, main-rag every fifth, amber-mcf every seventh, auto every fourth."""
    return number % {"direct": 2, "vanilla": 3, "main-rag": 5, "amber-mcf": 7, "auto": 4}[
        pipeline] == 0


def drops_gold(number: int) -> bool:
    """Whether main-rag's judge drops question `number`'s gold passage (every sixth)."""
    return number % 6 == 0


def _example(rng: random.Random, number: int, passages: int, sentences: int) -> dict[str, Any]:
    gold_town = TOWNS[number % len(TOWNS)]
    name = f"Person{number}"
    names = [name if i == 0 else f"Other{number}x{i}" for i in range(passages)]
    ctxs = [{"title": names[i],
             "text": passage_text(rng, names[i],
                                  gold_town if i == 0 else TOWNS[(number + i) % len(TOWNS)],
                                  sentences),
             "isgold": i == 0} for i in range(passages)]
    if number == 1:  # text that must stay text
        ctxs[1]["text"] = HOSTILE + " " + ctxs[1]["text"]
    rng.shuffle(ctxs)
    question = f"In which town was {name} born?" + (f" {HOSTILE}" if number == 1 else "")
    return {"id": f"q{number}", "question": question, "answers": [gold_town], "ctxs": ctxs}


def _passage(doc_id: str, score: float, kept: bool, gold: bool, **extra: Any) -> dict:
    return {"id": doc_id, "score": round(score, 4), "kept": kept, "is_gold": gold, **extra}


def _record(pipeline: str, number: int, example: dict[str, Any]) -> dict[str, Any]:
    docs = [(f"{example['id']}/{i}", c) for i, c in enumerate(example["ctxs"])]
    gold_ids = [d for d, c in docs if c["isgold"]]
    answer = example["answers"][0]
    prediction = "Nowhere" if wrong(pipeline, number) else f"{answer}, in the north"
    ok = float(not wrong(pipeline, number))
    usage = {"generator": {"calls": 1, "prompt_tokens": 120 + 40 * len(docs),
                           "completion_tokens": 8, "seconds": 0.5}}
    record: dict[str, Any] = {
        "id": example["id"], "question": example["question"], "answers": example["answers"],
        "prediction": prediction, "raw_prediction": prediction + ".",
        "metrics": {"em": 0.0, "f1": 0.5 * ok, "accuracy": ok},
        "documents_read": [], "contexts": [], "documents_given": len(docs),
        "read_scores": None, "usage": usage, "llm_calls": 1,
        "input_tokens": usage["generator"]["prompt_tokens"],
        "generator_input_tokens": usage["generator"]["prompt_tokens"], "seconds": 0.6}
    if pipeline == "vanilla":
        record["documents_read"] = [d for d, _ in docs]
    elif pipeline == "main-rag":
        scores = [_passage(d, 2.0 if c["isgold"] else 0.1 * i, not c["isgold"] or not
                           drops_gold(number), c["isgold"], predicted_answer=answer)
                  for i, (d, c) in enumerate(docs)]
        record["filter"] = {"threshold": 0.5, "rule": None, "rule_reason": None,
                            "scores": scores}
        record["documents_read"] = [s["id"] for s in scores if s["kept"]]
        record["usage"]["judge"] = {"calls": len(docs), "prompt_tokens": 900,
                                    "completion_tokens": 0, "seconds": 0.8}
    elif pipeline == "amber-mcf":
        record["trace"] = _amber_trace(example, docs, gold_ids)
        record["documents_read"] = [e["id"] for e in record["trace"]["evidence"]]
        record["filter"] = {"threshold": -1.0, "rule": "calibrated",
                            "rule_reason": "P(relevant) >= 0.375, the card's bar",
                            "scores": [s for r in record["trace"]["rounds"]
                                       for s in r["scored"]]}
    elif pipeline == "auto":
        retrieve = number % 2 == 1
        record["trace"] = {"route": {"retrieve": retrieve, "reason": (
            "the question names an entity the model does not know" if retrieve else
            "the model is confident without retrieval"), "features": {"confidence": 0.4}}}
        record["documents_read"] = [d for d, _ in docs[:2]] if retrieve else []
    record["contexts"] = [dict(docs)[d]["text"] for d in record["documents_read"]]
    return record


def _amber_trace(example: dict[str, Any], docs: list, gold_ids: list[str]) -> dict[str, Any]:
    """Two rounds over the passages: round 1 scores the first half, round 2 the rest; each kept
    passage names its first and last sentences as key."""
    half = max(1, len(docs) // 2)
    rounds = []
    for number, part in enumerate((docs[:half], docs[half:]), start=1):
        scored = []
        for i, (doc_id, ctx) in enumerate(part):
            kept = ctx["isgold"] or i == 0
            sentences = ctx["text"].count(". ") + 1
            scored.append(_passage(
                doc_id, 1.5 if ctx["isgold"] else -0.5 - i, kept, ctx["isgold"],
                title=ctx["title"], p_relevant=0.9 if ctx["isgold"] else 0.1,
                sentence_status="parsed" if kept else None,
                key_sentences=sorted({0, sentences - 1}) if kept else None))
        scored = [{k: v for k, v in s.items() if v is not None} for s in scored]
        rounds.append({
            "round": number, "query": example["question"] if number == 1 else
            f"{example['answers'][0]} birthplace records", "retrieved": [d for d, _ in part],
            "skipped_seen": 0, "threshold": -1.0, "rule": "calibrated",
            "rule_reason": "P(relevant) >= 0.375", "scored": scored,
            "kept": [s["id"] for s in scored if s["kept"]],
            "memory_update": {"reviewer": "The evidence names the town.", "challenger":
                              "Nothing is missing.", "refiner": "Born in the town named.",
                              "truncated": False},
            "memory": f"Notes after round {number}.",
            "sufficiency": {"p_yes": 0.3 * number, "sufficient": number == 2},
            "next_query": {"query": "birthplace records", "source": "writer",
                           "written": "birthplace records", "candidates": []}
            if number == 1 else None,
            "branch": {"branch": "loop", "strength": 0.4, "bar": 0.8,
                       "reason": "the kept evidence is weaker than the bar"}})
    evidence = [{"round": r["round"], "id": s["id"], "title": s["title"], "score": s["score"],
                 "text": "key sentences", "key_sentences": s.get("key_sentences")}
                for r in rounds for s in r["scored"] if s["kept"]]
    return {"pipeline": "amber-mcf", "filter": "mcf", "queries": [r["query"] for r in rounds],
            "rounds": rounds, "evidence": evidence, "memory": "Notes after round 2.",
            "stop_reason": "sufficient", "answer_from": "evidence"}


def write_synthetic_run(folder: Path, questions: int = 12, passages: int = 5,
                        sentences: int = 3, pipelines: tuple[str, ...] = PIPELINES,
                        seed: int = 0) -> Path:
    """Write a run folder of `questions` questions × `pipelines` into `folder/run` (its
    dataset beside it, `folder/data.jsonl`) and return the run folder."""
    rng = random.Random(seed)
    examples = [_example(rng, n, passages, sentences) for n in range(1, questions + 1)]
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / "data.jsonl"
    dataset.write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
    run = folder / "run"
    (run / "results").mkdir(parents=True, exist_ok=True)
    config = {"dataset": str(dataset), "pipelines": list(pipelines), "dataset_format": "auto",
              "models": {"generator": {"model": "synthetic-generator"},
                         "filter": {"model": "synthetic-base", "adapter": "synthetic-filter"}},
              "provenance": {"ranking": "MCF ranks by the filter's card: z(BM25) + z(dense)",
                             "filter_adapter": {"name": "synthetic-filter",
                                                "base_model": "synthetic-base"},
                             "versions": {"sieverag": "test"}}}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    summaries = {}
    for pipeline in pipelines:
        records = [EvalRecord.model_validate(_record(pipeline, n, e))
                   for n, e in enumerate(examples, start=1)]
        (run / "results" / f"{pipeline}.jsonl").write_text(
            "".join(json.dumps(r.to_json()) + "\n" for r in records), encoding="utf-8")
        summaries[pipeline] = summarize(records)
    (run / "summary.json").write_text(json.dumps({"dataset": str(dataset),
                                                  "pipelines": summaries}), encoding="utf-8")
    return run
