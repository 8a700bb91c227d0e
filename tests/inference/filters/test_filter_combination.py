"""MCF's learned combination (inference/filters/card/combination.py) and its fit
(training/evaluation/combination_fit.py) on synthetic scores: the fit recovers the weights, its
probabilities are calibrated, a filter that adds nothing is dropped and says so, the
calibrated bar keeps every passage above it and never empties a round, the card round-trips,
`filter list` shows it, and eval-filter's default row says "default". No model runs."""

from __future__ import annotations

import json
import math
import random

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.types import Document
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.card.card_file import CARD_FILE
from sieverag.inference.filters.card.combination import (
    FEATURES,
    FILTER_ALONE,
    PRIOR_FEATURES,
    PRIORS_ONLY,
    Combination,
    RoundScores,
    adapter_combination,
    card_combination,
    fit_combination,
    probability_bar,
    round_features,
)
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.metrics.filter_scores import calibration_error, paired_f1_difference
from sieverag.training.evaluation.combination_fit import (
    LabelledRound,
    SelectionRule,
    best_bar,
    measure_combination,
)
from sieverag.training.evaluation.filter_methods import mcf_row_name

FEW_RULES = tuple(SelectionRule(features, 1, 2, None)
                  for features in ("with_filter", "priors_alone"))
"""The leave-one-source-out search over the two feature sets alone (the full search is
test_shift_guard's)."""
TRUE = {"filter_log_odds": 0.6, "filter_z": 0.8, "bm25_z": 0.7, "dense": 3.0, "dense_z": 0.4}
TRUE_BIAS = -3.0


def synthetic_rounds(count: int, seed: int, weights=TRUE, bias=TRUE_BIAS,
                     filter_noise: bool = False) -> list[LabelledRound]:
    """Rounds of 8 passages whose labels are drawn from logistic(bias + weights · features)
    (features from `round_features`), with `filter_noise` the filter's score unrelated."""
    rng = random.Random(seed)
    rounds = []
    for index in range(count):
        relevance = [rng.random() < 0.3 for _ in range(8)]
        scores = RoundScores(
            tuple(rng.gauss(0, 2) if filter_noise else rng.gauss(2.5 if r else -1.5, 2)
                  for r in relevance),
            tuple(max(0.0, rng.gauss(4 if r else 2, 1.5)) for r in relevance),
            tuple(rng.gauss(0.5 if r else 0.3, 0.12) for r in relevance))
        features = round_features(scores)
        vector = [weights.get(f, 0.0) for f in FEATURES]
        labels = tuple(rng.random() < 1 / (1 + math.exp(-(bias + float(row @ vector))))
                       for row in features)
        if filter_noise:  # labels from the priors only
            labels = tuple(relevance)
        rounds.append(LabelledRound(scores, labels, "src-a" if index % 2 else "src-b",
                                    f"q{index}"))
    return rounds


def test_fitting_recovers_the_weights_that_made_the_labels():
    rounds = synthetic_rounds(300, seed=1)
    fitted = fit_combination([r.scores for r in rounds], [r.labels for r in rounds], l2=0.01)
    assert fitted.fitted and fitted.reads_filter()
    for feature, weight in TRUE.items():  # the cosine varies little: its weight, loosely
        assert fitted.weights[feature] == pytest.approx(
            weight, abs=1.0 if feature == "dense" else 0.35), feature
    truth = Combination(weights=TRUE, bias=TRUE_BIAS)
    gaps = [abs(p - q) for r in rounds[:100]
            for p, q in zip(fitted.probabilities(r.scores), truth.probabilities(r.scores),
                            strict=True)]
    assert sum(gaps) / len(gaps) < 0.02


def test_measured_fit_is_calibrated_and_records_the_filters_gain():
    combination = measure_combination(synthetic_rounds(200, seed=2), folds=3)
    fit = combination.report["fit"]
    assert fit["ece"]["platt"] < 0.05 and fit["ece"]["isotonic"] < 0.08
    assert fit["filter_gain_auroc"] > 0.01 and not fit["filter_adds_nothing"]
    assert fit["auroc"]["combination"] >= max(fit["auroc"]["bm25"], fit["auroc"]["dense"])
    assert set(fit["by_source"]) == {"src-a", "src-b"}
    assert 0 < combination.bar < 1 and combination.reads_filter() and fit["questions"] == 200


