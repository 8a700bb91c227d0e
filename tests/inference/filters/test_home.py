"""The filter where it knows the text (issue 65): the home test on retrieval's features, MCF
ranking a home round by the home combination over the priors' best passages only and every
other round by the away default, saying which and why; the card keeping the home rule; the
home fit choosing its bar so that no away source loses. No model runs: the filter is scripted
and the embeddings are small fixed vectors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.types import Document, Example
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.card.combination import (
    Combination,
    RoundScores,
    card_combination,
    card_home_rule,
    home_section,
)
from sieverag.inference.filters.card.filter_card import describe_home
from sieverag.inference.filters.home import (
    HomeRule,
    HomeTest,
    dataset_decision,
    home_features,
    home_reading,
)
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.ranking import rank_by_filter
from sieverag.training.evaluation.combination_fit import LabelledRound
from sieverag.training.evaluation.home_fit import (
    AwayRound,
    HomeRound,
    fit_home_rule,
    kept_at_home,
    read_round,
)

HOME_WORD = "castle"  # a round is "home" when its question names it (the fixed embeddings)


def vectors(question: str, texts, model: str) -> np.ndarray:
    """Unit vectors of 2 dimensions: [1, 0] for text about castles, [0, 1] otherwise."""
    rows = [[1.0, 0.0] if HOME_WORD in t else [0.0, 1.0] for t in [question, *texts]]
    return np.asarray(rows)


def priors(question: str, texts, model: str):
    """BM25 and dense falling with the position: passage 0 is retrieval's best."""
    return ([float(len(texts) - i) for i in range(len(texts))],
            [0.1 * (len(texts) - i) for i in range(len(texts))])


AWAY = Combination(weights={"bm25_z": 1.0, "dense_z": 1.0}, bias=-2.0, fitted=True, bar=0.5,
                   min_keep=1, top_k=2)
HOME = Combination(weights={"filter_log_odds": 1.0}, bias=0.0, fitted=True, bar=0.5,
                   min_keep=1, top_k=2)
# P(home) = σ(4·(x_q − y_q)): 0.98 for a castle question, 0.02 otherwise; bar 0.9.
TEST = HomeTest((4.0, -4.0, 0.0, 0.0, 0.0), 0.0, 0.9)
RULE = HomeRule(TEST, HOME, read=3, sources=("castles",))


def filter_says(text: str) -> dict[str, float]:
    """The filter finds passages 1 and 4 relevant, the rest not."""
    relevant = any(f"passage {i}" in text for i in (1, 4))
    return {"Yes": -0.1 if relevant else -4.0, "No": -4.0 if relevant else -0.1}


def documents(about: str) -> list[Document]:
    return [Document(id=str(i), text=f"passage {i} about {about}") for i in range(8)]


def test_home_reading_is_the_priors_best():
    assert home_reading([1.0, 5.0, 3.0, 4.0], [0.1, 0.5, 0.3, 0.4], 2) == [1, 3]
    assert home_reading([1.0, 2.0], [0.1, 0.2], 5) == [0, 1]


def test_a_home_round_reads_the_priors_best_and_ranks_by_the_home_combination():
    backend = ScriptedBackend(labels=filter_says)
    combination = Combination(**{**AWAY.__dict__, "home": RULE})
    mcf = MultiGranularFilter(backend, MCFConfig(), combination, priors=priors,
                              vectors=vectors)
    result = mcf.select(f"which {HOME_WORD}?", documents(HOME_WORD))
    asked = [text for agent, text in backend.calls if agent == "filter_chunk"]
    assert len(asked) == 3  # the priors' best 3 of 8, no more
    assert all(f"passage {i}" in " ".join(asked) for i in (0, 1, 2))
    assert result.rule == "home_calibrated"
    assert "P(home) 0.98" in result.rule_reason and ">= 0.9" in result.rule_reason
    assert "read the priors' best 3 of 8" in result.rule_reason
    # The filter finds 1 and 4 relevant; it read 1 (kept), not 4 (the priors rank it 5th).
    assert [s.document.id for s in result.kept] == ["1"]
    unread = [s for s in result.scored if s.details["filter_score"] is None]
    assert [s.document.id for s in unread] == ["3", "4", "5", "6", "7"]
    assert not any(s.kept for s in unread)


