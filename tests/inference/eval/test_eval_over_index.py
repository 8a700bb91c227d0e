"""`sieverag eval` over an index with the retrieval settings of the Auto-RAG study's ablation:
evidence hygiene (each record lists what it removed), the fusion weight alpha, a reranker;
and every record keeps the text the generator read (`contexts`). A scripted backend answers,
so no model loads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend, serve_every_role
from fake_dense import FAKE_DENSE, fake_encoder

from sieverag.cli import main
from sieverag.inference.cli.run import EvalCommand
from sieverag.inference.composition.config import (
    RetrievalConfig,
    RunConfig,
    TrustConfig,
    load_run_config,
)
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.eval import runner
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.retrieval import dense, rerank
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.index_folder import Index, build_index
from sieverag.inference.retrieval.retrieved import RetrievedDocument

QUESTION = "Who opened the Calder Bridge?"
CORPUS = [
    # 3 words: too short for loose and strict.
    {"id": "stub", "text": "Calder Bridge opened"},
    # 10 words: loose keeps it, strict (12 words at least) removes it.
    {"id": "mayor", "text": "The mayor of Quorrin opened the Calder Bridge in 1901."},
    {"id": "history", "title": "Quorrin", "text": "The Calder Bridge over the river Tamsin "
     "dates from 1901, when the mayor of Quorrin paid for it himself."},
    {"id": "mill", "text": "Bridges over the Tamsin: the Calder Bridge carries a road and a "
     "footpath across the river to the old mill."},
    {"id": "penguins", "text": "Penguins huddle together in winter to keep warm, taking turns "
     "at the windy edge of the group."},
]


def write_jsonl(path: Path, rows: Sequence[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> ScriptedBackend:
    """Every role of a run is one scripted backend answering "the mayor"."""
    scripted = ScriptedBackend(reply=lambda text: "the mayor")
    serve_every_role(monkeypatch, scripted)
    return scripted


@pytest.fixture
def bridge_index(tmp_path: Path) -> Path:
    """A BM25 index of CORPUS, one chunk per text."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    build_index(corpus, tmp_path / "index", IndexConfig(chunking=ChunkingConfig("none"),
                                                        dense=None), show_progress=False)
    return tmp_path / "index"


@pytest.fixture
def questions(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "questions.jsonl",
                       [{"id": "q1", "question": QUESTION, "answers": ["the mayor"]}])


def run(dataset: Path, out: Path, retrieval: RetrievalConfig,
        pipelines: tuple[str, ...] = ("vanilla",)) -> dict[str, EvalRecord]:
    """One evaluation; each pipeline's record of the first question."""
    config = RunConfig(dataset=str(dataset), dataset_format="triviaqa", pipelines=pipelines,
                       retrieval=retrieval, trust=TrustConfig(enabled=False))
    runner.run_evaluation(config, out, progress=False)
    return {name: JsonlLog(out / "results" / f"{name}.jsonl").read_records(EvalRecord)[0]
            for name in pipelines}


def bm25_ranking(index_dir: Path, query: str = QUESTION) -> list[str]:
    return [hit.document.id for hit in Index.load(index_dir, use_cache=False).search(query, 10,
                                                                                  "bm25")]


@pytest.mark.parametrize(("preset", "removed"), [
    ("off", None),
    ("loose", {"stub#0": "too short (3 words)"}),
    ("strict", {"stub#0": "too short (3 words)", "mayor#0": "too short (10 words)"}),
])
def test_hygiene_removes_what_its_preset_must_and_the_record_says_so(
        tmp_path: Path, backend: ScriptedBackend, bridge_index: Path, questions: Path,
        preset: str, removed: dict[str, str] | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    ranking = bm25_ranking(bridge_index)
    assert ranking[:2] == ["stub#0", "mayor#0"]  # the two short texts rank first for BM25
    retrieval = RetrievalConfig(index=str(bridge_index), mode="bm25", k=2, hygiene=preset)
    records = run(questions, tmp_path / "run", retrieval, ("vanilla", "iter-retgen"))
    vanilla = records["vanilla"]
    # k chunks are still read: the best-ranked ones the preset keeps.
    assert vanilla.documents_read == [c for c in ranking if c not in (removed or {})][:2]
    line = json.loads((tmp_path / "run" / "results" / "vanilla.jsonl").open().readline())
    if removed is None:
        assert "hygiene_removed" not in line  # off: the field is absent, not empty
    else:
        assert {r.id: r.reason for r in vanilla.hygiene_removed} == removed
        assert [r.id for r in vanilla.hygiene_removed] == [c for c in ranking if c in removed]
        assert main(["trace", str(tmp_path / "run"), "q1", "--pipeline", "vanilla"]) == 0
        assert "Evidence hygiene removed: stub#0 (too short (3 words))" in capsys.readouterr().out
        # iter-retgen's later query goes through the same rule: no removed chunk is read,
        # and each removed chunk is listed once however many searches removed it.
        iterative = records["iter-retgen"]
        assert not set(iterative.documents_read) & set(removed)
        assert {r.id for r in iterative.hygiene_removed} == set(removed)
        assert len(iterative.hygiene_removed) == len(removed)


def test_hygiene_lists_nothing_removed_as_an_empty_list(
        tmp_path: Path, backend: ScriptedBackend, bridge_index: Path, questions: Path) -> None:
    retrieval = RetrievalConfig(index=str(bridge_index), mode="bm25", k=2, hygiene="strict")
    direct = run(questions, tmp_path / "run", retrieval, ("direct",))["direct"]
    assert direct.hygiene_removed == []  # hygiene on, nothing searched: nothing removed


def test_index_search_and_eval_share_one_hygiene_rule(
        bridge_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "search", str(bridge_index), QUESTION, "--mode", "bm25", "-k", "2",
                 "--hygiene", "strict", "--no-cache"]) == 0
    printed = capsys.readouterr().out
    assert "history#0" in printed and "mill#0" in printed
    assert "stub#0: too short (3 words)" in printed
    assert "mayor#0: too short (10 words)" in printed