def test_the_bar_is_chosen_where_the_default_loses_to_retrieval_first():
    # Three "many" questions, one gold passage each: a high bar keeps it alone (F1 1 against
    # retrieval top-2's 0.667). One "few" question with two gold passages, the second at
    # P 0.42: only a bar ≤ 0.42 keeps both (F1 1, as retrieval top-2), a higher one loses.
    ranked = RoundScores((0.0,) * 3, (3.0, 2.0, 1.0), (0.9, 0.5, 0.1))
    many = [LabelledRound(ranked, (True, False, False), "many", f"m{i}") for i in range(3)]
    few = [LabelledRound(ranked, (True, True, False), "few", "f0")]
    probabilities = [[0.9, 0.45, 0.1]] * 3 + [[0.9, 0.42, 0.1]]
    bar, f1, margin = best_bar([*many, *few], probabilities, top_k=2)
    # The best mean F1 (0.917, bars above 0.45) loses by 0.333 on "few": the rule takes the
    # highest bar that loses nowhere.
    assert (bar, margin) == (0.4, pytest.approx(0.0)) and f1 == pytest.approx(0.75)
    # With one source it is the bar with the best F1 (the highest on a tie).
    bar, f1, margin = best_bar(many, probabilities[:3], top_k=2)
    assert (bar, f1, margin) == (0.95, pytest.approx(1.0), pytest.approx(1 / 3))


def test_a_filter_that_adds_nothing_is_left_out_and_says_so():
    combination = measure_combination(synthetic_rounds(100, seed=3, filter_noise=True),
                                      folds=3, min_gain=0.005)
    fit = combination.report["fit"]
    assert fit["filter_adds_nothing"] and fit["filter_gain_auroc"] < 0.005
    assert not combination.reads_filter()
    assert combination.weights["bm25_z"] > 0
    from sieverag.inference.filters.card.filter_card import describe_combination

    assert "the filter adds nothing" in describe_combination(combination)


def test_calibration_error_is_zero_when_probabilities_match_frequencies():
    labels = [True] * 3 + [False] * 7 + [True] * 8 + [False] * 2
    assert calibration_error(labels, [0.3] * 10 + [0.8] * 10) == pytest.approx(0.0)
    assert calibration_error([True, False], [0.0, 1.0]) == pytest.approx(1.0)
    assert calibration_error([], []) is None


def test_probability_bar_keeps_every_passage_above_it_and_at_least_min_keep():
    logits = [2.0, 1.5, 1.2, -3.0, -4.0]
    bar = probability_bar(logits, 0.5, 1)
    assert [v >= bar for v in logits] == [True, True, True, False, False]
    low = [-3.0, -5.0, -4.0]
    assert [v >= probability_bar(low, 0.5, 1) for v in low] == [True, False, False]
    assert not any(v >= probability_bar(low, 0.5, 0) for v in low)  # told to: may empty
    assert sum(v >= probability_bar(low, 0.5, 2) for v in low) == 2


def _fake_priors(question, texts, model):
    return [float(len(t)) for t in texts], [0.5 if "gold" in t else 0.01 * len(t) for t in texts]


def _mcf(combination, **config):
    backend = ScriptedBackend(labels=lambda text: {"Yes": -0.1, "No": -2.3} if "gold" in text
                              else {"Yes": -3.0, "No": -0.05})
    return MultiGranularFilter(backend, MCFConfig(**config), combination, priors=_fake_priors)


FITTED = Combination(weights={"filter_log_odds": 1.0, "dense": 2.0}, bias=-1.0, fitted=True,
                     bar=0.5)