def test_an_away_round_ranks_by_the_away_default_without_calling_the_filter():
    backend = ScriptedBackend(labels=filter_says)
    combination = Combination(**{**AWAY.__dict__, "home": RULE})
    mcf = MultiGranularFilter(backend, MCFConfig(), combination, priors=priors,
                              vectors=vectors)
    result = mcf.select("which river?", documents("rivers"))
    assert not backend.calls  # the away default gives the filter no weight
    assert result.rule == "calibrated"
    assert result.rule_reason.startswith("away: P(home) 0.018 < 0.9")
    forced = MultiGranularFilter(backend, MCFConfig(home="home"), combination, priors=priors,
                                 vectors=vectors).select("which river?", documents("rivers"))
    assert forced.rule == "home_calibrated" and "mcf.home home" in forced.rule_reason
    # The passages the home filter did not read carry the away combination's P(relevant),
    # called calibrated as the away combination is on the round.
    unread = [s for s in forced.scored if s.details["p_yes"] is None]
    assert unread and {s.details["calibrated"] for s in unread} == {AWAY.fitted}
    never = MultiGranularFilter(ScriptedBackend(labels=filter_says), MCFConfig(home="away"),
                                combination, priors=priors, vectors=vectors)
    assert never.select(f"which {HOME_WORD}?", documents(HOME_WORD)).rule == "calibrated"


def test_rerank_says_which_rule_ranked():
    backend = ScriptedBackend(labels=filter_says)
    combination = Combination(**{**AWAY.__dict__, "home": RULE})
    ranked = rank_by_filter(backend, MCFConfig(home="home"), "q", [d for d in documents("x")],
                            combination)
    assert {r.bar_rule.split(":")[0] for r in ranked} == {"home_calibrated"}
    assert all(0.0 <= r.relevance_score <= 1.0 for r in ranked)


def test_the_card_keeps_the_home_rule_and_refuses_a_malformed_one():
    card = {"base_model": "tiny", "combination": AWAY.as_card(),
            "home": home_section(HomeRule(TEST, HOME, 3, ("castles",),
                                          {"fit": {"questions": 40}}))}
    read = card_combination(json.loads(json.dumps(card)))
    assert read.home is not None
    assert read.home.test == TEST and read.home.read == 3 and read.home.sources == ("castles",)
    assert read.home.combination.weights["filter_log_odds"] == 1.0
    assert read.home.report == {"fit": {"questions": 40}}
    assert card_home_rule({"base_model": "tiny"}) is None
    with pytest.raises(AdapterError, match="'home' section is malformed"):
        card_home_rule({"home": {"test": {"bias": 0.0}}}, "card.json")
    with pytest.raises(ValueError, match="reads 5 features"):
        TEST.probability_of(np.zeros(3))


def test_home_features_are_question_mean_passage_and_length():
    features = home_features("two words", np.asarray([[1.0, 0.0], [0.0, 1.0], [0.0, 0.5]]))
    assert features == pytest.approx([1.0, 0.0, 0.0, 0.75, np.log1p(2)])


# ----- the fit ------------------------------------------------------------------------------


def _example(index: int, about: str, gold: set[int]) -> Example:
    return Example(id=f"{about}{index}", question=f"q{index} about {about}", answers=("a",),
                   documents=tuple(Document(id=f"{about}{index}/{i}",
                                            text=f"passage {i} on {about} {index}",
                                            is_gold=i in gold) for i in range(6)))


def _scored(example: Example, rng: random.Random, filter_reads: bool) -> LabelledRound:
    """The filter tells gold apart where `filter_reads`; BM25 and dense only weakly."""
    gold = [bool(d.is_gold) for d in example.documents]
    s = tuple(rng.gauss(3.0 if g else -3.0, 1.0) if filter_reads else rng.gauss(0, 1)
              for g in gold)
    bm25 = tuple(rng.gauss(2.0 if g else 1.6, 0.6) for g in gold)
    dense = tuple(rng.gauss(0.45 if g else 0.40, 0.05) for g in gold)
    return LabelledRound(RoundScores(s, bm25, dense), tuple(gold), "x", example.id)


def test_the_home_fit_uses_the_filter_at_home_and_keeps_every_away_source_whole(monkeypatch):
    monkeypatch.setattr("sieverag.training.evaluation.home_fit.round_vectors", vectors)
    monkeypatch.setattr("sieverag.training.evaluation.home_fit.passage_priors",
                        lambda q, texts, m: (tuple(float(len(t)) for t in texts),
                                             tuple(0.4 for _ in texts)))
    rng = random.Random(3)
    home = []
    for i in range(40):
        example = _example(i, HOME_WORD, {rng.randrange(3), 3 + rng.randrange(3)})
        home.append(HomeRound(example, _scored(example, rng, filter_reads=True)))
    scored_away: list[str] = []
    away = []
    for source in ("rivers", "songs"):
        for i in range(30):
            example = _example(i, source, {rng.randrange(6)})
            features = home_features(example.question, vectors(
                example.question, [d.text for d in example.documents], ""))
            round_ = _scored(example, rng, filter_reads=False)

            def score(e, r=round_):
                scored_away.append(e.id)
                return r

            away.append(AwayRound(source, features, example, score))
    rule = fit_home_rule(home, away, AWAY, sources=(HOME_WORD,), read=4, folds=4)
    fit = rule.report["fit"]
    assert rule.combination.reads_filter() and rule.read == 4
    chosen = next(row for row in fit["bars"] if row["bar"] == rule.test.bar)
    assert chosen["meets"] and all(row["f1_loss"] <= 1e-9 for row in chosen["sources"].values())
    assert chosen["home"]["f1"] > chosen["home"]["f1_away_only"]
    assert fit["test_auroc_out_of_fit"] > 0.9
    # Away rounds are scored only where the test would call them home: here, none.
    assert scored_away == []
    reading = read_round(home[0].example, home[0].scored, 4)
    assert kept_at_home(rule.combination, reading) <= set(reading.read)
    assert "home: castle" in describe_home(rule)