def test_alpha_reaches_the_index(tmp_path: Path, backend: ScriptedBackend,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # BM25 puts `trucks` first, the (word-hashing) dense encoder `lane`: alpha 0.5 fuses to
    # trucks, alpha 0.7 (more weight on dense) to lane.
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": "trucks", "text": "Diesel fuel powers most trucks on long roads across the "
                                 "country."},
        {"id": "lane", "text": "The house at the end of the lane is the oldest of the houses "
                               "in the town."},
        {"id": "bread", "text": "Bread rises because yeast ferments sugar and releases gas in "
                                "the dough."}])
    build_index(corpus, tmp_path / "index", IndexConfig(chunking=ChunkingConfig("none"),
                                                        dense=FAKE_DENSE),
                dense_encoder=fake_encoder, show_progress=False)
    monkeypatch.setattr(dense, "make_encoder", lambda config: fake_encoder)
    dataset = write_jsonl(tmp_path / "questions.jsonl", [
        {"id": "q1", "question": "Which fuel is the one at the end of the road?",
         "answers": ["diesel"]}])
    read = {}
    for alpha in (0.5, 0.7):
        retrieval = RetrievalConfig(index=str(tmp_path / "index"), mode="hybrid", k=1,
                                    search=SearchConfig(alpha=alpha))
        record = run(dataset, tmp_path / f"run-{alpha}", retrieval)["vanilla"]
        read[alpha] = record.documents_read
    assert read == {0.5: ["trucks#0"], 0.7: ["lane#0"]}
    saved = load_run_config(tmp_path / "run-0.7" / "config.yaml")
    assert saved.retrieval is not None and saved.retrieval.search.alpha == 0.7


