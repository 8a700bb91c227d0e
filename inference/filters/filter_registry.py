"""Filters by name: `none`, `judge`, `mcf`, `stack` → one DocumentFilter, from the backends
and settings of a run (`FilterSetup`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.document_filter import DocumentFilter, KeepAll
from sieverag.inference.filters.judge import JudgeConfig, MainRagJudge
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.stack import StackConfig, StackedFilter
from sieverag.inference.llm.backend_protocol import LLMBackend

FilterName = Literal["mcf", "judge", "stack", "none"]
FILTER_NAMES: tuple[str, ...] = get_args(FilterName)
# The model roles each filter calls: `judge` (the MAIN-RAG judge's model) and `filter` (the
# trained filter: an adapter in-process, or a served one).
FILTER_ROLES: dict[str, frozenset[str]] = {
    "none": frozenset(), "judge": frozenset({"judge"}), "mcf": frozenset({"filter"}),
    "stack": frozenset({"judge", "filter"})}


@dataclass(frozen=True)
class FilterSetup:
    """What filters are built from: the judge's backend, the trained filter's, and settings."""

    judge_backend: LLMBackend | None = None
    mcf_backend: LLMBackend | None = None
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    mcf: MCFConfig = field(default_factory=MCFConfig)
    stack: StackConfig = field(default_factory=StackConfig)
    combination: Combination | None = None  # the trained filter's, from its card

    def trained_filter(self, name: str) -> LLMBackend:
        if self.mcf_backend is None:
            raise ConfigError(
                f"filter {name!r} needs the trained filter: set --models.filter.adapter (a "
                "LoRA adapter folder or a filter's name), or --models.filter.endpoint and "
                "--models.filter.model for a served one; `--amber.filter judge` needs no "
                "training")
        return self.mcf_backend

    def judge_model(self, name: str) -> LLMBackend:
        if self.judge_backend is None:
            raise ConfigError(f"filter {name!r} needs the judge role's model, and no pipeline "
                              "of the run declared the judge role")
        return self.judge_backend


def _judge(setup: FilterSetup) -> DocumentFilter:
    return MainRagJudge(setup.judge_model("judge"), setup.judge)


def _mcf(setup: FilterSetup) -> DocumentFilter:
    return MultiGranularFilter(setup.trained_filter("mcf"), setup.mcf, setup.combination)


def _stack(setup: FilterSetup) -> DocumentFilter:
    return StackedFilter(MultiGranularFilter(setup.trained_filter("stack"), setup.mcf,
                                             setup.combination),
                         MainRagJudge(setup.judge_model("stack"), setup.judge), setup.stack)


FILTERS: dict[str, Callable[[FilterSetup], DocumentFilter]] = {
    "none": lambda setup: KeepAll(),
    "judge": _judge,
    "mcf": _mcf,
    "stack": _stack,
}


def build_filter(name: str, setup: FilterSetup) -> DocumentFilter:
    """The filter registered as `name`."""
    if name not in FILTERS:
        raise ConfigError(f"unknown filter {name!r} (known: {', '.join(FILTER_NAMES)})")
    return FILTERS[name](setup)
