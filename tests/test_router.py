"""The conditional router: features by hand, every decision branch, config errors, and the
`auto` pipeline end to end (tiny model, tiny BM25 index)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
    load_run_config,
)
from sieverag.inference.errors import ConfigError
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.llm.registry import BackendSpec
from sieverag.inference.pipelines.router import Router, RouterConfig, entity_words
from sieverag.inference.retrieval.bm25 import BM25Index
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index import build_index

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
    features = Router().features(question)
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
    router = Router(index=corpus_index)
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
    ("Who painted the Mona Lisa?", RouterConfig(), False, "corpus has no match"),
    ("Did Picasso, Dali, Miro and Goya paint the thyroid gland?", RouterConfig(), False,
     "question outside the corpus vocabulary"),  # names, but 2 of 7 terms are the corpus's
    (NO_NEED, RouterConfig(), False, "no need signalled"),
    ("Why does a lack of vitamin cause harm?", RouterConfig(), True, "intent: why"),
    (NO_NEED, RouterConfig(long_query_tokens=7), True, "long question"),
    ("What does a lack of vitamin cause in Lind's sailors?", RouterConfig(), True,
     "names: Lind's"),
    ("What does a lack of vitamin cause in Lind's sailors?", RouterConfig(min_entity_words=0),
     False, "no need signalled"),
    ("What enlarges the thyroid gland?", RouterConfig(), True, "decisive corpus match"),
])
def test_decision_branches(corpus_index: SimpleNamespace, question: str, config: RouterConfig,
                           retrieve: bool, reason: str) -> None:
    decision = Router(config, index=corpus_index).decide(question)
    assert (decision.retrieve, decision.reason) == (retrieve, reason)
    assert decision.to_json()["features"] == decision.features


def test_self_check_confident_skips_and_unsure_retrieves(corpus_index: SimpleNamespace) -> None:
    config = RouterConfig(self_check=True)
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


@pytest.mark.parametrize(("field", "value"), [
    ("min_vocabulary_overlap", 1.5), ("self_check_threshold", -0.1), ("min_score_margin", 2.0),
    ("long_query_tokens", 0), ("min_entity_words", -1), ("min_top_score", -1.0),
    ("intent_words", ("why", " ")),
])
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"router.{field}"):
        RouterConfig(**{field: value})


def test_self_check_needs_a_backend_and_yaml_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="router.self_check"):
        Router(RouterConfig(self_check=True))
    config = tmp_path / "config.yaml"
    config.write_text("dataset: d.jsonl\nrouter:\n  min_score_margin: 3\n")
    with pytest.raises(ConfigError, match="router.min_score_margin"):
        load_run_config(config)


def test_auto_pipeline_routes_and_records_its_decisions(tmp_path: Path,
                                                        tiny_model_dir: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": text}) + "\n"
                              for i, text in enumerate(CORPUS)))
    build_index(corpus, tmp_path / "index", IndexConfig(dense=None), show_progress=False)
    questions = [("q-why", "Why is vitamin C lacking in scurvy?", "collagen"),
                 ("q-none", "Who painted the Mona Lisa?", "Leonardo da Vinci"),
                 ("q-plain", NO_NEED, "scurvy")]
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "question": q, "answers": [a]}) + "\n"
                               for i, q, a in questions))
    config = RunConfig(dataset=str(dataset), pipelines=("auto",), dataset_format="triviaqa",
                       models=ModelRoles(generator=BackendSpec(model=str(tiny_model_dir),
                                                               batch_size=4)),
                       retrieval=RetrievalConfig(index=str(tmp_path / "index"), mode="bm25",
                                                 k=2),
                       trust=TrustConfig(enabled=False))
    summaries = run_evaluation(config, tmp_path / "run", progress=False)

    lines = (tmp_path / "run" / "results" / "auto.jsonl").read_text().splitlines()
    records = {r["id"]: r for r in map(json.loads, lines)}
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