def test_a_dataset_is_decided_as_a_whole_by_its_mean_p_home(capsys):
    from sieverag.training.evaluation.filter_methods import dataset_modes

    rule = HomeRule(HomeTest(TEST.weights, 0.0, 0.9, dataset_bar=0.6), HOME, 3, ("castles",))
    castles = [(f"q{i} {HOME_WORD}", [f"a {HOME_WORD}"]) for i in range(3)]
    mixed = [*castles[:1], ("q about rivers", ["rivers"]), ("q about songs", ["songs"])]
    mode, line = dataset_decision(rule, castles, "castles", vectors)
    assert mode == "home" and "mean P(home) 0.982 >= 0.6 over 3 questions" in line
    mode, line = dataset_decision(rule, mixed, "mixed", vectors)  # mean 0.339: each round alone
    assert mode == "auto" and "< 0.6" in line
    assert dataset_decision(RULE, castles, "castles", vectors)[0] == "auto"  # no dataset bar

    examples = [Example(id=str(i), question="q", answers=("a",), documents=(
        Document(id=f"{i}/0", text="t"),), metadata={"dataset": "s"}) for i in range(2)]
    combination = Combination(**{**AWAY.__dict__, "home": rule})
    forced = dataset_modes(examples, MCFConfig(home="away"), combination)
    assert forced == {"s": "away"} and capsys.readouterr().out == ""  # nothing to decide


def test_eval_decides_a_dataset_of_the_filters_home_text_once_for_every_round():
    """`sieverag eval` on a dataset with its own passages (`compose.with_dataset_home`, the
    rule eval-filter's `dataset_modes` also follows: `mcf.dataset_home`): a dataset of the
    filter's home text runs every round with mcf.home home, and says why; a mixed one, a
    run that retrieves its passages, or an mcf.home set by hand is left as it is."""
    from types import SimpleNamespace

    from sieverag.inference.composition.compose import RunPlan, with_dataset_home
    from sieverag.inference.composition.config import RunConfig
    from sieverag.inference.filters.mcf import dataset_home
    from sieverag.inference.pipelines.pipeline_registry import PipelineSettings

    rule = HomeRule(HomeTest(TEST.weights, 0.0, 0.9, dataset_bar=0.6), HOME, 3, ("castles",))
    combination = Combination(**{**AWAY.__dict__, "home": rule})

    def example(number: int, about: str) -> Example:
        return Example(id=str(number), question=f"which {about}?", answers=("a",),
                       documents=tuple(documents(about)))

    castles = [example(i, HOME_WORD) for i in range(3)]
    mixed = [castles[0], example(7, "river"), example(8, "song")]

    def plan(given: bool, settings: PipelineSettings | None = None) -> RunPlan:
        made = RunPlan(config=RunConfig(dataset="castles.jsonl"), pipelines=frozenset({"mcf"}),
                       settings=settings or PipelineSettings(), roles=frozenset({"filter"}),
                       role_specs={}, grader=None, reads_given_documents=given)
        made.__dict__["filter_card"] = SimpleNamespace(combination=combination)
        return made

    decided, line = with_dataset_home(plan(True), castles, "castles", vectors)
    assert decided.settings(MCFConfig).home == "home"
    assert line is not None and "mean P(home) 0.982 >= 0.6 over 3 questions" in line
    kept, line = with_dataset_home(plan(True), mixed, "mixed", vectors)
    assert kept.settings(MCFConfig).home == "auto" and "< 0.6" in line
    retrieved = plan(False)
    assert with_dataset_home(retrieved, castles, "castles", vectors) == (retrieved, None)
    by_hand = plan(True, PipelineSettings([MCFConfig(home="away")]))
    assert with_dataset_home(by_hand, castles, "castles", vectors) == (by_hand, None)
    # The filter's own score, not the card's combination, ranks: no home rule applies.
    rounds = [(e.question, e.documents) for e in castles]
    assert dataset_home(MCFConfig(lexical_weight=1.0), combination, rounds, "castles",
                        vectors) == ("auto", None)
