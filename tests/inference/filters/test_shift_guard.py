"""The default chosen leave-one-source-out and the bar that knows when it does not know
(issue 53): the shift guard's ranges and findings, `round_bar`'s two rules, MCF and the rerank
results saying which rule decided, the rule search choosing by the worst left-out source, the
card keeping every setting, and the scored rounds kept across runs. No model runs."""

from __future__ import annotations

import json

import pytest
from fake_backend import ScriptedBackend
from test_filter_combination import synthetic_rounds

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.combination import (
    Combination,
    RoundScores,
    ShiftGuard,
    card_combination,
    round_bar,
    round_statistics,
)
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.ranking import rank_by_filter
from sieverag.training.evaluation.combination_fit import (
    TIE_MARGIN,
    LabelledRound,
    SelectionRule,
    best_rule,
    fit_rule,
    measure_combination,
    measured_on,
    rule_search,
    score_rounds,
    worst_margin,
)

SMALL = (SelectionRule("priors_alone", 1, 2, None), SelectionRule("priors_alone", 1, 3, 0.05),
         SelectionRule("with_filter", 1, 2, None), SelectionRule("with_filter", 2, 2, None))


def test_the_guard_flags_what_lies_outside_the_fitting_rounds():
    rows = [{"passages": 8.0, "dense_mean": 0.3 + 0.001 * i, "dense_spread": 0.1,
             "agreement": 0.5, "best_p": 0.8} for i in range(100)]
    guard = ShiftGuard.fit(rows, level=0.05)
    lo, hi = guard.ranges["dense_mean"]
    assert lo == pytest.approx(0.3 + 0.001 * 4.95) and hi == pytest.approx(0.3 + 0.001 * 94.05)
    assert guard.unlike(rows[50]) == []
    found = guard.unlike({**rows[50], "passages": 20.0, "best_p": 0.1})
    assert [f.split()[0] for f in found] == ["passages", "best_p"]
    assert ShiftGuard.from_card(json.loads(json.dumps(guard.as_card()))) == guard
    with pytest.raises(ValueError, match="unknown shift statistics"):
        ShiftGuard.from_card({"level": 0.05, "ranges": {"moon_phase": [0, 1]}})


def test_round_statistics_read_size_spread_agreement_and_best_p():
    scores = RoundScores((0.0,) * 4, (4.0, 3.0, 2.0, 1.0), (0.1, 0.2, 0.3, 0.4))
    stats = round_statistics(scores, [0.1, 0.9, 0.2, 0.3])
    assert stats["passages"] == 4 and stats["best_p"] == 0.9
    assert stats["dense_mean"] == pytest.approx(0.25)
    assert stats["agreement"] == pytest.approx(-1.0)  # BM25 and dense order them oppositely
    assert round_statistics(RoundScores((0.0,), (1.0,), (0.5,)), [0.5])["agreement"] == 1.0


def test_a_round_unlike_the_fitting_rounds_keeps_at_least_retrievals_top_k():
    logits = [2.0, -1.0, -1.5, -3.0, -4.0, -5.0]  # P ≥ 0.5 keeps one
    calibrated = round_bar(logits, 0.5, 1, 3)
    assert calibrated.rule == "calibrated" and calibrated.bar == 0.0
    guarded = round_bar(logits, 0.5, 1, 3, unlike=["passages 20 (fitted 6..10)"])
    assert guarded.rule == "shift_guard" and guarded.bar == -1.5
    assert "passages 20" in guarded.reason and "top 3" in guarded.reason
    # A bar that already keeps the top k needs no guard: the calibrated rule decided.
    wide = round_bar([2.0, 1.5, 1.0, -3.0], 0.5, 1, 3, unlike=["best_p 0.9 (fitted 0.1..0.8)"])
    assert wide.rule == "calibrated" and "anyway" in wide.reason


@pytest.mark.parametrize(("passages", "kept"), [(1, 1), (2, 1), (3, 1), (4, 2), (10, 3)])
def test_the_guard_keeps_at_most_half_of_a_small_round(passages, kept):
    # Every passage below the calibrated bar; the round unlike the fitting rounds. A round of
    # two keeps its best, not also a passage the combination scores at P 0.007.
    logits = [-1.0 - i for i in range(passages)]
    decided = round_bar(logits, 0.9, 1, 3, unlike=["passages 2 (fitted 6..10)"])
    assert sum(v >= decided.bar for v in logits) == kept
    assert f"top {kept} kept" in decided.reason or decided.rule == "calibrated"


