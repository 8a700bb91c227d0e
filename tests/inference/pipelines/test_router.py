"""The conditional router: features by hand, every decision branch of both rules (the
study's `knowledge` rule on a fake encoder, the `corpus-match` rule on a tiny BM25 index),
config errors and flags, and the `auto` pipeline (scripted model; end to end on a tiny model)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.cli.run import EvalCommand
from sieverag.inference.composition.compose import build_context, plan_run
from sieverag.inference.composition.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
    load_run_config,
)
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.core.types import Document, Example
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.pipelines import PipelineContext
from sieverag.inference.pipelines.auto import AutoPipeline, router_encoder
from sieverag.inference.pipelines.auto.retrieval_router import Router, RouterConfig, entity_words
from sieverag.inference.pipelines.simple import DirectPipeline
from sieverag.inference.retrieval import dense
from sieverag.inference.retrieval.bm25 import BM25Index
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index_folder import build_index

CORPUS = [
    "Scurvy is caused by a lack of vitamin C.",
    "Rickets is a bone disease caused by a lack of vitamin D.",
    "Iodine deficiency causes goiter, an enlarged thyroid gland.",
    "Citrus fruit such as oranges is rich in vitamin C.",
    "The Eiffel Tower is a landmark in Paris.",
    "Jazz music began in New Orleans.",
    "Mount Everest is the highest mountain on Earth.",
    "The Nile flows north into the Mediterranean Sea.",
    "Chess is a board game for two players.",
    "Volcanoes erupt molten rock called lava.",
]
# Indexed terms per text after stop words and stemming (e.g. text 0: scurvi caus lack
# vitamin; "C" is too short to index): the lengths BM25 normalises by.
LENGTHS = [4, 6, 7, 5, 4, 5, 5, 5, 5, 6]
NO_NEED = "What does a lack of vitamin cause?"  # no intent, no name, two texts match alike
CORPUS_MATCH = RouterConfig(rule="corpus-match")


def lucene_term_score(document_frequency: int, length: int, k1: float = 1.5,
                      b: float = 0.75) -> float:
    """One query term occurring once in a text, BM25 as bm25s's `lucene` variant scores it."""
    n, average = len(LENGTHS), sum(LENGTHS) / len(LENGTHS)
    idf = math.log(1 + (n - document_frequency + 0.5) / (document_frequency + 0.5))
    return idf / (k1 * (1 - b + b * length / average) + 1)


@pytest.fixture(scope="module")
def corpus_index() -> SimpleNamespace:
    """What the router reads of an `Index`: its BM25 part."""
    return SimpleNamespace(bm25=BM25Index.build(CORPUS, show_progress=False))


def label_backend(p_yes: float) -> ScriptedBackend:
    """A model whose self-check answers Yes with probability `p_yes`."""
    return ScriptedBackend(labels=lambda text: {"Yes": math.log(p_yes),
                                                "No": math.log(1 - p_yes)})


@pytest.mark.parametrize(("question", "intent", "tokens"), [
    ("According to the textbook, why does scurvy happen?", ["why", "according to"], 8),
    ("Explain the difference between rickets and scurvy", ["explain", "difference between"], 7),
    ("However, which vitamin prevents scurvy?", [], 5),  # "how" only as a whole word
    ("Is the plan accordingly to schedule?", [], 6),  # "according to" only as a phrase
    ("What are the four D's of pellagra?", ["what are the"], 7),
])
def test_intent_words_and_query_length(question: str, intent: list[str], tokens: int) -> None:
    features = Router(CORPUS_MATCH).features(question)
    assert features["intent"] == intent
    assert features["query_tokens"] == tokens
    # Without an index there are no corpus features, and no self-check unless asked for.
    assert [features[k] for k in ("vocabulary_overlap", "top_score", "score_margin",
                                  "self_check")] == [None] * 4