def test_mcf_default_keeps_all_answering_passages_and_never_empties_a_round():
    many = [Document(id=str(i), text="gold passage" + "s" * i) for i in range(3)] + \
        [Document(id=f"n{i}", text=f"noise {i}") for i in range(4)]
    result = _mcf(FITTED).select("q?", many)
    assert {s.document.id for s in result.kept} == {"0", "1", "2"}
    assert all(0 < s.details["p_relevant"] < 1 for s in result.scored)
    noise = [Document(id=f"n{i}", text="noise" + "s" * i) for i in range(4)]
    assert len(_mcf(FITTED).select("q?", noise).kept) == 1
    assert _mcf(FITTED, min_keep=0).select("q?", noise).kept == ()
    # Without a fitted combination the calibrated bar falls back on the top_k bar.
    assert len(_mcf(PRIORS_ONLY).select("q?", many).kept) == 2
    # Nor does a score that is not the combination: the filter alone, or the BM25 fusion.
    for weight in (0.0, 1.0):
        result = _mcf(FITTED, lexical_weight=weight).select("q?", many)
        assert result.threshold == sorted((s.score for s in result.scored), reverse=True)[1]


def test_the_card_round_trips_and_a_card_without_a_fit_ranks_by_the_filter_alone(tmp_path):
    combination = measure_combination(synthetic_rounds(60, seed=4), folds=3)
    (tmp_path / CARD_FILE).write_text(json.dumps(
        {"base_model": "tiny", "combination": combination.as_card()}), encoding="utf-8")
    read = adapter_combination(tmp_path)
    assert read.weights == pytest.approx(dict(combination.weights))
    assert (read.bias, read.bar, read.fitted) == (combination.bias, combination.bar, True)
    assert read.report["fit"]["questions"] == 60
    # A trained filter's card without a fit: the filter's own s (P(Yes) normalised); no card
    # at all: retrieval's fusion.
    assert card_combination({"base_model": "tiny"}) == FILTER_ALONE
    assert card_combination(None) is PRIORS_ONLY and adapter_combination(None) is PRIORS_ONLY
    assert adapter_combination(tmp_path / "no-card") is PRIORS_ONLY
    with pytest.raises(AdapterError, match="malformed.*fit-combination"):
        card_combination({"combination": {"weights": {"magic": 1.0}}})


def test_a_card_without_a_fit_ranks_by_the_filters_own_score_where_no_card_ranks_by_retrieval():
    # The filter finds the short passages relevant; BM25 and dense (_fake_priors: by length)
    # the long ones.
    documents = [Document(id=str(i), text="passage" + "s" * i) for i in range(4)]
    backend = ScriptedBackend(labels=lambda text: {"Yes": -0.2 * text.count("s"), "No": -1.5})
    by_card = MultiGranularFilter(backend, MCFConfig(), card_combination({"base_model": "tiny"}),
                                  priors=_fake_priors)
    by_retrieval = MultiGranularFilter(backend, MCFConfig(), PRIORS_ONLY, priors=_fake_priors)
    filter_kept = [s.document.id for s in by_card.select("q?", documents).kept]
    assert filter_kept == ["0", "1"]  # unfitted: the top_k bar, on the filter's own order
    assert [s.document.id for s in by_retrieval.select("q?", documents).kept] == ["3", "2"]
    # Its P(relevant) is the filter's P(Yes) normalised over Yes and No.
    for scored in by_card.chunk_stage("q?", documents).scored:
        assert scored.details["p_relevant"] == pytest.approx(scored.details["p_yes"], abs=1e-4)


