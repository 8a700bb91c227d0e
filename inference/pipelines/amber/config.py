"""The typed settings of the `amber` pipeline (run config section `amber`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from types import MappingProxyType
from typing import Any, Literal

from sieverag.inference.core.settings import Section, at_least, settings
from sieverag.inference.filters.filter_registry import FilterName
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.filters.stack import StackConfig
from sieverag.inference.pipelines.amber.collector import CollectorConfig
from sieverag.inference.pipelines.amber.memory import MemoryConfig

AnswerFrom = Literal["memory", "memory_and_evidence", "evidence"]
# What the adaptive loop does after a round's filter.
Branch = Literal["answer", "loop"]
# How strong the kept evidence is, from the filter's calibrated P(relevant) of each kept chunk
# (every round's so far): the best one, or their sum (the expected number of relevant chunks).
EvidenceSignal = Literal["max_p", "sum_p"]


@settings
class AmberConfig:
    """The loop: documents per round, the filter stage, its length, what the answer reads."""

    filter: FilterName = field(default="mcf", metadata={
        "help": "filter stage of `amber`: mcf, judge, stack or none (amber-<filter> "
                "pipelines fix it)"})
    # Defaults: the settings that measured best on HotpotQA (README "Measured results").
    k: int = field(default=10, metadata={"help": "unseen documents taken per round"})
    max_iterations: int = field(default=3, metadata={"help": "rounds at most"})
    answer_from: AnswerFrom = field(default="evidence", metadata={
        "help": "what the final answer reads: the memory, the memory and the kept evidence, "
                "or the kept evidence only (the memory then only steers the loop; the default: "
                "a generator as small as SmolLM2 garbles its notes)"})
    min_evidence: int = field(default=1, metadata={
        "help": "when the loop ends with fewer kept chunks than this, the best-scored chunks "
                "the filter dropped are read too (whole), so the answer is never written blind "
                "while documents were seen; 0 turns this off"})
    amu: bool = field(default=True, metadata={
        "help": "run the memory agents (AMU); off (the paper's -AMU ablation): the memory is "
                "the kept evidence itself, cut to amber.memory.max_chars"})
    aic: bool = field(default=True, metadata={
        "help": "run the collector (AIC); off (the paper's -AIC ablation): no sufficiency "
                "check and no new query, each round takes the next unseen documents for the "
                "question until max_iterations"})
    adaptive: bool = field(default=True, metadata={
        "help": "answer from the kept evidence as soon as it is strong enough (its strength "
                "under evidence_signal >= answer_at), and run the memory agents and the "
                "collector's next query only when it is not; off: every round through the "
                "memory agents and the sufficiency check (the pipeline amber-paper runs the "
                "paper's whole loop)"})
    # Signal and bar: chosen leave-one-source-out on 150 training questions of NQ, SQuAD and
    # PopQA over one index (tests/benchmarks/bench_amber_adaptive.py; docs/results/pipelines.md,
    # "Amber pays its way"): sum_p, the most accurate bar within 2x vanilla's seconds.
    evidence_signal: EvidenceSignal = field(default="sum_p", metadata={
        "help": "the adaptive loop's evidence strength, from MCF's calibrated P(relevant) of "
                "the kept chunks: max_p (the best) or sum_p (their sum)"})
    answer_at: float = field(default=0.77836, metadata={
        "help": "the adaptive loop answers once the evidence strength reaches this (chosen on "
                "training questions: docs/results/pipelines.md, 'Amber pays its way')"})
    stack: StackConfig = field(default_factory=StackConfig,
                               metadata={"help": "how `stack` combines MCF and the judge"})
    memory: MemoryConfig = field(default_factory=MemoryConfig,
                                 metadata={"help": "the memory updater (AMU)"})
    collector: CollectorConfig = field(default_factory=CollectorConfig,
                                       metadata={"help": "the information collector (AIC)"})

    def __post_init__(self) -> None:
        at_least(0, "amber.", min_evidence=self.min_evidence, answer_at=self.answer_at)
        at_least(1, "amber.", k=self.k, max_iterations=self.max_iterations)


AMBER_SECTION = Section("amber", AmberConfig, "the `amber` loop")


# The paper's loop (Amber, arXiv 2504.05312), defined once: the `amber-paper` pipeline runs with
# these whatever the run's `amber` and `mcf` sections say, and the `amber-paper` preset's
# sections are these (a test holds them equal), so its ablation rows run the same loop.
PAPER_AMBER: Mapping[str, Any] = MappingProxyType({
    "adaptive": False,  # the sufficiency check every round (AIC), not the evidence signal
    "amu": True,  # the memory agents every round (Reviewer, Challenger, Refiner)
    "aic": True,
    "filter": "mcf",
    "answer_from": "memory",  # the answer from the memory M_t, by in-context learning
    # 3 rounds of 5 new documents: the iterative setting of Adaptive-Note, which Amber builds
    # on (the paper's own k and iteration cap could not be checked offline)
    "k": 5,
    "max_iterations": 3,
})
PAPER_COLLECTOR: Mapping[str, Any] = MappingProxyType({"query_source": "write"})
# MCF at both granularities: the round's 2 best chunks, then their key sentences.
PAPER_MCF: Mapping[str, Any] = MappingProxyType({"bar": "top_k", "top_k": 2,
                                                 "sentence_stage": True})


def paper_amber(config: AmberConfig) -> AmberConfig:
    """`config` with the paper's loop (`PAPER_AMBER`, the collector writing each next query);
    the settings the paper does not fix (memory size, prompts' budgets) stay `config`'s."""
    return replace(config, **PAPER_AMBER,
                   collector=replace(config.collector, **PAPER_COLLECTOR))


def paper_mcf(config: MCFConfig) -> MCFConfig:
    """`config` with the paper's MCF: chunk level then sentence level (`PAPER_MCF`)."""
    return replace(config, **PAPER_MCF)