class ReversingReranker:
    """Scores hits in reverse of the first stage's order (a stand-in cross-encoder)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = str(model_dir)

    def rerank(self, query: str, hits: Sequence[RetrievedDocument]) -> list[RetrievedDocument]:
        return [replace(hit, score=float(rank)) for rank, hit in enumerate(hits)][::-1]


def test_a_reranker_reorders_what_eval_reads(tmp_path: Path, backend: ScriptedBackend,
                                             bridge_index: Path, questions: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    def load(model_dir: str) -> ReversingReranker:
        loaded.append(model_dir)
        return ReversingReranker(model_dir)

    monkeypatch.setattr(rerank, "CrossEncoderReranker", load)
    first_stage = bm25_ranking(bridge_index)[:3]
    # The reranker re-scores the first stage's top rerank_depth (3) hits; 2 are read.
    retrieval = RetrievalConfig(index=str(bridge_index), mode="bm25", k=2,
                                reranker=str(tmp_path / "cross-encoder"),
                                search=SearchConfig(rerank_depth=3))
    record = run(questions, tmp_path / "run", retrieval)["vanilla"]
    assert loaded == [str(tmp_path / "cross-encoder")]
    assert record.documents_read == first_stage[::-1][:2]


def test_a_missing_reranker_folder_is_one_error_naming_the_field(
        tmp_path: Path, backend: ScriptedBackend, bridge_index: Path, questions: Path) -> None:
    retrieval = RetrievalConfig(index=str(bridge_index), mode="bm25",
                                reranker=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"retrieval\.reranker: .*nowhere"):
        run(questions, tmp_path / "run", retrieval)
    with pytest.raises(ConfigError, match=r"retrieval\.reranker"):
        RetrievalConfig(index=str(bridge_index), reranker=" ")


@pytest.mark.parametrize("pipeline", ["vanilla", "iter-retgen", "main-rag", "amber-none"])
def test_contexts_are_the_text_the_generator_read(
        tmp_path: Path, backend: ScriptedBackend, bridge_index: Path, questions: Path,
        pipeline: str) -> None:
    retrieval = RetrievalConfig(index=str(bridge_index), mode="bm25", k=3)
    record = run(questions, tmp_path / "run", retrieval, (pipeline,))[pipeline]
    texts = {f"{row['id']}#0": (f"{row['title']}\n{row['text']}" if "title" in row
                                else row["text"]) for row in CORPUS}
    assert record.documents_read
    assert record.contexts == [texts[i] for i in record.documents_read]
    answer_prompts = [text for agent, text in backend.calls if agent == "generator"]
    # Each text read is in the prompt that answered (iter-retgen: some iteration's prompt).
    assert all(any(context in prompt for prompt in answer_prompts)
               for context in record.contexts)


def test_a_direct_record_keeps_no_contexts_and_an_old_record_still_loads(tmp_path: Path) -> None:
    old = {"id": "q1", "question": QUESTION, "answers": ["the mayor"], "prediction": "x",
           "raw_prediction": "x", "metrics": {"em": 0.0, "f1": 0.0, "accuracy": 0.0},
           "documents_read": ["a"], "documents_given": 0, "read_scores": None, "usage": {},
           "llm_calls": 1, "input_tokens": 3, "generator_input_tokens": 3, "seconds": 0.1}
    log = JsonlLog(tmp_path / "vanilla.jsonl")
    log.append(old)
    (record,) = log.read_records(EvalRecord)
    assert record.contexts == [] and record.hygiene_removed is None and record.reference is None
    assert record.to_json() == old  # read and written again: the same line


def test_retrieval_flags_reach_the_run_config_and_it_round_trips(tmp_path: Path) -> None:
    command = parse_settings(EvalCommand, [
        "--dataset", "d.jsonl", "--retrieval.index", "idx", "--retrieval.mode", "bm25",
        "--retrieval.hygiene", "strict", "--retrieval.search.alpha", "0.7",
        "--retrieval.reranker", "models/ce"], "sieverag eval")
    retrieval = command.retrieval
    assert retrieval == RetrievalConfig(index="idx", mode="bm25", hygiene="strict",
                                        search=SearchConfig(alpha=0.7), reranker="models/ce")
    config = RunConfig(dataset="d.jsonl", retrieval=retrieval)
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert load_run_config(tmp_path / "config.yaml") == config
    # A config.yaml written before these settings existed loads with their defaults.
    (tmp_path / "old.yaml").write_text("dataset: d.jsonl\nretrieval:\n  index: idx\n"
                                       "  mode: bm25\n  k: 5\n")
    old = load_run_config(tmp_path / "old.yaml").retrieval
    assert old is not None
    assert (old.hygiene, old.search, old.reranker) == ("off", SearchConfig(), None)


def test_a_preset_s_retrieval_takes_the_ablation_s_settings_from_flags() -> None:
    command = parse_settings(EvalCommand, [
        "--preset", "amber-open", "--dataset", "d.jsonl", "--retrieval.mode", "bm25",
        "--retrieval.hygiene", "loose"], "sieverag eval")
    assert command.retrieval is not None
    assert (command.retrieval.index, command.retrieval.k) == ("runs/open-index", 6)  # preset's
    assert (command.retrieval.mode, command.retrieval.hygiene) == ("bm25", "loose")


@pytest.mark.parametrize(("flags", "named"), [
    (["--retrieval.hygiene", "medium"], "retrieval.hygiene"),
    (["--retrieval.search.alpha", "1.5"], "search.alpha must be in [0, 1]"),
    (["--retrieval.search.rerank-depth", "0"], "search.rerank_depth must be >= 1"),
    # a setting the index folder cannot use is refused, not ignored
    (["--retrieval.collection", "c"], "retrieval.collection does not apply to index idx"),
    (["--retrieval.timeout", "5"], "retrieval.timeout does not apply to index idx"),
    (["--retrieval.api-key-env", "KEY"], "retrieval.api_key_env does not apply to index idx"),
])
def test_bad_retrieval_flags_are_one_error_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        named: str) -> None:
    assert main(["eval", "--dataset", "d.jsonl", "--retrieval.index", "idx", *flags,
                 "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and named in error
    assert not (tmp_path / "run").exists()