@pytest.mark.parametrize(("question", "names"), [
    ("What is Edward Corser's occupation?", ["Edward", "Corser's"]),
    ("How did Dr. Christiaan Eijkman cure chickens?", ["Dr", "Christiaan", "Eijkman"]),
    ("VIVA Media AG changed its name in 2004. What does it stand for?", ["Media", "AG"]),
    ("Which enzyme breaks down lactose? I forget vitamin C.", []),
])
def test_entity_words_skip_sentence_openers(question: str, names: list[str]) -> None:
    assert entity_words(question) == names


def test_corpus_features_by_hand(corpus_index: SimpleNamespace) -> None:
    router = Router(CORPUS_MATCH, index=corpus_index)
    # "thyroid", "gland", "enlarg" occur only in text 2 (7 terms): three rare terms there.
    only_one = router.features("What enlarges the thyroid gland?")
    assert only_one["vocabulary_overlap"] == 1.0  # "what" is a question word, not content
    assert only_one["top_score"] == pytest.approx(3 * lucene_term_score(1, 7), abs=1e-3)
    assert only_one["score_margin"] == 1.0  # nothing else matches
    # "scurvi" (text 0 only) + "caus" (texts 0, 1, 2): text 0 first, text 1 second.
    scurvy = router.features("What causes scurvy?")
    top = lucene_term_score(1, 4) + lucene_term_score(3, 4)
    second = lucene_term_score(3, 6)
    assert scurvy["top_score"] == pytest.approx(top, abs=1e-3)
    assert scurvy["score_margin"] == pytest.approx((top - second) / top, abs=1e-3)
    # scurvi, caus known; bleed, gum not ("does" is a question word).
    assert router.features("Does scurvy cause bleeding gums?")["vocabulary_overlap"] == 0.5
    unknown = router.features("Who painted the Mona Lisa?")
    assert (unknown["vocabulary_overlap"], unknown["top_score"],
            unknown["score_margin"]) == (0.0, 0.0, 0.0)
    stop_words_only = router.features("What is it?")
    assert stop_words_only["vocabulary_overlap"] is None and stop_words_only["top_score"] == 0


@pytest.mark.parametrize(("question", "config", "retrieve", "reason"), [
    ("Who painted the Mona Lisa?", CORPUS_MATCH, False, "corpus has no match"),
    ("Did Picasso, Dali, Miro and Goya paint the thyroid gland?", CORPUS_MATCH, False,
     "question outside the corpus vocabulary"),  # names, but 2 of 7 terms are the corpus's
    (NO_NEED, CORPUS_MATCH, False, "no need signalled"),
    ("Why does a lack of vitamin cause harm?", CORPUS_MATCH, True, "intent: why"),
    (NO_NEED, replace(CORPUS_MATCH, long_query_tokens=7), True, "long question"),
    ("What does a lack of vitamin cause in Lind's sailors?", CORPUS_MATCH, True,
     "names: Lind's"),
    ("What does a lack of vitamin cause in Lind's sailors?",
     replace(CORPUS_MATCH, min_entity_words=0), False, "no need signalled"),
    ("What enlarges the thyroid gland?", CORPUS_MATCH, True, "decisive corpus match"),
])
def test_corpus_match_decision_branches(corpus_index: SimpleNamespace, question: str,
                                        config: RouterConfig, retrieve: bool,
                                        reason: str) -> None:
    decision = Router(config, index=corpus_index).decide(question)
    assert (decision.retrieve, decision.reason) == (retrieve, reason)
    assert decision.to_json()["features"] == decision.features


def test_corpus_match_self_check_confident_skips_and_unsure_retrieves(
        corpus_index: SimpleNamespace) -> None:
    config = replace(CORPUS_MATCH, self_check=True)
    confident = label_backend(0.9)
    decision = Router(config, index=corpus_index, backend=confident).decide(
        "Why is vitamin C lacking in scurvy?")  # an intent word, yet the model knows
    assert (decision.retrieve, decision.reason) == (False, "model confident")
    assert decision.features["self_check"] == pytest.approx(0.9)
    assert confident.calls == [("router", confident.calls[0][1])]
    assert "Why is vitamin C lacking in scurvy?" in confident.calls[0][1]
    unsure = Router(config, index=corpus_index, backend=label_backend(0.2)).decide(NO_NEED)
    assert (unsure.retrieve, unsure.reason) == (True, "model unsure")
    assert unsure.features["self_check"] == pytest.approx(0.2)
    # The corpus gate comes first: nothing to retrieve, whatever the model thinks.
    nothing = Router(config, index=corpus_index, backend=label_backend(0.2)).decide(
        "Who painted the Mona Lisa?")
    assert (nothing.retrieve, nothing.reason) == (False, "corpus has no match")


