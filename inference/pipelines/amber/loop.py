"""Amber's loop: the `amber` pipeline and its variants, registered here (the package's
docstring tells the loop step by step)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sieverag.inference.agents.answer_extraction import extract_answer
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.types import Document, Example
from sieverag.inference.filters.document_filter import (
    FilterResult,
    ScoredDocument,
    ScoredDocumentRecord,
)
from sieverag.inference.filters.filter_registry import FILTER_NAMES, FilterSetup, build_filter
from sieverag.inference.filters.judge import JUDGE_SECTION, JudgeConfig
from sieverag.inference.filters.mcf import MCF_SECTION, MCFConfig
from sieverag.inference.pipelines.amber.collector import InformationCollector
from sieverag.inference.pipelines.amber.config import (
    AMBER_SECTION,
    AmberConfig,
    paper_amber,
    paper_mcf,
)
from sieverag.inference.pipelines.amber.loop_trace import (
    AmberRound,
    AmberTrace,
    BranchEntry,
    EvidenceEntry,
    StopReason,
    render_amber_trace,
)
from sieverag.inference.pipelines.amber.memory import MemoryUpdater, cap_memory, shown_memory
from sieverag.inference.pipelines.pipeline_registry import (
    PipelineContext,
    PipelineOutput,
    PipelineSettings,
    format_documents,
    question_text,
    register_pipeline,
)
from sieverag.inference.pipelines.rounds import RoundDocuments

# Pipeline name → the filter it fixes (None: `amber.filter` of the run config).
AMBER_PIPELINES: dict[str, str | None] = {"amber": None,
                                          **{f"amber-{f}": f for f in FILTER_NAMES}}
# Variant pipeline name → the loop switch it turns off: the paper's -AMU and -AIC rows (-MCF
# is `amber-none`). They run `amber.filter`'s filter stage.
AMBER_ABLATIONS: dict[str, str] = {"amber-no-amu": "amu", "amber-no-aic": "aic"}
AMBER_PIPELINES.update(dict.fromkeys(AMBER_ABLATIONS))
# The paper's loop with the paper's MCF (`config.paper_amber`, `config.paper_mcf`), whatever
# the run's `amber` and `mcf` sections say.
PAPER_PIPELINE = "amber-paper"
AMBER_PIPELINES[PAPER_PIPELINE] = "mcf"
# What the final answer reads → its template (`evidence` reads as vanilla and main-rag do).
ANSWER_TEMPLATES = {"memory": "amber_answer_memory", "memory_and_evidence": "amber_answer",
                    "evidence": "answer_with_documents"}


def _configured_filter(settings: PipelineSettings) -> str:
    """The filter stage of `amber` and its ablations: the run's `amber.filter`."""
    return settings(AmberConfig).filter


# Every amber pipeline reads the loop's settings and its filters' rules.
SECTIONS = [AMBER_SECTION, MCF_SECTION, JUDGE_SECTION]


@dataclass
class _Evidence:
    """Kept documents in the order found, each with its round."""

    items: list[tuple[int, ScoredDocument]] = field(default_factory=list)

    @property
    def documents(self) -> list[Document]:
        return [s.document for _, s in self.items]

    def trace(self) -> list[EvidenceEntry]:
        return [EvidenceEntry(round=r, id=s.document.id, title=s.document.title,
                              score=round(s.score, 4), text=s.document.text,
                              key_sentences=s.details.get("key_sentences"))
                for r, s in self.items]


def _scored_entry(scored: ScoredDocument) -> ScoredDocumentRecord:
    return ScoredDocumentRecord(id=scored.document.id, title=scored.document.title,
                                score=round(scored.score, 4), kept=scored.kept,
                                is_gold=scored.document.is_gold, **scored.details)


def _combined(results: Sequence[FilterResult]) -> FilterResult:
    """All rounds' filter results as one (the bar only where every round used the same)."""
    bars = {r.threshold for r in results if r.threshold is not None}
    rules = list(dict.fromkeys(r.rule for r in results if r.rule))
    reasons = list(dict.fromkeys(r.rule_reason for r in results if r.rule_reason))
    return FilterResult(kept=tuple(s for r in results for s in r.kept),
                        scored=tuple(s for r in results for s in r.scored),
                        threshold=bars.pop() if len(bars) == 1 else None,
                        rule="+".join(rules) or None, rule_reason=" | ".join(reasons) or None)


