"""Fitting a filter card's combination, shared by `sieverag filter fit-combination` and the end
of `sieverag train`: the filter scores the fitting questions' passages
(`combination_fit.score_rounds`), the combination is measured on them
(`combination_fit.measure_combination`) and written into the adapter's card.

After training (`fit_trained_filter`) the questions are the validation split of the
build-dataset folder the run trained on, read from the datasets that folder was labelled from,
and sources are left out in turn where the split holds two or more. Where no combination can
be fitted (no validation split, the datasets not found, one question) that is said in one
line: with one question whose passages are relevant and not, the filter's own score is
Platt-scaled on them (`filter_alone_fit`); otherwise the card keeps no combination and MCF
ranks by the filter alone (`combination.FILTER_ALONE`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import DatasetError, SieveragError
from sieverag.inference.core.in_flight import default_concurrency
from sieverag.inference.core.types import Device, Example
from sieverag.inference.data import PassageHandling
from sieverag.inference.filters.card.card_file import write_card
from sieverag.inference.filters.card.combination import (
    DEFAULT_EMBEDDING_MODEL,
    FILTER_ALONE_FIT,
    Combination,
    card_combination,
    fit_combination,
    with_combination,
    with_home,
)
from sieverag.inference.filters.card.filter_card import describe_combination, ranking_statement
from sieverag.inference.filters.filter_format import card_format
from sieverag.inference.filters.home import DEFAULT_HOME_READ, HomeRule
from sieverag.inference.filters.windows import DEFAULT_MAX_WINDOWS, WindowRule, card_window_tokens
from sieverag.inference.llm.call_batching import on_batcher, question_batcher
from sieverag.inference.metrics.filter_scores import auroc
from sieverag.training.evaluation.combination_fit import (
    LabelledRound,
    best_bar,
    fitting_questions,
    measure_combination,
    score_rounds,
)
from sieverag.training.evaluation.fit_defaults import DEFAULT_TOLERANCE, FOLDS, MIN_GAIN


def score_fitting_rounds(folder: Path, card: Mapping[str, Any],
                         by_dataset: Mapping[str, Sequence[Example]], *,
                         embedding_model: str = DEFAULT_EMBEDDING_MODEL, device: Device = "auto",
                         concurrency: int | None = None, progress: bool = True,
                         scores_file: str | Path | None = None) -> list[LabelledRound]:
    """Each fitting question's passages scored by the filter adapter `folder` on its card's
    base model (in its card's format), BM25 and dense; `concurrency` questions at once, their
    calls batched; the rounds in dataset order. `scores_file`: rounds kept across runs
    (`combination_fit.score_rounds`), keyed by the adapter's weights."""
    with filter_scorer(folder, card, embedding_model=embedding_model, device=device,
                       concurrency=concurrency, progress=progress,
                       scores_file=scores_file) as score:
        return [r for examples in by_dataset.values() for r in score(examples)]


def fitting_passage_handling(card: Mapping[str, Any]) -> PassageHandling:
    """What fitting does with odd passages (`odd_passages_line`): the filter scores every
    passage whole, as sent, a blank one too, where MCF at inference gives a blank one 0
    unread and reads one longer than the card's window in windows (its tokens counted here
    as words and marks: the filter's tokenizer is not loaded yet)."""
    rule = WindowRule(card_window_tokens(card), DEFAULT_MAX_WINDOWS)
    return PassageHandling(
        blank="scored by the filter as sent (MCF gives them 0 unread)", duplicate="scored again",
        long="read whole (MCF reads them in windows)",
        window=f"the filter's window of {rule.window_tokens} tokens (words and marks)",
        fits=rule.fits)


@contextmanager
def filter_scorer(folder: Path, card: Mapping[str, Any], *,
                  embedding_model: str = DEFAULT_EMBEDDING_MODEL, device: Device = "auto",
                  concurrency: int | None = None, progress: bool = True,
                  scores_file: str | Path | None = None
                  ) -> Iterator[Callable[[Sequence[Example]], list[LabelledRound]]]:
    """A function examples → their rounds scored as `score_fitting_rounds` scores them, on
    one backend while the context lasts (the home fit scores away rounds as it needs them)."""
    from sieverag.inference.llm.backend_registry import BackendSpec, build_backend

    spec = BackendSpec(model=card["base_model"], adapter=str(folder), device=device)
    concurrency = default_concurrency(concurrency, spec.endpoint is not None)
    with question_batcher(concurrency, spec.endpoint is not None) as batcher:
        backend = on_batcher(build_backend(spec), spec.endpoint is not None, batcher)

        def score(examples: Sequence[Example]) -> list[LabelledRound]:
            return score_rounds(backend, examples, embedding_model,
                                filter_format=card_format(card), progress=progress,
                                concurrency=concurrency, scores_file=scores_file,
                                fingerprint=_weights_fingerprint(folder, card))

        yield score


def home_sources_of(card: Mapping[str, Any]) -> list[str]:
    """The filter's home: the sources its training records came from (the card's
    `dataset.sources.train`)."""
    return sorted(((card.get("dataset") or {}).get("sources") or {}).get("train") or {})


def fit_card_home(folder: Path, card: Mapping[str, Any],
                  by_dataset: Mapping[str, Sequence[Example]], away_combination: Combination,
                  *, home_sources: Sequence[str], read: int = DEFAULT_HOME_READ,
                  tolerance: float = DEFAULT_TOLERANCE,
                  embedding_model: str = DEFAULT_EMBEDDING_MODEL, device: Device = "auto",
                  concurrency: int | None = None, progress: bool = True,
                  scores_file: str | Path | None = None) -> HomeRule:
    """The home rule of the filter in `folder` (`training/evaluation/home_fit.py`): the questions of
    `by_dataset` from `home_sources` are home (scored now), the others away (scored only
    where the home test would call them home); `away_combination` is the default they are
    measured against."""
    from sieverag.inference.data import example_source
    from sieverag.training.evaluation.home_fit import (
        AwayRound,
        HomeRound,
        fit_home_rule,
        round_features,
    )

    examples = [e for chunk in by_dataset.values() for e in chunk]
    home = [e for e in examples if example_source(e) in home_sources]
    away = [e for e in examples if example_source(e) not in home_sources]
    if not home:
        raise DatasetError(f"no question of the filter's home ({', '.join(home_sources)}) "
                           f"among the datasets: give its validation questions with --dataset")
    if not away:
        raise DatasetError(f"every question is from the filter's home "
                           f"({', '.join(home_sources)}): give datasets of other kinds of text "
                           "too, to tell home from")
    with filter_scorer(folder, card, embedding_model=embedding_model, device=device,
                       concurrency=concurrency, progress=progress,
                       scores_file=scores_file) as score:
        home_rounds = [HomeRound(e, r) for e, r in zip(home, score(home), strict=True)]
        away_rounds = [AwayRound(example_source(e), round_features(e, embedding_model), e,
                                 lambda example: score([example])[0]) for e in away]
        return fit_home_rule(home_rounds, away_rounds, away_combination,
                             sources=home_sources, read=read, tolerance=tolerance,
                             embedding_model=embedding_model)


def _weights_fingerprint(folder: Path, card: Mapping[str, Any]) -> str:
    """What identifies the adapter's scores: its card's weights digest, else its folder."""
    return str((card.get("weights") or {}).get("content_sha256") or folder.resolve())


def write_card_combination(folder: Path, card: Mapping[str, Any], combination: Combination,
                           datasets: Sequence[str], rounds: Sequence[LabelledRound]) -> Path:
    """Write `combination` into the card of `folder` (its `combination` section, with the
    datasets and questions it was fitted on: `combination.with_combination`); returns the
    card's path."""
    return write_card(folder, with_combination(
        card, combination, datasets=datasets,
        questions=[(r.source, r.question_id) for r in rounds]))


def write_card_home(folder: Path, card: Mapping[str, Any], home: HomeRule | None) -> Path:
    """Write `home` into the card of `folder` (its `home` section; None removes it:
    `combination.with_home`); returns the card's path."""
    return write_card(folder, with_home(card, home))


def filter_alone_fit(rounds: Sequence[LabelledRound], because: str,
                     embedding_model: str = DEFAULT_EMBEDDING_MODEL) -> Combination | None:
    """Platt scaling of the filter's score alone on `rounds` (too few for the combination with
    BM25 and dense: `because` says why), with the bar of best F1 on them; None where the
    passages are of one class, or the score does not rise with relevance on them."""
    try:
        fitted = fit_combination([r.scores for r in rounds], [r.labels for r in rounds],
                                 ("filter_log_odds",))
    except ValueError:
        return None
    if fitted.weights["filter_log_odds"] <= 0:
        return None
    probabilities = [fitted.probabilities(r.scores) for r in rounds]
    labels = [v for r in rounds for v in r.labels]
    scores = [s for r in rounds for s in r.scores.filter_log_odds]
    report = {"fit": {"questions": len(rounds), "passages": len(labels),
                      FILTER_ALONE_FIT: because, "auroc": {"filter_alone": auroc(labels, scores)}}}
    return replace(fitted, bar=best_bar(rounds, probabilities)[0],
                   embedding_model=embedding_model, report=report)


def fit_trained_filter(output_dir: str | Path, dataset_dir: str | Path, *,
                       device: Device = "auto", progress: bool = True) -> str:
    """Fit the combination of the adapter a training run wrote in `output_dir` on the
    validation questions of `dataset_dir`, the build-dataset folder it trained on, and write it
    into the adapter's card (see the module docstring); returns what was fitted, or why
    nothing was, ending with the line that says what MCF now ranks by."""
    from sieverag.inference.filters.card.card_file import CARD_FILE, read_card
    from sieverag.training.sft.data import labelled_datasets

    folder, split_dir = Path(output_dir), str(dataset_dir)
    card = read_card(folder)
    datasets: list[str] = []
    if card is None:
        return not_fitted(folder, split_dir, f"{folder} holds no {CARD_FILE}")
    try:
        datasets = labelled_datasets(split_dir)
        by_dataset = fitting_questions(datasets, card, adapter=str(folder), split_dir=split_dir)
        rounds = score_fitting_rounds(folder, card, by_dataset, device=device,
                                      progress=progress)
    except SieveragError as err:
        return not_fitted(folder, split_dir, str(err), datasets)
    sources = sorted({r.source for r in rounds})
    try:
        combination: Combination | None = measure_combination(
            rounds, folds=FOLDS, min_gain=MIN_GAIN, by_left_out_source=len(sources) > 1)
    except SieveragError as err:
        combination = filter_alone_fit(rounds, str(err))
        if combination is None:
            return not_fitted(folder, split_dir, f"{err}; nor does the filter's score alone "
                              "rise with relevance on them", datasets)
    path = write_card_combination(folder, card, combination, list(by_dataset), rounds)
    where = f"{folder / CARD_FILE}"
    return (f"MCF's combination, fitted on {len(rounds)} validation question(s) of "
            f"{split_dir} ({', '.join(sources)}"
            + ("; each source left out in turn" if len(sources) > 1 else "") + "):\n"
            + describe_combination(combination) + f"\nwritten into {path}\n"
            + ranking_statement(card_combination(read_card(folder), where), where))


def not_fitted(output_dir: str | Path, dataset_dir: str | Path, why: str,
               datasets: Sequence[str] = ()) -> str:
    """Why the adapter in `output_dir` got no combination from the validation split of
    `dataset_dir`, and the command that fits one (one line), then what MCF ranks by with its
    card as it is."""
    from sieverag.inference.filters.card.card_file import CARD_FILE, read_card

    where = f"{Path(output_dir) / CARD_FILE}"
    return (f"no combination fitted on the validation split of {dataset_dir}: {why} (fit one "
            f"on enough gold-marked questions with `sieverag filter fit-combination {output_dir} "
            f"--dataset {','.join(datasets) or 'FILES'} --split-dir {dataset_dir}`)\n"
            + ranking_statement(card_combination(read_card(output_dir), where), where))