def _guarded_combination() -> Combination:
    """Priors alone, fitted on rounds of 6 passages: a round of 10 is unlike them."""
    guard = ShiftGuard({"passages": (6.0, 6.0), "dense_mean": (-1.0, 1.0),
                        "dense_spread": (0.0, 1.0), "agreement": (-1.0, 1.0),
                        "best_p": (0.0, 1.0)}, 0.05)
    return Combination(weights={"bm25_z": 1.0, "dense_z": 1.0}, bias=-6.0, fitted=True,
                       bar=0.5, min_keep=1, top_k=3, guard=guard)


def _priors(question, texts, model):
    return [float(len(texts) - i) for i in range(len(texts))], [0.1 * (len(texts) - i)
                                                              for i in range(len(texts))]


def test_mcf_says_which_rule_set_each_rounds_bar():
    backend = ScriptedBackend(labels=lambda text: {"Yes": -1.0, "No": -1.0})
    combination = _guarded_combination()
    documents = [Document(id=str(i), text=f"passage {i}") for i in range(10)]
    guarded = MultiGranularFilter(backend, MCFConfig(), combination, priors=_priors)
    result = guarded.select("q?", documents)
    assert result.rule == "shift_guard" and len(result.kept) == 3
    assert "passages 10" in result.rule_reason
    alone = MultiGranularFilter(backend, MCFConfig(shift_guard=False), combination,
                                priors=_priors).select("q?", documents)
    assert alone.rule == "calibrated" and len(alone.kept) == 1
    like = guarded.select("q?", documents[:6])
    assert like.rule == "calibrated" and len(like.kept) == 1
    # P(relevant) is called a calibrated probability only on a round like the fitting ones;
    # without the guard on the bar, the round is still unlike them, and it says so.
    assert (result.calibrated, alone.calibrated, like.calibrated) == (False, False, True)
    assert "P(relevant) not calibrated here: unlike the fitting rounds in passages 10" in (
        alone.rule_reason)
    ranked = rank_by_filter(backend, MCFConfig(), "q?", documents, combination)
    assert {r.bar_rule.split(":")[0] for r in ranked} == {"shift_guard"}
    assert {r.calibrated for r in ranked} == {False}
    assert {r.calibrated for r in rank_by_filter(backend, MCFConfig(), "q?", documents[:6],
                                                 combination)} == {True}
    assert sum(bool(r.kept) for r in ranked) == 3


def test_the_card_keeps_min_keep_top_k_and_the_guard():
    combination = _guarded_combination()
    read = card_combination({"base_model": "tiny", "combination": combination.as_card()})
    assert (read.min_keep, read.top_k, read.guard) == (1, 3, combination.guard)
    old = {k: v for k, v in combination.as_card().items()
           if k not in ("min_keep", "top_k", "shift_guard")}
    read = card_combination({"base_model": "tiny", "combination": old})
    assert (read.min_keep, read.top_k, read.guard) == (1, 2, None)  # a card fitted before


def _shifted_rounds() -> list[LabelledRound]:
    """Two sources like the synthetic ones and a third of rounds twice the size, with many
    relevant passages: its bar, fitted elsewhere, keeps too few."""
    rounds = synthetic_rounds(80, seed=21)
    for index, r in enumerate(synthetic_rounds(40, seed=22)):
        twin = synthetic_rounds(1, seed=100 + index)[0]
        scores = RoundScores(*(a + b for a, b in zip(
            (r.scores.filter_log_odds, r.scores.bm25, r.scores.dense),
            (twin.scores.filter_log_odds, twin.scores.bm25, twin.scores.dense), strict=True)))
        labels = tuple(v or (i % 3 == 0) for i, v in enumerate(r.labels + twin.labels))
        rounds.append(LabelledRound(scores, labels, "src-c", f"c{index}"))
    return rounds


