"""The typed trace of `amber` (`PipelineOutput.trace`, and a result record's `trace`): every
round's query, documents, scores, memory agents, memory, sufficiency verdict and next query;
the evidence read; why the loop stopped. `render_amber_trace` shows it as `sieverag trace`
and `sieverag ask --trace` print it; both are declared where amber registers."""

from __future__ import annotations

import textwrap
from typing import Literal, get_args

from pydantic import Field

from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.filters.document_filter import ScoredDocumentRecord
from sieverag.inference.filters.filter_registry import FilterName
from sieverag.inference.pipelines.amber.config import AnswerFrom, Branch
from sieverag.inference.pipelines.traces import PipelineTrace, scored_document_lines, wrap

# Why a question's loop ended (amber's module docstring says when).
StopReason = Literal["sufficient", "max_iterations", "no_progress", "no_new_query",
                     "pool_exhausted", "strong_evidence"]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)


class MemoryUpdateEntry(JsonlRecord):
    """The memory agents' replies in one round (`MemoryUpdate.to_dict()`)."""

    reviewer: str = Field(description="the Reviewer's reply")
    challenger: str = Field(description="the Challenger's reply")
    refiner: str = Field(description="the Refiner's reply (the new memory before the cap)")
    truncated: bool = Field(description="whether the memory was cut to its cap")


class SufficiencyEntry(JsonlRecord):
    """The collector's verdict on the memory (`Sufficiency.to_dict()`)."""

    p_yes: float = Field(description="P(Yes) that the memory answers the question")
    sufficient: bool = Field(description="whether P(Yes) reached the bar")


class BridgeCandidate(JsonlRecord):
    """One bridge candidate the collector scored."""

    name: str = Field(description="a name read off the kept evidence")
    p_yes: float = Field(description="P(Yes) that a search about it finds what is missing")


class NextQueryEntry(JsonlRecord):
    """The next search the collector made (`NextQuery.to_dict()`)."""

    query: str | None = Field(description="the new query; None when there is no new one")
    source: Literal["bridge", "writer", "variation", "none"] = Field(
        description="how it was made")
    written: str = Field(description="the query writer's raw reply ('' when it did not run)")
    candidates: list[BridgeCandidate] = Field(
        default_factory=list, description="bridge: every candidate scored, in order")


class BranchEntry(JsonlRecord):
    """The adaptive loop's choice after a round's filter (`amber.adaptive`)."""

    branch: Branch = Field(description="answer: from the kept evidence now; loop: run the memory "
                                       "agents and the collector's next query")
    strength: float | None = Field(
        description="the kept evidence's strength under `amber.evidence_signal` (None: the "
                    "filter gives no calibrated P(relevant))")
    bar: float = Field(description="`amber.answer_at`: a strength at or above it answers now")
    reason: str = Field(description="why, in words")


class AmberRound(JsonlRecord):
    """One round of the loop."""

    round: int = Field(description="1-based round number")
    query: str = Field(description="the round's search query")
    retrieved: list[str] = Field(description="ids of the unseen documents fetched")
    skipped_seen: int = Field(description="seen documents ranked above them, skipped")
    threshold: float | None = Field(description="the filter's bar; None without one")
    rule: str | None = Field(None, description=(
        "which rule set the bar (MCF: calibrated, or shift_guard where the round was unlike "
        "the rounds the bar was fitted on)"))
    rule_reason: str | None = Field(None, description="why, in words")
    scored: list[ScoredDocumentRecord] = Field(description="every fetched document's score")
    kept: list[str] = Field(description="ids the filter kept, best first")
    memory_update: MemoryUpdateEntry | None = Field(
        description="the memory agents' replies; None when they did not run")
    memory: str = Field(description="the memory after the round")
    sufficiency: SufficiencyEntry | None = Field(
        description="the sufficiency verdict; None when not asked")
    next_query: NextQueryEntry | None = Field(
        description="the next query; None when none was asked for")
    branch: BranchEntry | None = Field(
        None, description="the adaptive loop's choice after the filter; None when "
                          "`amber.adaptive` is off (or in runs made before it existed)")