# Every amber variant's trace: its model, and how `sieverag trace` shows it.
TRACE = {"trace": AmberTrace, "render_trace": render_amber_trace}


@register_pipeline("amber", filter_stage=_configured_filter, sections=SECTIONS, **TRACE)
class AmberPipeline:
    """Retrieve → filter → memory update → sufficient? → next query …, then answer."""

    def __init__(self, context: PipelineContext, filter_name: str | None = None,
                 name: str = "amber") -> None:
        self.context = context
        self.config = context.settings(AmberConfig)
        mcf = context.settings(MCFConfig)
        if name in AMBER_ABLATIONS:
            self.config = replace(self.config, **{AMBER_ABLATIONS[name]: False})
        if name == PAPER_PIPELINE:
            self.config, mcf = paper_amber(self.config), paper_mcf(mcf)
        self.filter_name = filter_name or self.config.filter
        self.name = name if filter_name is None else f"amber-{filter_name}"
        self.filter = build_filter(self.filter_name, FilterSetup(
            judge_backend=context.judge_backend, mcf_backend=context.mcf_backend,
            combination=context.filter_combination,
            judge=context.settings(JudgeConfig), mcf=mcf, stack=self.config.stack))
        self.memory_updater = MemoryUpdater(context.generator, self.config.memory)
        self.collector = InformationCollector(context.generator, self.config.collector)
        self.answer_prompt = load_template(ANSWER_TEMPLATES[self.config.answer_from])
        self.direct_prompt = load_template("answer_direct")
        self._warned_uncalibrated = False

    def run(self, example: Example) -> PipelineOutput:
        question = question_text(example)
        documents = RoundDocuments(self.context, example, self.config.k)
        evidence = _Evidence()
        results: list[FilterResult] = []
        rounds: list[AmberRound] = []
        queries = [example.question]
        memory = ""
        stop_reason: StopReason = "max_iterations"
        for number in range(1, self.config.max_iterations + 1):
            fresh, skipped = documents.fetch(queries[-1])
            result = (self.filter.select(question, fresh) if fresh
                      else FilterResult(kept=(), scored=(), threshold=None))
            results.append(result)
            evidence.items.extend((number, s) for s in result.kept)
            exhausted = documents.exhausted
            branch = self._branch(evidence) if self.config.adaptive else None
            answer_now = branch is not None and branch.branch == "answer"
            last_round = number == self.config.max_iterations or exhausted or answer_now
            # An answer from the evidence alone reads no memory: after the last round, nobody
            # would read its update.
            memory_read = self.config.answer_from != "evidence" or not last_round
            update = (self.memory_updater.update(question, memory,
                                                 format_documents(result.kept_documents))
                      if result.kept and memory_read and self.config.amu else None)
            # The memory only changes with new evidence, so a round without any adds nothing.
            progressed = bool(result.kept)
            if update is not None:
                memory = update.memory
            elif result.kept and not self.config.amu:  # -AMU: the evidence is the memory
                # newest first: the cap then drops the oldest rounds, not the new ones
                memory = cap_memory(format_documents(evidence.documents[::-1]),
                                    self.config.memory.max_chars)[0]
            entry = AmberRound(
                round=number, query=queries[-1], retrieved=[d.id for d in fresh],
                skipped_seen=skipped, threshold=result.threshold, rule=result.rule,
                rule_reason=result.rule_reason,
                scored=[_scored_entry(s) for s in result.scored],
                kept=[s.document.id for s in result.kept],
                memory_update=update.to_dict() if update is not None else None,
                memory=memory, sufficiency=None, next_query=None, branch=branch)
            rounds.append(entry)
            if not progressed:
                stop_reason = "no_progress"
                break
            if answer_now:
                stop_reason = "strong_evidence"
                break
            if number == self.config.max_iterations:
                break
            if exhausted:  # no further query could bring anything new
                stop_reason = "pool_exhausted"
                break
            if not self.config.aic:  # -AIC: the next unseen documents for the question
                queries.append(example.question)
                continue
            if branch is None or branch.strength is None:  # the paper's loop: the collector
                # judges the memory (the adaptive loop's evidence signal replaces it)
                verdict = self.collector.sufficiency(question, memory)
                entry.sufficiency = verdict.to_dict()
                if verdict.sufficient:
                    stop_reason = "sufficient"
                    break
            following = self.collector.next_query(question, memory, queries,
                                                  evidence.documents)
            entry.next_query = following.to_dict()
            if following.query is None:
                stop_reason = "no_new_query"
                break
            queries.append(following.query)
        fallback = self._fallback(results, evidence)
        raw = self._generate_answer(question, memory, evidence.documents)
        trace = AmberTrace(pipeline=self.name, filter=self.filter_name, queries=queries,
                           rounds=rounds, evidence=evidence.trace(), memory=memory,
                           stop_reason=stop_reason, answer_from=self.config.answer_from,
                           fallback_evidence=fallback)
        return PipelineOutput(
            answer=extract_answer(raw, example.question, self.context.answer_extraction),
            raw_answer=raw, documents_read=tuple(evidence.documents),
            filter_result=_combined(results), trace=trace.to_json())

    def _branch(self, evidence: _Evidence) -> BranchEntry:
        """The adaptive loop's choice after a round's filter: answer now when the kept
        evidence's strength reaches `answer_at`, else loop (memory agents, next query). A
        filter that gives no calibrated P(relevant) (the judge, `none`) always loops, and says
        so once."""
        config = self.config
        p = [s.details.get("p_relevant") for _, s in evidence.items]
        if any(value is None for value in p):
            if not self._warned_uncalibrated:
                warnings.warn(f"{self.name}: amber.adaptive reads MCF's calibrated "
                              f"P(relevant), which the {self.filter_name!r} filter does not "
                              "give; its rounds run the paper's loop (memory agents and the "
                              "sufficiency check)", stacklevel=2)
                self._warned_uncalibrated = True
            return BranchEntry(branch="loop", strength=None, bar=config.answer_at,
                               reason=f"the {self.filter_name} filter gives no calibrated "
                                      "P(relevant)")
        strength = (max(p, default=0.0) if config.evidence_signal == "max_p" else sum(p))
        strong = strength >= config.answer_at
        word = "reaches" if strong else "is below"
        return BranchEntry(branch="answer" if strong else "loop", strength=round(strength, 6),
                           bar=config.answer_at,
                           reason=f"{config.evidence_signal} of the kept evidence {strength:.3f} "
                                  f"{word} amber.answer_at {config.answer_at}")

    def _fallback(self, results: Sequence[FilterResult], evidence: _Evidence) -> list[str]:
        """Top up the evidence to `min_evidence` chunks with the best-scored dropped ones
        (whole chunks, any round); returns their ids."""
        missing = self.config.min_evidence - len(evidence.items)
        if missing <= 0:
            return []
        dropped = [(number, s) for number, result in enumerate(results, start=1)
                   for s in result.scored if not s.kept]
        best = sorted(dropped, key=lambda item: -item[1].score)[:missing]
        evidence.items.extend(best)
        return [s.document.id for _, s in best]

    def _generate_answer(self, question: str, memory: str, documents: Sequence[Document]) -> str:
        evidence = format_documents(documents)
        # Template inputs besides the question, and whether each has anything to read.
        readable = {"memory": (shown_memory(memory), bool(memory)),
                    "evidence": (evidence, bool(documents)),
                    "documents": (evidence, bool(documents))}
        inputs = [name for name in self.answer_prompt.inputs if name != "question"]
        if any(readable[name][1] for name in inputs):
            prompt = self.answer_prompt.messages(
                question=question, **{name: readable[name][0] for name in inputs})
        else:
            prompt = self.direct_prompt.messages(question=question)
        return self.context.generator.generate([prompt], self.context.generation,
                                               agent="generator")[0]


for _name, _filter in AMBER_PIPELINES.items():
    if _filter is not None and _name != PAPER_PIPELINE:
        register_pipeline(_name, filter_stage=lambda settings, fixed=_filter: fixed,
                          sections=SECTIONS, **TRACE)(
            functools.partial(AmberPipeline, filter_name=_filter))
for _name in AMBER_ABLATIONS:
    register_pipeline(_name, filter_stage=_configured_filter, sections=SECTIONS, **TRACE)(
        functools.partial(AmberPipeline, name=_name))
register_pipeline(PAPER_PIPELINE, filter_stage=lambda settings: "mcf", sections=SECTIONS,
                  **TRACE)(
    functools.partial(AmberPipeline, name=PAPER_PIPELINE))
