"""`eval-filter` on the tiny random model and the HotpotQA sample: every report row, the
exclusion of training questions, the metric definitions, and user errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from repo_paths import REPO

from sieverag.inference.composition.config import ModelRoles
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.filters.filter_format import chunk_record
from sieverag.inference.llm.backend_registry import BackendSpec

ROOT = REPO
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


def training_dataset(folder: Path, train_ids: list[str], source: str = "hotpotqa") -> Path:
    """A build-dataset-shaped folder whose train split holds the given questions of `source`."""
    from datasets import Dataset, DatasetDict

    def records(ids: list[str]) -> list[dict]:
        return [chunk_record(question="q?", chunk_text="t", relevant=True, source=source,
                             question_id=i) for i in ids]

    DatasetDict({"train": Dataset.from_list(records(train_ids)),
                 "validation": Dataset.from_list(records(["held-out"]))}
                ).save_to_disk(folder / "dataset")
    return folder


def roles(base: Path, adapter: Path | str | None = None, *, endpoint: str | None = None,
          served: str | None = None) -> ModelRoles:
    """The judge on `base` on the CPU; the filter `adapter` on it, or served as `served` (a
    scripted server that shows no card: ranked by retrieval alone, asked for by name)."""
    judge = BackendSpec(model=str(base), device="cpu")
    if endpoint is not None:
        return ModelRoles(generator=judge, filter=BackendSpec(
            model=served or "", endpoint=endpoint, chat_template_model=str(base)),
            filter_card="retrieval-only")
    return ModelRoles(generator=judge, filter=BackendSpec(
        model=str(base), device="cpu", adapter=None if adapter is None else str(adapter)))


def evaluate(**settings) -> dict:
    """`run_filter_eval` with the given FilterEvalConfig fields, no progress bars."""
    from sieverag.training.evaluation.filter_eval import run_filter_eval
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig

    return run_filter_eval(FilterEvalConfig(**{"dataset": str(SAMPLE), **settings}),
                           progress=False)


def read_decisions(out: Path) -> list[dict]:
    return [json.loads(line) for line in
            (out / "decisions.jsonl").read_text(encoding="utf-8").splitlines()]


DEFAULT_ROW = "MCF default: calibrated P>=card bar, min card + combination"
MCF_ROWS = [DEFAULT_ROW, "MCF fixed log-odds>=0", "MCF top_k=2", "MCF top_k=2 + combination",
            "MCF top_k=2 + BM25 prior w=1", "MCF adaptive n=0",
            "MCF adaptive n=0 + BM25 prior w=1"]
STAGE = "sentence stage (16 tokens, empty→keep chunk)"


def test_eval_filter_writes_every_row(tiny_model_dir: Path, tiny_adapter: Path,
                                      tmp_path: Path) -> None:
    data = training_dataset(tmp_path / "data", ["some-other-question"])
    out = tmp_path / "report"
    settings = {"models": roles(tiny_model_dir, tiny_adapter),
                "exclude_training": (str(data),), "out": str(out)}
    report = evaluate(**settings)
    assert report["questions"]["evaluated"] == 2
    assert report["questions"]["with_supporting_facts"] == 1
    assert report["passages"] == {"total": 6, "gold": 4}
    assert list(report["chunk"]) == [*MCF_ROWS, "MAIN-RAG judge", "BM25 top-2", "dense top-2",
                                     "keep all"]
    assert list(report["filter"]["mcf_rows"]) == MCF_ROWS
    assert report["filter"]["amber_default_row"] == DEFAULT_ROW
    for method, figures in report["chunk"].items():
        for key in ("precision", "recall", "f1", "micro_f1", "kept_per_question"):
            assert 0 <= figures[key] <= 10, (method, key)
        has_score = method != "keep all"
        assert (figures["auroc"] is not None) == has_score, method
    assert report["chunk"]["keep all"]["recall"] == 1.0
    assert report["chunk"]["BM25 top-2"]["kept_per_question"] == 2
    assert report["chunk"]["MCF top_k=2"]["kept_per_question"] == 2
    # The adaptive bar (n = 0) keeps at least the best passage of every question.
    assert report["chunk"]["MCF adaptive n=0"]["kept_per_question"] >= 1
    whole = [f"{m} (whole passages)" for m in report["chunk"]]
    staged = [f"{m} → {STAGE}" for m in MCF_ROWS]
    assert list(report["sentence"]) == [
        *(row for pair in zip(whole, staged, strict=False) for row in pair),
        *whole[len(MCF_ROWS):], "oracle: gold passages, all sentences",
        "oracle: gold passages → MCF sentence stage (16 tokens, empty→keep chunk)"]
    assert report["sentence"]["oracle: gold passages, all sentences"]["recall"] == 1.0
    assert set(report["comparison"]) == set(MCF_ROWS)
    top2 = report["comparison"]["MCF top_k=2"]
    assert set(top2) == {"f1_minus_MAIN-RAG judge", "f1_minus_BM25 top-2",
                         "f1_minus_dense top-2", "f1_minus_keep all"}
    assert top2["f1_minus_BM25 top-2"] == pytest.approx(
        report["chunk"]["MCF top_k=2"]["f1"] - report["chunk"]["BM25 top-2"]["f1"])
    markdown = (out / "report.md").read_text(encoding="utf-8")
    for row in [*report["chunk"], *report["sentence"]]:
        assert f"| {row} |" in markdown
    assert (out / "pr_curve.png").stat().st_size > 0
    decisions = read_decisions(out)
    assert [d["id"] for d in decisions] == [FIRST, SECOND]

    # The kept passages are what amber's filter keeps: MultiGranularFilter on the same
    # adapter, passages and config, run here on its own.
    from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(tiny_adapter),
                                        device="cpu"))
    examples = {e.id: e for e in load_sample()}
    for row, fields in report["filter"]["mcf_rows"].items():
        mcf = MultiGranularFilter(backend, MCFConfig(**fields))
        for decision in decisions:
            example = examples[decision["id"]]
            result = mcf.select(example.question, example.documents)
            assert decision["kept"][row] == [s.document.id for s in result.kept], row
            assert decision["scores"][row] == pytest.approx(
                [s.score for s in result.scored], abs=1e-5)

    # A rerun reuses the cached model work and reproduces the figures.
    cached = {p.name: p.stat().st_mtime_ns for p in (out / "cache").iterdir()}
    assert set(cached) == {"filter-chunks.json", "judge.json", "filter-sentences.json"}
    again = evaluate(**settings)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cache").iterdir()} == cached
    assert again["chunk"] == report["chunk"]
    assert again["sentence"] == report["sentence"]


def test_eval_filter_on_several_datasets_gives_a_per_dataset_table(
        tiny_model_dir: Path, tiny_adapter: Path, tmp_path: Path) -> None:
    """A common-format set with its `source` beside HotpotQA: training questions are left out
    by (source, id), questions without a gold passage are counted out, no judge row."""
    mined = tmp_path / "nq-set.jsonl"
    rows = [{"id": f"n{k}", "source": "nq", "question": f"who wrote book {k}?",
             "answers": [f"author {k}"],
             "ctxs": [{"title": f"Book {k}", "text": f"Book {k} was written by author {k}.",
                       "is_gold": True},
                      {"title": "Other", "text": f"Book {k + 1} is long.", "is_gold": False},
                      {"title": "Else", "text": "Books are read.", "is_gold": k == 3}]}
            for k in range(4)]
    rows.append({"id": "n9", "source": "nq", "question": "who?", "answers": ["x"],
                 "ctxs": [{"title": "T", "text": "Nothing here.", "is_gold": False}]})
    mined.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    # "n0" trained the filter as an NQ question; the same id in another source would not count
    data = training_dataset(tmp_path / "data", ["n0"], source="nq")
    out = tmp_path / "report"
    report = evaluate(models=roles(tiny_model_dir, tiny_adapter), out=str(out), judge=False,
                      exclude_training=(str(data),), dataset=(str(SAMPLE), str(mined)))
    assert list(report["datasets"]) == ["hotpotqa_sample.jsonl", "nq-set.jsonl"]
    assert report["questions"] == report["datasets"]["hotpotqa_sample.jsonl"]["questions"]
    nq = report["datasets"]["nq-set.jsonl"]
    assert nq["sources"] == ["nq"]
    assert nq["questions"]["evaluated"] == 3  # n1..n3: n0 trained, n9 has no gold passage
    assert (nq["questions"]["excluded_as_training"], nq["questions"]["without_gold"]) == (1, 1)
    assert nq["passages"] == {"total": 9, "gold": 4}
    assert "MAIN-RAG judge" not in nq["chunk"] and "f1_minus_MAIN-RAG judge" not in \
        nq["comparison"]["MCF top_k=2"]
    line = report["by_dataset"]["nq-set.jsonl"]
    assert line["filter_auroc"] == nq["chunk"]["MCF top_k=2"]["auroc"]
    assert line["bm25_auroc"] == nq["chunk"]["BM25 top-2"]["auroc"]
    assert line["fixed_bar_kept_per_question"] == \
        nq["chunk"]["MCF fixed log-odds>=0"]["kept_per_question"]
    assert line["sentence_stage_f1"] is None  # no supporting facts in this set
    against = nq["default_against_retrieval"]
    assert against["against"] in ("BM25 top-2", "dense top-2") and against["questions"] == 3
    assert line["default_minus_retrieval_f1"] == pytest.approx(
        nq["chunk"][DEFAULT_ROW]["f1"] - nq["chunk"][against["against"]]["f1"])
    low, high = line["default_minus_retrieval_interval"]
    assert low <= line["default_minus_retrieval_f1"] <= high
    assert report["by_dataset"]["hotpotqa_sample.jsonl"]["sentence_stage_f1"] is not None
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "## By dataset" in markdown and "| nq-set.jsonl | 3 | 9 |" in markdown
    # Every dataset's questions are in decisions.jsonl, each naming its dataset.
    lines = read_decisions(out)
    assert [(d["dataset"], d["id"]) for d in lines if d["dataset"] == "nq-set.jsonl"] == \
        [("nq-set.jsonl", f"n{k}") for k in (1, 2, 3)]
    assert sum(d["dataset"] == "hotpotqa_sample.jsonl" for d in lines) == \
        report["datasets"]["hotpotqa_sample.jsonl"]["questions"]["evaluated"]
    assert all(d["kept"]["BM25 top-2"] for d in lines)


def load_sample() -> list[Example]:
    from sieverag.inference.data import load_examples

    return load_examples(str(SAMPLE))


def test_training_questions_are_left_out(tiny_adapter: Path, tmp_path: Path) -> None:
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
    from sieverag.training.evaluation.held_out_questions import select_examples, training_questions

    data = training_dataset(tmp_path / "data", [SECOND])
    config = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"),
                              exclude_training=(str(data),))
    trained = training_questions(config, {})
    selection = select_examples(config, trained)
    assert [e.id for e in selection.examples] == [FIRST]
    assert selection.excluded_training == 1

    # The adapter's metadata names its training dataset: used when no flag is given.
    metadata = {"dataset": {"path": str(data)}}
    bare = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"))
    assert training_questions(bare, metadata) == trained
    # A card listing its training questions needs no dataset folder (a shipped filter's).
    carried = {"dataset": {"path": str(tmp_path / "gone"),
                           "train_questions": [list(q) for q in trained.pairs]}}
    assert training_questions(bare, carried).pairs == trained.pairs

    ids = tmp_path / "ids.txt"
    ids.write_text(f"{SECOND}\n", encoding="utf-8")
    listed = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path / "out"),
                              question_ids_file=str(ids))
    with pytest.raises(DatasetError, match="no question left"):
        select_examples(listed, trained)


def test_unknown_training_questions_is_an_error(tiny_adapter: Path, tmp_path: Path) -> None:
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
    from sieverag.training.evaluation.held_out_questions import training_questions

    config = FilterEvalConfig(dataset=str(SAMPLE), out=str(tmp_path))
    with pytest.raises(ConfigError, match="--exclude-training DATASET_DIR"):
        training_questions(config, {})
    gone = {"dataset": {"path": str(tmp_path / "deleted")}}
    with pytest.raises(ConfigError, match="which is gone"):
        training_questions(config, gone)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"threshold": float("inf")}, "--threshold must be a finite log-odds"),
    ({"top_k": 0}, "--top-k"),
    ({"sentence_max_new_tokens": 0}, "--sentence-max-new-tokens"),
    ({"models": {"filter": {"endpoint": "http://127.0.0.1:1/v1", "model": "f",
                            "adapter": "x"}}},
     "adapter 'x' is for an in-process model"),
])
def test_config_errors_name_the_flag(kwargs: dict, message: str) -> None:
    from sieverag.inference.core.settings import validate_settings
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig

    with pytest.raises(ConfigError, match=message):
        validate_settings(FilterEvalConfig, {"dataset": str(SAMPLE), "out": "out", **kwargs},
                          "test")


@pytest.mark.parametrize(("adapter", "message"), [
    ("/nowhere", "adapter folder /nowhere does not exist"),
    ("nope", "'nope' is neither a folder nor the name of an installed or shipped"),
])
def test_a_bad_adapter_fails_before_any_work(adapter: str, message: str, tmp_path: Path,
                                             tiny_model_dir: Path) -> None:
    from sieverag.inference.filters.adapter_files import AdapterError

    with pytest.raises(AdapterError, match=message):
        evaluate(models=roles(tiny_model_dir, adapter), out=str(tmp_path / "out"),
                 allow_training_questions=True)
    assert not (tmp_path / "out").exists()


def test_without_an_adapter_the_default_filter_is_evaluated(tmp_path, monkeypatch,
                                                            tiny_adapter: Path,
                                                            tiny_model_dir: Path) -> None:
    from sieverag.inference.agents.roles import resolve_filter_role
    from sieverag.inference.filters import adapter_store
    from sieverag.inference.filters.adapter_files import AdapterError
    from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig

    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(adapter_store, "SHIPPED_DIR", tmp_path / "shipped")
    config = FilterEvalConfig(dataset=str(SAMPLE), out="out", models=roles(tiny_model_dir))
    with pytest.raises(AdapterError, match="'smollm2-filter' is neither a folder"):
        resolve_filter_role(config.models.filter)
    installed = adapter_store.install_adapter(tiny_adapter, "smollm2-filter")
    assert resolve_filter_role(config.models.filter).adapter == str(installed)


def _example(gold: list[bool], supporting: list[tuple[int, ...]] | None = None) -> Example:
    documents = tuple(
        Document(id=f"q/{i}", text=f"passage {i}", is_gold=g,
                 sentences=("a.", "b.", "c.") if supporting else None,
                 supporting_sentences=supporting[i] if supporting else None)
        for i, g in enumerate(gold))
    return Example(id="q", question="?", answers=("x",), documents=documents)


@pytest.mark.parametrize("content", [
    b'{"fingerprint": "\xff\xfe", "value": 1}', ("[" * 100_000 + "]" * 100_000).encode(),
    b'{"fingerprint": "f", "value": ' + b"7" * 5000 + b"}", b"[1, 2]", b'{"fingerprint": "',
], ids=["not UTF-8", "nested 100,000 deep", "5,000-digit integer", "not an object",
        "half-written"])
def test_a_corrupt_cache_entry_is_a_miss_recomputed_and_overwritten(
        tmp_path: Path, content: bytes) -> None:
    from sieverag.training.evaluation.method_cache import MethodCache

    cache = MethodCache(tmp_path)
    (tmp_path / "judge.json").write_bytes(content)
    fingerprint = {"judge": "tiny"}
    assert cache.load("judge", fingerprint) is None
    assert cache.get_or_compute("judge", fingerprint, lambda: {"q": [0.5]}) == {"q": [0.5]}
    assert cache.load("judge", fingerprint) == {"q": [0.5]}  # the file now holds the entry
    assert cache.get_or_compute("judge", fingerprint, lambda: pytest.fail("recomputed")) \
        == {"q": [0.5]}


def test_chunk_quality_definitions() -> None:
    from sieverag.inference.metrics.filter_scores import chunk_quality

    example = _example([True, True, False, False])
    scores = {"q/0": 0.9, "q/1": 0.2, "q/2": 0.8, "q/3": 0.1}
    figures = chunk_quality([example], {"q": ("q/0", "q/2")}, scores)
    assert figures["precision"] == 0.5 and figures["recall"] == 0.5 and figures["f1"] == 0.5
    assert figures["kept_per_question"] == 2
    assert figures["auroc"] == pytest.approx(0.75)  # 3 of the 4 gold/non-gold pairs ordered
    assert figures["ece"] is None and figures["calibrated_share"] is None
    # ECE over the passages given a probability (MCF gives none on a round it does not call
    # calibrated), and the share that have one.
    given = chunk_quality([example], {"q": ("q/0",)}, scores,
                          {"q/0": 1.0, "q/1": 1.0, "q/2": 0.0})
    assert given["ece"] == pytest.approx(0.0) and given["calibrated_share"] == 0.75


def test_sentence_quality_definitions() -> None:
    from sieverag.inference.metrics.filter_scores import sentence_quality, supporting_facts

    example = _example([True, False], supporting=[(0, 2), ()])
    assert supporting_facts(example) == {("q/0", 0), ("q/0", 2)}
    figures = sentence_quality([example], {"q": [("q/0", 0), ("q/1", 1)]})
    assert (figures["precision"], figures["recall"]) == (0.5, 0.5)


def test_p_relevant_is_overflow_safe_and_baseline_top_k() -> None:
    from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
    from sieverag.training.evaluation.filter_methods import top_k_decisions

    def relevance_probability(yes: float, no: float) -> float:
        return p_relevant(relevance_log_odds({"Yes": yes, "No": no}))

    assert relevance_probability(-1.0, -1.0) == pytest.approx(0.5)
    assert relevance_probability(-0.1, -5.0) > 0.99
    assert relevance_probability(0.0, -1e6) == pytest.approx(1.0)
    assert relevance_probability(-1e6, 0.0) < 1e-300
    example = _example([True, False, False])
    scores = {"q/0": 0.3, "q/1": 0.9, "q/2": 0.9}
    assert top_k_decisions("t", [example], scores, 2).kept["q"] == ("q/1", "q/2")


def test_row_names_say_which_mcf_config() -> None:
    from sieverag.inference.filters.mcf import MCFConfig
    from sieverag.training.evaluation.filter_methods import (
        mcf_row_name,
        sentence_row_name,
        sentence_stage_name,
    )

    assert mcf_row_name(MCFConfig()) == DEFAULT_ROW  # amber's default
    assert mcf_row_name(MCFConfig(bar="top_k", lexical_weight=1.0)) == \
        "MCF top_k=2 + BM25 prior w=1"
    assert mcf_row_name(MCFConfig(bar="top_k", top_k=3, lexical_weight=0.0)) == "MCF top_k=3"
    assert mcf_row_name(MCFConfig(bar="fixed", threshold=-0.5)) == "MCF fixed log-odds>=-0.5"
    assert mcf_row_name(MCFConfig(bar="adaptive", bar_n=0.5, lexical_weight=2.0)) == \
        "MCF adaptive n=0.5 + BM25 prior w=2"
    assert sentence_stage_name(MCFConfig()) == "MCF sentence stage (16 tokens, empty→keep chunk)"
    assert sentence_row_name(MCFConfig(bar="fixed", empty_sentence_answer="drop_chunk",
                                       sentence_max_new_tokens=8)) == \
        "MCF fixed log-odds>=0 → sentence stage (8 tokens, empty→drop chunk)"


MCF_CONFIGS = [
    {"bar": "fixed", "threshold": -1.0, "lexical_weight": 0.0},
    {"bar": "top_k", "top_k": 2, "lexical_weight": 0.0},
    {"bar": "top_k", "top_k": 2, "lexical_weight": 1.0},
    {"bar": "adaptive", "bar_n": 0.0, "lexical_weight": 0.0},
    {"bar": "adaptive", "bar_n": 0.0, "lexical_weight": 1.0, "empty_sentence_answer": "drop_chunk"},
]


def _scripted_filter():
    """A filter whose verdicts and sentence replies depend on the passage only."""
    from fake_backend import ScriptedBackend

    verdicts = {"Sarah Buxton": -0.5, "Love and Theft (duo)": 2.0, "If You Ever Get Lonely": 1.0,
                "National Treasure (film)": -3.0, "William Kronick": 0.5, "Jon Turteltaub": 0.2}
    replies = {"Sarah Buxton": "sentence one", "Love and Theft (duo)": "none",
               "If You Ever Get Lonely": "2, 3"}

    def passage(text: str, by_title: dict):  # the passage's title is a line of its own
        return next(v for title, v in by_title.items() if f"\n{title}\n" in text)

    def labels(text: str) -> dict[str, float]:
        return {"Yes": passage(text, verdicts), "No": 0.0}

    def reply(text: str) -> str:
        return passage(text, replies)

    return ScriptedBackend(reply=reply, labels=labels)


def test_mcf_rows_score_each_passage_once_and_keep_what_mcf_keeps() -> None:
    """The rows run amber's MultiGranularFilter itself: on one caching backend they equal
    MCF run alone on a fresh backend, config by config, both stages, while the model is
    asked once per passage (chunk stage) and once per passage (sentence stage)."""
    from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
    from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
    from sieverag.training.evaluation import filter_methods as methods
    from sieverag.training.evaluation.caching_backend import CachingBackend

    examples = load_sample()
    configs = [MCFConfig(**c) for c in MCF_CONFIGS]
    raw = _scripted_filter()
    cached = CachingBackend(raw)
    rows = [methods.mcf_results(cached, examples, c, progress=False) for c in configs]
    first = examples[0]  # the question with supporting facts (the sentence-level rows')
    staged, oracle = methods.mcf_sentence_results(cached, [first], configs, progress=False)
    for config, chunk_rows, sentence_rows in zip(configs, rows, staged, strict=True):
        alone = MultiGranularFilter(_scripted_filter(), config)
        for example in examples:
            assert chunk_rows[example.id] == alone.select(example.question, example.documents)
        with_sentences = MultiGranularFilter(_scripted_filter(),
                                             replace(config, sentence_stage=True))
        assert sentence_rows[first.id] == with_sentences.select(first.question, first.documents)
    chunk_asked = [text for agent, text in raw.calls if agent == "filter_chunk"]
    sentence_asked = [text for agent, text in raw.calls if agent == "filter_sentence"]
    assert len(chunk_asked) == 6 and len(set(chunk_asked)) == 6
    assert len(sentence_asked) == len(set(sentence_asked)) == 3  # FIRST's three passages

    # The oracle row is MCF's sentence stage on the gold passages.
    gold = tuple(ScoredDocument(d, 0.0, True) for d in first.documents if d.is_gold)
    assert oracle[first.id] == MultiGranularFilter(_scripted_filter(), configs[0]).narrow(
        first.question, FilterResult(kept=gold, scored=gold, threshold=None))
    # Sentence pairs: "none" keeps the chunk (keep_chunk) or drops it (drop_chunk, the last
    # config); an unparsed reply keeps every sentence; "2, 3" keeps those two.
    by_title = {d.title: d.id for d in first.documents}
    kept_fixed = methods.kept_sentences(staged[0][first.id], first)
    assert kept_fixed == {(by_title["Sarah Buxton"], i) for i in range(3)} | \
        {(by_title["Love and Theft (duo)"], i) for i in range(3)} | \
        {(by_title["If You Ever Get Lonely"], 1), (by_title["If You Ever Get Lonely"], 2)}
    dropped = methods.kept_sentences(staged[-1][first.id], first)
    assert not any(pid == by_title["Love and Theft (duo)"] for pid, _ in dropped)
    statuses = methods.sentence_statuses([*staged, oracle])
    assert statuses == {by_title["Sarah Buxton"]: "unparsed",
                        by_title["Love and Theft (duo)"]: "none",
                        by_title["If You Ever Get Lonely"]: "parsed"}


def test_kept_sentences_index_the_data_split_when_it_has_blank_entries() -> None:
    from fake_backend import ScriptedBackend

    from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
    from sieverag.training.evaluation.filter_methods import kept_sentences, whole_passages

    document = Document(id="q/0", text="A. B. C.", sentences=("A.", " ", "B.", "C."),
                        is_gold=True, supporting_sentences=(2,))
    example = Example(id="q", question="?", answers=("x",), documents=(document,))
    mcf = MultiGranularFilter(ScriptedBackend(reply=lambda text: "2",
                                              labels=lambda text: {"Yes": 0.0, "No": -1.0}),
                              MCFConfig(bar="fixed", sentence_stage=True))
    result = mcf.select(example.question, example.documents)
    assert kept_sentences(result, example) == {("q/0", 2)}  # "[2]" is B., the data's third
    assert whole_passages(example, ["q/0"]) == {("q/0", 0), ("q/0", 2), ("q/0", 3)}


def test_eval_filter_through_a_served_filter(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same report from a filter behind an OpenAI-compatible server (a scripted one that
    scores the gold passages highest), with the sentence stage's "none" dropping the chunk;
    every MCF row keeps, passages and sentences, what MultiGranularFilter keeps on a backend
    of its own against the same server."""
    from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

    from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
    from sieverag.inference.llm.backend_registry import BackendSpec, build_backend

    gold_titles = {passage["title"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()
                   for passage in json.loads(line)["passages"] if passage["is_gold"]}
    replies = {"Sarah Buxton": "sentence one", "Love and Theft (duo)": "none",
               "If You Ever Get Lonely": "2"}

    def served_filter(request: RecordedRequest) -> Reply:
        body = request.json or {}
        prompt = body["messages"][-1]["content"]
        if not body.get("logprobs"):  # the sentence stage
            return Reply(body=chat_reply(next(r for t, r in replies.items()
                                              if f"{t}\n[1]" in prompt)))
        gold = any(f"Text:\n{title}\n" in prompt for title in gold_titles)
        near = "Text:\nSarah Buxton\n" in prompt
        yes, no = (-0.1, -3.0) if gold else (-1.0, -0.8) if near else (-3.0, -0.1)
        return Reply(body=chat_reply("Yes" if gold else "No",
                                     top_logprobs=[("Yes", yes), ("No", no)]))

    data = training_dataset(tmp_path / "data", ["unrelated-question"])
    out = tmp_path / "out"
    with FakeOpenAIServer(served_filter) as server:
        report = evaluate(models=roles(tiny_model_dir, endpoint=server.base_url,
                                       served="filter-test-00000000"),
                          exclude_training=(str(data),),
                          out=str(out), threshold=-1.0, empty_sentence_answer="drop_chunk")
        asked = [r.json for r in server.requests]
        spec = BackendSpec(model="filter-test-00000000",
                           endpoint=server.base_url, chat_template_model=str(tiny_model_dir))
        decisions = {d["id"]: d for d in read_decisions(out)}
        for row, fields in report["filter"]["mcf_rows"].items():
            mcf = MultiGranularFilter(build_backend(spec), MCFConfig(**fields))
            staged = MultiGranularFilter(build_backend(spec),
                                         MCFConfig(**{**fields, "sentence_stage": True}))
            for example in load_sample():
                decision = decisions[example.id]
                chunks = mcf.select(example.question, example.documents)
                assert decision["kept"][row] == [s.document.id for s in chunks.kept], row
                if "kept_sentences" not in decision:
                    continue
                result = staged.select(example.question, example.documents)
                # Kept sentences found by their text in the data's split (MCF strips them).
                split = {d.id: [x.strip() for x in d.sentences] for d in example.documents}
                expected = sorted([s.document.id, split[s.document.id].index(sentence.strip())]
                                  for s in result.kept for sentence in s.document.sentences)
                name = f"{row} → sentence stage (16 tokens, empty→drop chunk)"
                assert decision["kept_sentences"][name] == expected, name
    assert {body["model"] for body in asked} == {"filter-test-00000000"}
    chunk_prompts = [json.dumps(b["messages"]) for b in asked if b.get("logprobs")]
    sentence_prompts = [json.dumps(b["messages"]) for b in asked if not b.get("logprobs")]
    # Each passage scored once and each sentence prompt asked once for all the MCF rows.
    assert len(chunk_prompts) == len(set(chunk_prompts)) == 6
    assert len(sentence_prompts) == len(set(sentence_prompts)) == 3
    figures = report["chunk"]["MCF top_k=2"]
    assert (figures["precision"], figures["recall"], figures["f1"], figures["auroc"]) == \
        (1.0, 1.0, 1.0, 1.0)
    assert report["chunk"]["MCF fixed log-odds>=-1"]["kept_per_question"] == 2.5
    assert report["sentence_answers"] == {"answers": 3, "unparsed": 1, "none": 1}
    assert report["filter"]["served_as"] == "filter-test-00000000"
    assert "MCF top_k=2 → sentence stage (16 tokens, empty→drop chunk)" in report["sentence"]


def test_blank_long_and_duplicated_passages_do_not_stop_eval_filter(
        tiny_model_dir: Path, tiny_adapter: Path, tmp_path: Path) -> None:
    # Issue 65: a blank passage was scored 0 without the details the rows read (KeyError
    # 'p_yes'). One question padded as retrieved sets pad: empty, whitespace, a duplicate of
    # its gold passage and a very long passage (read window by window).
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    first = rows[0]
    passages = first["passages"]
    gold = next(p for p in passages if p.get("is_gold"))
    first["passages"] = [*passages, {"title": "", "text": ""}, {"title": "", "text": "  \n "},
                         {**gold, "is_gold": False},
                         {"title": "Long", "text": " ".join(["filler words"] * 900)}]
    odd = tmp_path / "hotpotqa_odd.jsonl"
    odd.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    data = training_dataset(tmp_path / "data", ["some-other-question"])
    report = evaluate(dataset=str(odd), models=roles(tiny_model_dir, tiny_adapter),
                      exclude_training=(str(data),), out=str(tmp_path / "report"),
                      judge=False)
    assert report["questions"]["evaluated"] == len(rows)
    assert report["passages"]["total"] == sum(len(r["passages"]) for r in rows)
    decisions = {d["id"]: d for d in read_decisions(tmp_path / "report")}
    assert first["id"] in decisions  # the padded question is decided and recorded