def test_every_start_says_which_score_ranks_and_why(tmp_path):
    from sieverag.inference.filters.card.filter_card import (
        RETRIEVAL_ONLY_SOURCE,
        FilterCard,
        ranking_statement,
    )

    fitted = measure_combination(synthetic_rounds(60, seed=4), folds=3)
    useless = measure_combination(synthetic_rounds(60, seed=6, filter_noise=True), folds=3,
                                  min_gain=0.05)
    card = {"base_model": "tiny", "combination": fitted.as_card()}
    where = f"{tmp_path}/{CARD_FILE}"
    said = {
        "fitted": FilterCard(card, where, str(tmp_path)).ranking_statement(MCFConfig()),
        "priors by name": FilterCard(card, where, str(tmp_path)).ranking_statement(
            MCFConfig(combination="priors_only")),
        "unfitted card": FilterCard({"base_model": "tiny"}, where,
                                    str(tmp_path)).ranking_statement(MCFConfig()),
        "retrieval by name": FilterCard(None, RETRIEVAL_ONLY_SOURCE).ranking_statement(
            MCFConfig()),
        "no card": FilterCard(None, where, str(tmp_path)).ranking_statement(MCFConfig()),
        "s alone": FilterCard(card, where).ranking_statement(MCFConfig(lexical_weight=0.0)),
        "fused": FilterCard(card, where).ranking_statement(
            MCFConfig(bar="top_k", lexical_weight=1.0)),
        "fit left the filter out": ranking_statement(useless, where),
    }
    assert all(line.startswith("MCF ranks by ") and "\n" not in line for line in said.values())
    assert "combined with BM25 and dense" in said["fitted"] and "60 question(s)" in said["fitted"]
    assert "priors-only fit" in said["priors by name"]
    assert "--mcf.combination priors_only" in said["priors by name"]
    assert "the filter's own score, its P(Yes)" in said["unfitted card"]
    assert f"{where} holds no fitted combination" in said["unfitted card"]
    assert "fit-combination" in said["unfitted card"]
    assert "BM25 + dense alone" in said["retrieval by name"]
    assert "models.filter_card=retrieval-only asks for it" in said["retrieval by name"]
    assert f"the filter adapter {tmp_path} has no {CARD_FILE}" in said["no card"]
    assert "the filter's own score s" in said["s alone"]
    assert "z(s) + 1·z(BM25)" in said["fused"]
    assert "BM25 + dense alone" in said["fit left the filter out"]
    assert "left the filter's score out" in said["fit left the filter out"]