def test_the_default_is_the_rule_whose_worst_left_out_source_is_best():
    rounds = _shifted_rounds()
    search = rule_search(rounds, SMALL)
    assert set(search) == set(SMALL)
    for rule, rows in search.items():
        assert set(rows) == {"src-a", "src-b", "src-c"}
        held = [r for r in rounds if r.source == "src-c"]
        assert rows["src-c"] == measured_on(fit_rule(rule, [r for r in rounds
                                                            if r.source != "src-c"]), held)
    top = max(worst_margin(rows)[0] for rows in search.values())
    tied = [r for r in SMALL if worst_margin(search[r])[0] >= top - TIE_MARGIN]
    best = max(tied, key=lambda rule: worst_margin(search[rule])[1])
    assert best_rule(search) == best
    combination = measure_combination(rounds, folds=3, by_left_out_source=True,
                                      candidates=SMALL, min_gain=0.0)
    fit = combination.report["fit"]
    assert fit["rule"] == best.as_card()
    assert (combination.min_keep, combination.top_k) == (best.min_keep, best.top_k)
    assert [c["rule"] for c in fit["candidates"] if c["chosen"]] == [best.name]
    for row in fit["leave_one_source_out"].values():
        assert row["default"]["rule"] == best.name
    priors = combination.priors_only_fit()  # always in the card, with its own settings
    assert not priors.reads_filter() and priors.bar is not None


def test_a_filter_below_min_gain_never_becomes_the_default():
    rounds = [r for r in _shifted_rounds()]
    combination = measure_combination(rounds, folds=3, by_left_out_source=True,
                                      candidates=SMALL, min_gain=0.99)
    fit = combination.report["fit"]
    assert not combination.reads_filter() and fit["filter_adds_nothing"]
    assert fit["rule"]["features"] == "priors_alone"
    assert not any(c["allowed"] for c in fit["candidates"] if c["features"] == "with_filter")


def test_scored_rounds_are_kept_and_read_back(tmp_path, monkeypatch):
    from fake_dense import fake_encoder

    from sieverag.inference.retrieval import dense

    monkeypatch.setattr(dense, "make_encoder", lambda config: fake_encoder)
    calls = []

    def labels(text):
        calls.append(text)
        return {"Yes": -0.5, "No": -1.5}

    from sieverag.inference.core.types import Example

    examples = [Example(id=f"q{i}", question=f"who built bridge {i}?", answers=("x",),
                        documents=(Document(id="a", text="the bridge was built", is_gold=True),
                                   Document(id="b", text="a river", is_gold=False)))
                for i in range(3)]
    kept = tmp_path / "scores.jsonl"
    first = score_rounds(ScriptedBackend(labels=labels), examples, "fake", progress=False,
                         scores_file=kept, fingerprint="w1")
    scored = len(calls)
    assert scored and len(kept.read_text().splitlines()) == 3
    again = score_rounds(ScriptedBackend(labels=labels), examples, "fake", progress=False,
                         scores_file=kept, fingerprint="w1")
    assert again == first and len(calls) == scored  # read back, not scored
    score_rounds(ScriptedBackend(labels=labels), examples[:1], "fake", progress=False,
                 scores_file=kept, fingerprint="w2")
    assert len(calls) == scored + scored // 3  # another adapter's weights: scored again
    kept.write_text("not json\n")
    with pytest.raises(Exception, match="line 1: not a scored round"):
        score_rounds(ScriptedBackend(labels=labels), examples, "fake", progress=False,
                     scores_file=kept)


def test_the_closing_line_says_plainly_what_ranks_and_what_the_filter_does():
    from sieverag.inference.filters.card.combination import FILTER_ALONE, PRIORS_ONLY
    from sieverag.inference.filters.card.filter_card import filter_role

    rounds = _shifted_rounds()
    left_out = measure_combination(rounds, folds=3, by_left_out_source=True,
                                   candidates=SMALL, min_gain=0.99)
    line = filter_role(left_out)
    assert line.startswith("retrieval ranks (BM25 + dense, calibrated)")
    assert "left out of the ranking" in line and "3 source(s)" in line
    assert "key sentences" in line
    used = measure_combination(rounds, folds=3, by_left_out_source=True,
                               candidates=SMALL[2:], min_gain=-1.0)
    assert filter_role(used).startswith("the filter's score ranks with BM25 and dense")
    assert filter_role(FILTER_ALONE).startswith("the filter's own score ranks")
    assert filter_role(PRIORS_ONLY).startswith("retrieval ranks")
