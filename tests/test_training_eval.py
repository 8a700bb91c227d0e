"""`eval-filter` on the tiny random model and the HotpotQA sample: every report row, the
exclusion of training questions, the metric definitions, and user errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.filters.filter_format import chunk_record
from sieverag.inference.types import Document, Example

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "hotpotqa_sample.jsonl"
FIRST, SECOND = "5a881d2355429938390d3eeb", "5adf72d35542992d7e9f9369"


@pytest.fixture(scope="module")
def tiny_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the tiny model with non-zero weights (no training needed here)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                      task_type="CAUSAL_LM"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out)
    return out


def training_dataset(folder: Path, train_ids: list[str]) -> Path:
    """A build-dataset-shaped folder whose train split holds the given HotpotQA questions."""
    from datasets import Dataset, DatasetDict

    def records(ids: list[str]) -> list[dict]:
        return [chunk_record(question="q?", chunk_text="t", relevant=True, source="hotpotqa",
                             question_id=i) for i in ids]

    DatasetDict({"train": Dataset.from_list(records(train_ids)),
                 "validation": Dataset.from_list(records(["held-out"]))}
                ).save_to_disk(folder / "dataset")
    return folder


def run_cli(argv: list[str]) -> int:
    from sieverag.training.cli import register

    parser = argparse.ArgumentParser(prog="sieverag")
    register(parser.add_subparsers())
    args = parser.parse_args(["eval-filter", *argv])
    return args.func(args)


def test_eval_filter_writes_every_row(tiny_model_dir: Path, tiny_adapter: Path,
                                      tmp_path: Path) -> None:
    data = training_dataset(tmp_path / "data", ["some-other-question"])
    out = tmp_path / "report"
    assert run_cli(["--dataset", str(SAMPLE), "--adapter", str(tiny_adapter),
                    "--base-model", str(tiny_model_dir), "--exclude-training-questions",
                    str(data), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["questions"]["evaluated"] == 2
    assert report["questions"]["with_supporting_facts"] == 1
    assert report["passages"] == {"total": 6, "gold": 4}
    assert list(report["chunk"]) == ["trained filter", "trained filter top-2",
                                     "trained filter, adaptive bar",
                                     "trained filter + BM25 prior top-2", "MAIN-RAG judge",
                                     "BM25 top-2", "dense top-2", "keep all"]
    for method, figures in report["chunk"].items():
        for key in ("precision", "recall", "f1", "micro_f1", "kept_per_question"):
            assert 0 <= figures[key] <= 10, (method, key)
        has_score = method != "keep all"
        assert (figures["auroc"] is not None) == has_score, method
    assert report["chunk"]["keep all"]["recall"] == 1.0
    assert report["chunk"]["BM25 top-2"]["kept_per_question"] == 2
    assert report["chunk"]["trained filter top-2"]["kept_per_question"] == 2
    # The adaptive bar (n = 0) keeps at least the best passage of every question.
    assert report["chunk"]["trained filter, adaptive bar"]["kept_per_question"] >= 1
    assert list(report["sentence"]) == [
        "trained filter (chunk → sentence)", "trained filter top-2 (chunk → sentence)",
        "trained filter, adaptive bar (chunk → sentence)",
        "trained filter + BM25 prior top-2 (chunk → sentence)", "MAIN-RAG judge (whole passages)",
        "BM25 top-2 (whole passages)", "dense top-2 (whole passages)",
        "keep all (whole passages)", "oracle: gold passages, all sentences",
        "oracle: gold passages, filter sentence stage"]
    assert report["sentence"]["oracle: gold passages, all sentences"]["recall"] == 1.0
    assert set(report["comparison"]) == {"trained filter", "trained filter top-2",
                                         "trained filter, adaptive bar",
                                         "trained filter + BM25 prior top-2"}
    top2 = report["comparison"]["trained filter top-2"]
    assert set(top2) == {"f1_minus_MAIN-RAG judge", "f1_minus_BM25 top-2",
                         "f1_minus_dense top-2", "f1_minus_keep all"}
    assert top2["f1_minus_BM25 top-2"] == pytest.approx(
        report["chunk"]["trained filter top-2"]["f1"] - report["chunk"]["BM25 top-2"]["f1"])
    markdown = (out / "report.md").read_text(encoding="utf-8")
    for row in [*report["chunk"], *report["sentence"]]:
        assert f"| {row} |" in markdown
    assert (out / "pr_curve.png").stat().st_size > 0
    decisions = [json.loads(line) for line in
                 (out / "decisions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [d["id"] for d in decisions] == [FIRST, SECOND]

    # A rerun reuses the cached model work and reproduces the figures.
    cached = {p.name: p.stat().st_mtime_ns for p in (out / "cache").iterdir()}
    assert set(cached) == {"filter-chunks.json", "judge.json", "filter-sentences.json"}
    run_cli(["--dataset", str(SAMPLE), "--adapter", str(tiny_adapter), "--base-model",
             str(tiny_model_dir), "--exclude-training-questions", str(data), "--out", str(out),
             "--quiet", "--device", "cpu"])
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cache").iterdir()} == cached
    again = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert again["chunk"] == report["chunk"]


def test_training_questions_are_left_out(tiny_adapter: Path, tmp_path: Path) -> None:
    from sieverag.training.filter_eval import FilterEvalConfig, select_examples, training_questions

    data = training_dataset(tmp_path / "data", [SECOND])
    config = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"),
                              adapter=str(tiny_adapter), exclude_training=(str(data),))
    trained = training_questions(config, {})
    selection = select_examples(config, trained)
    assert [e.id for e in selection.examples] == [FIRST]
    assert selection.excluded_training == 1

    # The adapter's metadata names its training dataset: used when no flag is given.
    metadata = {"dataset": {"path": str(data)}}
    bare = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"),
                            adapter=str(tiny_adapter))
    assert training_questions(bare, metadata) == trained
    # A card listing its training questions needs no dataset folder (a shipped filter's).
    carried = {"dataset": {"path": str(tmp_path / "gone"),
                           "train_questions": [list(q) for q in trained.pairs]}}
    assert training_questions(bare, carried).pairs == trained.pairs

    ids = tmp_path / "ids.txt"
    ids.write_text(f"{SECOND}\n", encoding="utf-8")
    listed = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"),
                              adapter=str(tiny_adapter), question_ids_file=str(ids))
    with pytest.raises(DatasetError, match="no question left"):
        select_examples(listed, trained)


def test_unknown_training_questions_is_an_error(tiny_adapter: Path, tmp_path: Path) -> None:
    from sieverag.training.filter_eval import FilterEvalConfig, training_questions

    config = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path), adapter=str(tiny_adapter))
    with pytest.raises(ConfigError, match="--exclude-training-questions"):
        training_questions(config, {})
    gone = {"dataset": {"path": str(tmp_path / "deleted")}}
    with pytest.raises(ConfigError, match="which is gone"):
        training_questions(config, gone)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"filter_endpoint": "http://127.0.0.1:1/v1"}, "go together"),
    ({"adapter": "/nowhere"}, "adapter folder /nowhere does not exist"),
    ({"adapter": "nope"}, "'nope' is neither a folder nor the name of an installed or shipped"),
    ({"adapter": "LORA", "threshold": 1.5}, "--threshold"),
    ({"adapter": "LORA", "top_k": 0}, "--top-k"),
])
def test_config_errors_name_the_flag(kwargs: dict, message: str, tiny_adapter: Path) -> None:
    from sieverag.training.filter_eval import FilterEvalConfig

    if kwargs.get("adapter") == "LORA":
        kwargs = {**kwargs, "adapter": str(tiny_adapter)}
    with pytest.raises(ConfigError, match=message):
        FilterEvalConfig(dataset=str(SAMPLE), out="out", **kwargs)


def test_without_an_adapter_the_default_filter_is_evaluated(tmp_path, monkeypatch,
                                                            tiny_adapter: Path) -> None:
    from sieverag.inference.filters import adapters
    from sieverag.training.filter_eval import FilterEvalConfig

    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(adapters, "SHIPPED_DIR", tmp_path / "shipped")
    with pytest.raises(ConfigError, match="'smollm2-filter' is neither a folder"):
        FilterEvalConfig(dataset=str(SAMPLE), out="out")
    installed = adapters.install_adapter(tiny_adapter, "smollm2-filter")
    assert FilterEvalConfig(dataset=str(SAMPLE), out="out").adapter == str(installed)


def _example(gold: list[bool], supporting: list[tuple[int, ...]] | None = None) -> Example:
    documents = tuple(
        Document(id=f"q/{i}", text=f"passage {i}", is_gold=g,
                 sentences=("a.", "b.", "c.") if supporting else None,
                 supporting_sentences=supporting[i] if supporting else None)
        for i, g in enumerate(gold))
    return Example(id="q", question="?", answers=("x",), documents=documents)


def test_chunk_quality_definitions() -> None:
    from sieverag.training.filter_eval import chunk_quality
    from sieverag.training.filter_methods import ChunkDecisions

    example = _example([True, True, False, False])
    scores = {"q/0": 0.9, "q/1": 0.2, "q/2": 0.8, "q/3": 0.1}
    figures = chunk_quality([example], ChunkDecisions("m", {"q": ("q/0", "q/2")}, scores))
    assert figures["precision"] == 0.5 and figures["recall"] == 0.5 and figures["f1"] == 0.5
    assert figures["kept_per_question"] == 2
    assert figures["auroc"] == pytest.approx(0.75)  # 3 of the 4 gold/non-gold pairs ordered


def test_sentence_quality_definitions() -> None:
    from sieverag.training.filter_eval import sentence_quality, supporting_facts

    example = _example([True, False], supporting=[(0, 2), ()])
    assert supporting_facts(example) == {("q/0", 0), ("q/0", 2)}
    figures = sentence_quality([example], {"q": [("q/0", 0), ("q/1", 1)]})
    assert (figures["precision"], figures["recall"]) == (0.5, 0.5)


def test_decision_rules() -> None:
    from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
    from sieverag.training.filter_methods import (
        _parse_sentences,
        threshold_decisions,
        top_k_decisions,
    )

    def relevance_probability(yes: float, no: float) -> float:
        return p_relevant(relevance_log_odds({"Yes": yes, "No": no}))

    assert relevance_probability(-1.0, -1.0) == pytest.approx(0.5)
    assert relevance_probability(-0.1, -5.0) > 0.99
    assert relevance_probability(0.0, -1e6) == pytest.approx(1.0)
    assert relevance_probability(-1e6, 0.0) < 1e-300
    example = _example([True, False, False])
    scores = {"q/0": 0.3, "q/1": 0.9, "q/2": 0.9}
    assert threshold_decisions("f", [example], scores, 0.5).kept["q"] == ("q/1", "q/2")
    assert top_k_decisions("t", [example], scores, 2).kept["q"] == ("q/1", "q/2")
    assert _parse_sentences("1, 3", 3).kept == (0, 2)
    unparsed = _parse_sentences("sentence one", 3)
    assert unparsed.kept == (0, 1, 2) and not unparsed.parsed


def test_eval_filter_through_a_served_filter(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same report from a filter behind an OpenAI-compatible server (a scripted one that
    answers Yes exactly for the gold passages, so the filter's chunk scores are perfect)."""
    from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

    gold_titles = {passage["title"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()
                   for passage in json.loads(line)["passages"] if passage["is_gold"]}

    def served_filter(request: RecordedRequest) -> Reply:
        body = request.json or {}
        prompt = body["messages"][-1]["content"]
        if not body.get("logprobs"):
            return Reply(body=chat_reply("1"))  # the sentence stage: first sentence
        gold = any(f"Text:\n{title}\n" in prompt for title in gold_titles)
        yes, no = (-0.1, -3.0) if gold else (-3.0, -0.1)
        return Reply(body=chat_reply("Yes" if gold else "No",
                                     top_logprobs=[("Yes", yes), ("No", no)]))

    data = training_dataset(tmp_path / "data", ["unrelated-question"])
    with FakeOpenAIServer(served_filter) as server:
        assert run_cli(["--dataset", str(SAMPLE), "--filter-endpoint", server.base_url,
                        "--filter-model", "filter-test-00000000", "--base-model",
                        str(tiny_model_dir), "--exclude-training-questions", str(data),
                        "--out", str(tmp_path / "out"), "--quiet", "--device", "cpu"]) == 0
        asked = [r.json["model"] for r in server.requests]
    assert set(asked) == {"filter-test-00000000"} and len(asked) == 6 + 2
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    figures = report["chunk"]["trained filter"]
    assert (figures["precision"], figures["recall"], figures["f1"], figures["auroc"]) == \
        (1.0, 1.0, 1.0, 1.0)
    assert report["sentence_answers"] == {"answers": 2, "unparsed": 0}
    assert report["filter"]["served_as"] == "filter-test-00000000"