SIMPLE = "Which vitamin prevents scurvy?"  # no intent word, no name, short
WHY = "Why does vitamin C prevent scurvy?"  # an intent word; 6 words
NAMES = "Which vitamin did Lind's sailors lack?"  # a name
MONA = "Who painted the Mona Lisa?"  # nothing in the corpus matches
KNOWS = "Vitamin C prevents scurvy. It is found in citrus fruit."  # a raw reply on the subject
HEDGES = "I am not sure, sorry."
# Embeddings chosen by hand: every question at (1, 0); the reply on the subject at cosine 0.8
# (not a unit vector: the router normalises), the hedge at 0.28.
EMBEDDINGS = {SIMPLE: [1.0, 0.0], WHY: [1.0, 0.0], NAMES: [1.0, 0.0], MONA: [1.0, 0.0],
              KNOWS: [1.6, 1.2], HEDGES: [0.28, 0.96]}


class FakeEncoder:
    """A sentence encoder with the embeddings above; it remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([EMBEDDINGS[t] for t in texts], dtype=np.float32)


@pytest.mark.parametrize(("question", "draft", "config", "retrieve", "reason"), [
    (SIMPLE, HEDGES, RouterConfig(), True,
     "low similarity to the model's knowledge (0.28 < 0.5)"),
    (SIMPLE, KNOWS, RouterConfig(), False, "model knows it (similarity 0.8)"),
    (SIMPLE, KNOWS, RouterConfig(min_knowledge_similarity=0.9), True,
     "low similarity to the model's knowledge (0.8 < 0.9)"),
    (WHY, KNOWS, RouterConfig(), True, "complex: intent: why"),  # the model knows, yet
    (WHY, KNOWS, RouterConfig(long_query_tokens=6), True,
     "complex: intent: why; long question"),
    (WHY, KNOWS, RouterConfig(min_complexity=2), False, "model knows it (similarity 0.8)"),
    (WHY, KNOWS, RouterConfig(min_complexity=2, long_query_tokens=6), True,
     "complex: intent: why; long question"),
    (WHY, KNOWS, RouterConfig(min_complexity=0), False, "model knows it (similarity 0.8)"),
    (NAMES, HEDGES, RouterConfig(), True,
     "low similarity to the model's knowledge (0.28 < 0.5); complex: names: Lind's"),
    (NAMES, KNOWS, RouterConfig(min_entity_words=0), False, "model knows it (similarity 0.8)"),
])
def test_knowledge_rule_decision_branches(question: str, draft: str, config: RouterConfig,
                                          retrieve: bool, reason: str) -> None:
    encoder = FakeEncoder()
    decision = Router(config, embed=encoder).decide(question, draft=draft)
    assert (decision.retrieve, decision.reason) == (retrieve, reason)
    assert encoder.calls == [[question, draft]]  # the raw reply, not a first sentence
    signals = ((config.intent_words == RouterConfig().intent_words and question == WHY)
               + (len(question.split()) >= config.long_query_tokens)
               + (config.min_entity_words > 0 and question == NAMES))
    assert decision.features["complexity"] == signals
    assert decision.features["knowledge_similarity"] == (0.8 if draft == KNOWS else 0.28)
    assert decision.to_json()["features"] == decision.features


def test_knowledge_rule_records_the_corpus_features_but_is_not_gated_by_them(
        corpus_index: SimpleNamespace) -> None:
    decision = Router(RouterConfig(), index=corpus_index, embed=FakeEncoder()).decide(
        MONA, draft=HEDGES)
    # Corpus-match would skip ("corpus has no match"); the study's rule asks the model.
    assert (decision.retrieve, decision.reason) == (
        True, "low similarity to the model's knowledge (0.28 < 0.5); complex: names: Mona, Lisa")
    assert set(decision.features) == {
        "query_tokens", "intent", "entities", "vocabulary_overlap", "top_score",
        "score_margin", "self_check", "knowledge_similarity", "complexity"}
    assert (decision.features["top_score"], decision.features["self_check"]) == (0.0, None)


def test_knowledge_rule_self_check_is_one_more_doubt() -> None:
    config = RouterConfig(self_check=True)
    unsure = Router(config, backend=label_backend(0.2), embed=FakeEncoder()).decide(
        SIMPLE, draft=KNOWS)
    assert (unsure.retrieve, unsure.reason) == (True, "model unsure")
    # A confident self-check does not outvote a draft far from the question.
    confident = Router(config, backend=label_backend(0.9), embed=FakeEncoder()).decide(
        SIMPLE, draft=HEDGES)
    assert (confident.retrieve, confident.reason) == (
        True, "low similarity to the model's knowledge (0.28 < 0.5)")
    assert confident.features["self_check"] == pytest.approx(0.9)


def test_knowledge_rule_needs_an_encoder_and_a_draft() -> None:
    with pytest.raises(ConfigError, match="router.rule"):
        Router(RouterConfig())
    with pytest.raises(ValueError, match="draft"):
        Router(RouterConfig(), embed=FakeEncoder()).decide(SIMPLE)


@pytest.mark.parametrize(("field", "value"), [
    ("min_vocabulary_overlap", 1.5), ("self_check_threshold", -0.1), ("min_score_margin", 2.0),
    ("long_query_tokens", 0), ("min_entity_words", -1), ("min_top_score", -1.0),
    ("intent_words", ("why", " ")), ("min_knowledge_similarity", 1.5),
    ("min_knowledge_similarity", -1.01), ("min_complexity", -1), ("embedding_model", " "),
])
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"router.{field}"):
        RouterConfig(**{field: value})


def test_self_check_needs_a_backend_and_yaml_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="router.self_check"):
        Router(replace(CORPUS_MATCH, self_check=True))
    config = tmp_path / "config.yaml"
    config.write_text("dataset: d.jsonl\nrouter:\n  min_score_margin: 3\n")
    with pytest.raises(ConfigError, match="router.min_score_margin"):
        load_run_config(config)
    config.write_text("dataset: d.jsonl\nrouter:\n  rule: always\n")
    with pytest.raises(ConfigError, match="router.rule"):
        load_run_config(config)


def test_router_flags_reach_the_run_config_and_it_round_trips(tmp_path: Path) -> None:
    command = parse_settings(EvalCommand, [
        "--dataset", "d.jsonl", "--pipelines", "auto", "--router.rule", "corpus-match",
        "--router.min-knowledge-similarity", "0.3", "--router.min-complexity", "2",
        "--router.embedding-model", "models/encoder"], "sieverag eval")
    assert command.router == RouterConfig(rule="corpus-match", min_knowledge_similarity=0.3,
                                          min_complexity=2, embedding_model="models/encoder")
    assert parse_settings(EvalCommand, ["--dataset", "d.jsonl"],
                          "sieverag eval").router.rule == "knowledge"  # the study's, by default
    config = RunConfig(dataset="d.jsonl", pipelines=("auto",), router=command.router)
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert load_run_config(tmp_path / "config.yaml") == config


def test_the_encoder_loads_only_for_auto_under_the_knowledge_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[dense.DenseConfig] = []
    monkeypatch.setattr(dense, "make_encoder", lambda config: loaded.append(config) or "enc")
    auto = RunConfig(dataset="d.jsonl", pipelines=("vanilla", "auto"))
    assert router_encoder(auto.router) == "enc"
    assert loaded == [dense.DenseConfig(model="all-minilm-l6-v2")]  # the trust metrics' default
    assert router_encoder(CORPUS_MATCH) is None
    assert len(loaded) == 1
    monkeypatch.undo()
    missing = replace(auto, router=RouterConfig(embedding_model=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match="router.embedding_model"):
        build_context(plan_run(missing))  # before any model loads


def scripted_auto(router: Router, reply: Callable[[str], str]) -> tuple[AutoPipeline,
                                                                       ScriptedBackend]:
    backend = ScriptedBackend(reply=reply)
    context = PipelineContext(generator=backend, judge_backend=backend, parts={"auto": router})
    return AutoPipeline(context), backend


def example_of(question: str) -> Example:
    return Example(id="q", question=question, answers=("vitamin C",),
                   documents=(Document(id="d0", text=CORPUS[0]), Document(id="d3",
                                                                         text=CORPUS[3])))


def test_auto_returns_the_draft_when_the_model_knows_and_retrieves_when_not() -> None:
    def reply(text: str) -> str:
        if "Documents:" in text:
            return "Vitamin C, as the documents say."
        return KNOWS if SIMPLE in text else HEDGES

    encoder = FakeEncoder()
    auto, backend = scripted_auto(Router(RouterConfig(), embed=encoder), reply)
    known = auto.run(example_of(SIMPLE))
    direct = DirectPipeline(PipelineContext(generator=ScriptedBackend(reply=reply),
                                            judge_backend=backend)).run(example_of(SIMPLE))
    assert (known.answer, known.raw_answer, known.documents_read) == (
        direct.answer, direct.raw_answer, ()) == ("Vitamin C prevents scurvy", KNOWS, ())
    assert known.trace["route"]["reason"] == "model knows it (similarity 0.8)"
    assert [agent for agent, _ in backend.calls] == ["generator"]  # the draft is the answer
    backend.calls.clear()
    unknown = auto.run(example_of(MONA))
    assert unknown.trace["route"]["retrieve"] is True
    assert unknown.raw_answer == "Vitamin C, as the documents say."
    assert [d.id for d in unknown.documents_read] == ["d0", "d3"]
    assert len(backend.calls) == 2 and "Documents:" not in backend.calls[0][1]  # draft, then
    assert encoder.calls == [[SIMPLE, KNOWS], [MONA, HEDGES]]


def test_auto_under_corpus_match_drafts_nothing() -> None:
    auto, backend = scripted_auto(Router(CORPUS_MATCH), lambda text: "Vitamin C.")
    skipped, retrieved = auto.run(example_of(NO_NEED)), auto.run(example_of(WHY))
    assert skipped.trace["route"]["reason"] == "no need signalled"
    assert (skipped.documents_read, len(retrieved.documents_read)) == ((), 2)
    assert "knowledge_similarity" not in retrieved.trace["route"]["features"]
    assert len(backend.calls) == 2  # one generation per question
    with pytest.raises(ConfigError, match="router"):
        AutoPipeline(PipelineContext(generator=backend, judge_backend=backend))


def auto_run_config(folder: Path, model_dir: Path, router: RouterConfig,
                    pipelines: tuple[str, ...] = ("auto",)) -> RunConfig:
    """A run of three questions over a BM25 index of CORPUS, on the tiny model."""
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": text}) + "\n"
                              for i, text in enumerate(CORPUS)))
    build_index(corpus, folder / "index", IndexConfig(dense=None), show_progress=False)
    questions = [("q-why", "Why is vitamin C lacking in scurvy?", "collagen"),
                 ("q-none", "Who painted the Mona Lisa?", "Leonardo da Vinci"),
                 ("q-plain", NO_NEED, "scurvy")]
    dataset = folder / "questions.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "question": q, "answers": [a]}) + "\n"
                               for i, q, a in questions))
    return RunConfig(dataset=str(dataset), pipelines=pipelines, dataset_format="triviaqa",
                     models=ModelRoles(generator=BackendSpec(model=str(model_dir),
                                                             batch_size=4)),
                     retrieval=RetrievalConfig(index=str(folder / "index"), mode="bm25", k=2),
                     router=router, trust=TrustConfig(enabled=False))


def read_records(run: Path, pipeline: str) -> dict[str, dict]:
    lines = (run / "results" / f"{pipeline}.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def test_auto_pipeline_routes_and_records_its_decisions(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The corpus-match rule reads no draft: no sentence encoder is loaded for it.
    monkeypatch.setattr(dense, "make_encoder", lambda config: pytest.fail("encoder loaded"))
    config = auto_run_config(tmp_path, tiny_model_dir, CORPUS_MATCH)
    summaries = run_evaluation(config, tmp_path / "run", progress=False)

    records = read_records(tmp_path / "run", "auto")
    routes = {i: r["trace"]["route"] for i, r in records.items()}
    assert {i: (r["retrieve"], r["reason"]) for i, r in routes.items()} == {
        "q-why": (True, "intent: why; decisive corpus match"),
        "q-none": (False, "corpus has no match"), "q-plain": (False, "no need signalled")}
    assert set(routes["q-why"]["features"]) == {
        "query_tokens", "intent", "entities", "vocabulary_overlap", "top_score",
        "score_margin", "self_check"}
    # Retrieved: the 2 best chunks, text 0 (scurvy, lack, vitamin) first; skipped: none.
    assert records["q-why"]["documents_read"][0].startswith("t0")
    assert len(records["q-why"]["documents_read"]) == 2
    assert records["q-none"]["documents_read"] == records["q-plain"]["documents_read"] == []
    assert (records["q-why"]["generator_input_tokens"]
            > records["q-plain"]["generator_input_tokens"])
    assert summaries["auto"]["retrieval_usage_rate"] == pytest.approx(1 / 3, abs=1e-4)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["pipelines"]["auto"]["retrieval_usage_rate"] == pytest.approx(1 / 3, abs=1e-4)


def test_auto_under_the_knowledge_rule_end_to_end(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    def make_encoder(config: dense.DenseConfig) -> Callable[[Sequence[str]], np.ndarray]:
        loaded.append(config.model)

        def encode(texts: Sequence[str]) -> np.ndarray:
            # The random tiny model drafts noise; say it knows the plain question only.
            question, _ = texts
            return np.array([[1.0, 0.0], [1.0, 0.0] if question == NO_NEED else [0.0, 1.0]])

        return encode

    monkeypatch.setattr(dense, "make_encoder", make_encoder)
    config = auto_run_config(tmp_path, tiny_model_dir, RouterConfig(),
                             pipelines=("auto", "direct"))
    summaries = run_evaluation(config, tmp_path / "run", progress=False)

    assert loaded == ["all-minilm-l6-v2"]  # one encoder, for the router
    records, direct = read_records(tmp_path / "run", "auto"), read_records(tmp_path / "run",
                                                                          "direct")
    low = "low similarity to the model's knowledge (0.0 < 0.5)"
    assert {i: (r["trace"]["route"]["retrieve"], r["trace"]["route"]["reason"])
            for i, r in records.items()} == {
        "q-why": (True, f"{low}; complex: intent: why"),
        "q-none": (True, f"{low}; complex: names: Mona, Lisa"),
        "q-plain": (False, "model knows it (similarity 1.0)")}
    # Known: the draft is the answer, exactly the `direct` pipeline's, from one call.
    plain = records["q-plain"]
    assert (plain["raw_prediction"], plain["generator_input_tokens"]) == (
        direct["q-plain"]["raw_prediction"], direct["q-plain"]["generator_input_tokens"])
    assert plain["documents_read"] == [] and plain["usage"]["generator"]["calls"] == 1
    # Not known: the routed `vanilla` runs (2 chunks; none match the Mona Lisa, so it answers
    # closed-book again) and the draft's call shows in the usage.
    assert [len(records[i]["documents_read"]) for i in ("q-why", "q-none")] == [2, 0]
    assert [records[i]["usage"]["generator"]["calls"] for i in ("q-why", "q-none")] == [2, 2]
    assert (records["q-why"]["generator_input_tokens"]
            > direct["q-why"]["generator_input_tokens"])
    assert summaries["auto"]["retrieval_usage_rate"] == pytest.approx(2 / 3, abs=1e-4)