class EvidenceEntry(JsonlRecord):
    """A chunk the generator read, with the round that found it."""

    round: int = Field(description="the round that kept it (or a fallback's round)")
    id: str = Field(description="the document's id")
    title: str = Field(description="the document's title")
    score: float = Field(description="the filter's score, 4 decimals")
    text: str = Field(description="the text read (MCF: the key sentences only)")
    key_sentences: list[int] | None = Field(description="MCF's 0-based key sentences")


class AmberTrace(PipelineTrace):
    """An amber question's whole loop."""

    pipeline: str = Field(
        description="the pipeline name (amber, amber-<filter>, amber-paper, amber-no-amu or "
                    "amber-no-aic)")
    filter: FilterName = Field(description="the filter stage that ran")
    queries: list[str] = Field(description="every query searched, the question first")
    rounds: list[AmberRound] = Field(description="the rounds, in order")
    evidence: list[EvidenceEntry] = Field(description="what the generator read, in order")
    memory: str = Field(description="the final memory")
    stop_reason: StopReason = Field(description="why the loop ended")
    answer_from: AnswerFrom = Field(description="what the final answer read")
    fallback_evidence: list[str] = Field(
        default_factory=list,
        description="ids of dropped chunks read to reach `min_evidence` (absent in runs made "
                    "before it existed)")


SNIPPET = 240  # characters of an evidence chunk shown


def _round_lines(entry: AmberRound) -> list[str]:
    bar = entry.threshold
    lines = [f"Round {entry.round} — query: {entry.query!r}",
             f"  retrieved {len(entry.retrieved)} new document(s), skipped "
             f"{entry.skipped_seen} seen; bar {'–' if bar is None else f'{bar:+.3f}'}"]
    if entry.rule:
        lines += wrap("Bar rule:   ", f"{entry.rule} — {entry.rule_reason or ''}")
    for scored in entry.scored:
        lines += scored_document_lines(scored)
    branch = entry.branch
    if branch is not None:
        lines += wrap("Branch:     ", f"{branch.branch} — {branch.reason}")
    update = entry.memory_update
    if update is None:
        lines.append("  memory agents: not run (" + (
            "the kept evidence is strong enough to answer" if branch is not None
            and branch.branch == "answer" else
            "the answer reads the evidence, not the memory" if entry.kept
            else "nothing new kept") + ")")
    else:
        lines += wrap("Reviewer:   ", update.reviewer)
        lines += wrap("Challenger: ", update.challenger)
        lines += wrap("Refiner:    ", update.refiner
                      + (" [cut to the memory cap]" if update.truncated else ""))
    lines += wrap("Memory:     ", entry.memory)
    verdict = entry.sufficiency
    if verdict is not None:
        lines.append(f"  Sufficient? P(Yes) = {verdict.p_yes:.2f} → "
                     f"{'yes' if verdict.sufficient else 'no'}")
    following = entry.next_query
    if following is not None:
        if following.query is None:
            lines += wrap("Next query: ", f"none new (writer said {following.written!r})")
        else:
            lines += wrap("Next query: ", f"{following.query!r} ({following.source})")
        if following.candidates:
            lines += wrap("Candidates: ", " · ".join(
                f"{c.name} P(Yes) {c.p_yes:.2f}" for c in following.candidates))
    return lines


def render_amber_trace(trace: AmberTrace) -> str:
    """The stop reason, every round (query, documents with scores and key sentences, the
    three memory agents, the memory, the sufficiency verdict, the next query), then the
    evidence the generator read."""
    lines = [f"Pipeline {trace.pipeline} (filter {trace.filter}): stopped "
             f"({trace.stop_reason}) after {len(trace.rounds)} round(s); "
             f"answer from {trace.answer_from}"]
    for entry in trace.rounds:
        lines += ["", *_round_lines(entry)]
    lines += ["", "Evidence the generator read:"]
    for number, item in enumerate(trace.evidence, start=1):
        lines += wrap(f"[{number}] ", f"{item.title or item.id} (round {item.round}, "
                      f"{item.score:+.2f}): {textwrap.shorten(item.text, SNIPPET)}")
    if not trace.evidence:
        lines.append("  (none)")
    return "\n".join(lines)