def test_filter_list_shows_the_weights_and_when_the_filter_adds_nothing(tmp_path, monkeypatch,
                                                                          capsys):
    from sieverag.cli import main
    from sieverag.inference.filters import adapter_store

    shipped = tmp_path / "shipped"
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(adapter_store, "SHIPPED_DIR", shipped)
    cards = {"useful": measure_combination(synthetic_rounds(60, seed=5), folds=3),
             "useless": measure_combination(synthetic_rounds(60, seed=6, filter_noise=True),
                                            folds=3, min_gain=0.05)}
    for name, combination in [*cards.items(), ("bare", None)]:
        folder = shipped / name
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}", encoding="utf-8")
        card = {"base_model": "tiny"}
        if combination is not None:
            card["combination"] = combination.as_card()
        (folder / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    assert main(["filter", "list"]) == 0
    out = capsys.readouterr().out
    bare = out.split("bare (shipped): ")[1].split("\n  ")[0]
    useful = out.split("useful (shipped): ")[1].split("useless (shipped)")[0]
    assert "filter_log_odds" in useful and "with the filter" in useful
    assert "adds nothing" not in useful and "not fitted" in bare
    assert "the filter's own score" in bare
    assert "the filter adds nothing" in out.split("useless (shipped): ")[1].split("\nA name")[0]


def test_amber_default_row_is_labelled_default():
    assert mcf_row_name(MCFConfig()).startswith("MCF default:")
    assert "default" in mcf_row_name(MCFConfig(sentence_stage=True))
    assert "default" not in mcf_row_name(MCFConfig(bar="top_k"))
    assert mcf_row_name(MCFConfig(bar="top_k")) == "MCF top_k=2 + combination"


def test_a_served_filter_reads_the_card_of_the_filter_it_is_served_as(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Served under its own name (`--adapters smollm2-filter=smollm2-filter`) on a server
    that shows no card, the filter brings its card's fitted combination to MCF, as
    in-process; under another name with no card named, it is one error naming both
    remedies."""
    from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, find_adapter
    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    monkeypatch.setattr("sieverag.inference.filters.role_card.served_card",
                        lambda spec: None)
    shipped = str(find_adapter(DEFAULT_FILTER_NAME).path)
    served = BackendSpec(endpoint="http://127.0.0.1:8000/v1", model=DEFAULT_FILTER_NAME)
    assert filter_card(served).folder == shipped
    assert filter_card(served).combination == adapter_combination(shipped)
    assert adapter_combination(shipped).fitted
    other = BackendSpec(endpoint="http://127.0.0.1:8000/v1", model="filter")
    with pytest.raises(ConfigError, match="has no filter card") as refused:
        filter_card(other)
    assert "--models.filter-card NAME_OR_FOLDER" in str(refused.value)
    assert "--models.filter-card retrieval-only" in str(refused.value)
    assert filter_card(other, "retrieval-only").combination is PRIORS_ONLY
    assert filter_card(other, DEFAULT_FILTER_NAME).combination == adapter_combination(shipped)
    assert filter_card(other, shipped).folder == shipped
    assert filter_card(BackendSpec(adapter=shipped)).folder == shipped


def test_a_named_card_must_be_a_filter_with_one(tmp_path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    from sieverag.inference.agents.roles import ModelRoles
    from sieverag.inference.filters.adapter_files import CONFIG_FILE
    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    monkeypatch.setattr("sieverag.inference.filters.role_card.served_card",
                        lambda spec: None)
    served = BackendSpec(endpoint="http://127.0.0.1:8000/v1", model="filter")
    with pytest.raises(ConfigError, match="models.filter_card: adapter 'no-such-filter'"):
        filter_card(served, "no-such-filter")
    (tmp_path / CONFIG_FILE).write_text("{}")
    with pytest.raises(ConfigError, match=f"holds no {CARD_FILE}"):
        filter_card(served, str(tmp_path))
    # An in-process filter's card is its adapter's: naming another is refused.
    with pytest.raises(ConfigError, match="names the card of a served filter"):
        ModelRoles(filter_card="smollm2-filter")
    assert ModelRoles(filter=served, filter_card="retrieval-only").filter_card == "retrieval-only"


def test_a_server_that_cannot_be_reached_is_named() -> None:
    import socket

    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    served = BackendSpec(endpoint=f"http://127.0.0.1:{port}/v1", model="filter")
    with pytest.raises(ConfigError, match=f"127.0.0.1:{port}/v1/models"):
        filter_card(served)


def test_the_card_is_asked_for_with_the_key_the_role_sends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model list is read with the role's own key (`openai_backend.server_key`): a key
    variable named but unset is refused by name before anything is sent."""
    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    monkeypatch.delenv("SIEVERAG_TEST_NO_SUCH_KEY", raising=False)
    served = BackendSpec(endpoint="http://127.0.0.1:9/v1", model="filter",
                         api_key_env="SIEVERAG_TEST_NO_SUCH_KEY")
    with pytest.raises(ConfigError, match="SIEVERAG_TEST_NO_SUCH_KEY .api_key_env. is not set"):
        filter_card(served)


def test_paired_f1_difference_counts_wins_losses_and_brackets_the_mean():
    gold = [{"a"}, {"a", "b"}, {"c"}, {"d"}, set()]
    better = [({"a"}, gold[0]), ({"a", "b"}, gold[1]), ({"c"}, gold[2]), ({"x"}, gold[3]),
              ({"y"}, gold[4])]
    worse = [({"a", "z"}, gold[0]), ({"a"}, gold[1]), ({"c"}, gold[2]), ({"d"}, gold[3]),
             ({"y"}, gold[4])]
    paired = paired_f1_difference(better, worse)
    # Per question (the one without gold left out): +1/3, +1/3, 0, −1.
    assert paired["questions"] == 4 and (paired["wins"], paired["losses"]) == (2, 1)
    assert paired["difference"] == pytest.approx((1 / 3 + 1 / 3 + 0 - 1) / 4)
    low, high = paired["interval95"]
    assert -1 <= low <= paired["difference"] <= high <= 1 / 3 + 1e-9
    assert paired_f1_difference(better, better)["interval95"] == [0.0, 0.0]
    assert paired_f1_difference([({"y"}, set())], [(set(), set())]) is None
    with pytest.raises(ValueError, match="same questions"):
        paired_f1_difference(better[:1], worse[1:2])


def test_leaving_each_source_out_measures_what_an_unseen_source_gets():
    from sieverag.training.evaluation.combination_fit import (
        leave_one_source_out,
        worst_left_out_margin,
    )

    rounds = synthetic_rounds(120, seed=7)
    table = leave_one_source_out(rounds, candidates=FEW_RULES)
    assert set(table) == {"src-a", "src-b"}
    for source, row in table.items():
        held = [r for r in rounds if r.source == source]
        assert row["questions"] == len(held) == 60
        for rule in ("with_filter", "priors_alone"):
            cell = row[rule]
            assert cell["margin"] == pytest.approx(cell["f1"] - row["retrieval_top_k_f1"])
            assert 0 < cell["bar"] < 1 and 0.5 < cell["auroc"] <= 1
    # Labels drawn with the filter's score in them: with it, the worst left-out source is
    # better off than with the priors alone.
    assert worst_left_out_margin(table, "with_filter") > worst_left_out_margin(
        table, "priors_alone")
    combination = measure_combination(rounds, folds=3, by_left_out_source=True,
                                      candidates=FEW_RULES)
    assert combination.reads_filter()
    left_out = combination.report["fit"]["leave_one_source_out"]
    assert {s: {k: v for k, v in row.items() if k != "default"}
            for s, row in left_out.items()} == table
    assert all(row["default"]["rule"] == row["with_filter"]["rule"] for row in left_out.values())
    from sieverag.inference.filters.card.filter_card import describe_combination

    assert "src-a left out of the fit (60 q" in describe_combination(combination)
    with pytest.raises(DatasetError, match="at least 2 sources"):
        leave_one_source_out([r for r in rounds if r.source == "src-a"])


def test_a_filter_that_only_helps_the_sources_it_was_fitted_on_is_left_out():
    # The filter's score carries the labels on src-b only; fitted on src-b it moves src-a's
    # verdicts by noise, so src-a left out loses with it: leaving sources out drops it.
    from sieverag.training.evaluation.combination_fit import (
        leave_one_source_out,
        worst_left_out_margin,
    )

    helpful = [r for r in synthetic_rounds(160, seed=8) if r.source == "src-b"]
    noisy = [r for r in synthetic_rounds(160, seed=9, filter_noise=True) if r.source == "src-a"]
    rounds = helpful + noisy
    table = leave_one_source_out(rounds, candidates=FEW_RULES)
    assert table["src-a"]["with_filter"]["margin"] < 0 < table["src-a"]["priors_alone"]["margin"]
    assert worst_left_out_margin(table, "with_filter") < worst_left_out_margin(table,
                                                                             "priors_alone")
    pooled = measure_combination(rounds, folds=3, min_gain=0.0)
    assert pooled.reads_filter()  # pooled cross-validation alone keeps it
    combination = measure_combination(rounds, folds=3, min_gain=0.0, by_left_out_source=True,
                                      candidates=FEW_RULES)
    assert not combination.reads_filter()
    assert combination.report["fit"]["filter_adds_nothing"]


def test_mcf_runs_the_cards_priors_only_fit_by_name(tmp_path):
    combination = measure_combination(synthetic_rounds(80, seed=10), folds=3)
    assert combination.reads_filter()
    (tmp_path / CARD_FILE).write_text(json.dumps(
        {"base_model": "tiny", "combination": combination.as_card()}), encoding="utf-8")
    read = adapter_combination(tmp_path)
    priors = read.priors_only_fit()
    assert priors.fitted and not priors.reads_filter() and 0 < priors.bar < 1
    assert set(w for w, v in priors.weights.items() if v) <= set(PRIOR_FEATURES)
    backend = ScriptedBackend(labels=lambda text: {"Yes": -0.1, "No": -2.3})
    documents = [Document(id=str(i), text=f"passage {i} about bridges") for i in range(4)]
    by_name = MultiGranularFilter(backend, MCFConfig(combination="priors_only"), read)
    assert by_name.combination.weights == priors.weights
    result = by_name.select("Who built the bridge?", documents)
    # The priors-only fit does not read the filter: no chunk is sent to it, s is unknown.
    assert backend.calls == [] and not by_name.combination.reads_filter(
        by_name.config.score_rule, by_name.config.always_score_chunks)
    assert all(s.details["filter_score"] is None and s.details["p_yes"] is None
               for s in result.scored)
    probabilities = priors.probabilities(RoundScores(
        (0.0,) * len(result.scored),
        *(tuple(s.details[k] for s in result.scored) for k in ("bm25", "dense"))))
    # The details hold BM25 and dense rounded to 4 decimals: the probabilities agree to 1e-3.
    assert [s.details["p_relevant"] for s in result.scored] == pytest.approx(probabilities,
                                                                              abs=1e-3)
    with pytest.raises(ConfigError, match="priors_only.*no priors-only fit"):
        MultiGranularFilter(backend, MCFConfig(combination="priors_only"), PRIORS_ONLY)
