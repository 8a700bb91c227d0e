"""MAIN-RAG's training-free judge (arXiv 2501.00332), Agents 1 and 2.

Agent-1 (Predictor) answers the question from each document alone, all documents in one
batched generation. Agent-2 (Judge) scores each (question, document, answer) triplet as
r = log P("Yes") − log P("No") from one batched forward pass — no verdict is generated.
Agent-2's prompt continues Agent-1's conversation (document and question, the predicted
answer as the assistant's turn, then the evaluator's request), so its long part — the
document — is a prefix Agent-1 already read: the `hf` backend's prompt cache and a server's
prefix cache compute it once.
The adaptive judge bar is τq = mean(r) − n·σ(r) over the question's documents (population
standard deviation; n = 0 by default keeps the documents scoring at least the mean).
Documents with r ≥ τq are kept (`judge_selection`, the one rule `main-rag`, amber's judge and
`sieverag judge-sweep` apply). Agent-3 (Final-Predictor) is the `main-rag` pipeline's
generator; it reads the kept documents in `judge.order`: by r descending (the paper's order,
the default), ascending, or a random order that is the same on every run of a question (its
seed is a sha256 of the question as the judge reads it and `judge.seed`) — the paper's
document-order ablation.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Literal

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.settings import Section, settings
from sieverag.inference.core.types import Conversation, Document
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
from sieverag.inference.filters.filter_format import relevance_log_odds
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend

YES, NO = "Yes", "No"
DocumentOrder = Literal["descending", "ascending", "random"]


@settings
class JudgeConfig:
    """Settings of the MAIN-RAG judge."""

    bar_n: float = field(default=0.0, metadata={"help": "n in τq = mean(r) − n·σ(r)"})
    predictor_max_new_tokens: int = field(
        default=32, metadata={"help": "length cap of Agent-1's per-document answers"}
    )
    order: DocumentOrder = field(default="descending", metadata={
        "help": "the order kept documents reach Agent-3: descending r (the paper's), "
                "ascending r, or random (the same on every run of a question)"})
    seed: int = field(default=0, metadata={"help": "seed of the random order"})
    verdict_max_new_tokens: int = field(default=4, metadata={
        "help": "main-rag-naive: length cap of Agent-2's generated Yes/No verdict"})

    def __post_init__(self) -> None:
        for name in ("predictor_max_new_tokens", "verdict_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"judge.{name} must be >= 1, got {getattr(self, name)}")


def judge_bar(scores: Sequence[float], n: float) -> float:
    """τq = mean(r) − n·σ(r), σ the population standard deviation (0 for one document)."""
    if not scores:
        raise ValueError("judge_bar needs at least one score")
    return statistics.fmean(scores) - n * statistics.pstdev(scores)


def reading_order(kept: Sequence[ScoredDocument], order: DocumentOrder, question: str,
                  seed: int) -> tuple[ScoredDocument, ...]:
    """`kept` (in retrieved order) as Agent-3 reads it: by score descending or ascending
    (ties in retrieved order), or shuffled by a generator seeded from `question` and `seed`
    (a sha256, not Python's per-process `hash`, so every run shuffles a question alike)."""
    if order == "descending":
        return tuple(sorted(kept, key=lambda s: -s.score))
    if order == "ascending":
        return tuple(sorted(kept, key=lambda s: s.score))
    digest = hashlib.sha256(f"{seed}\n{question}".encode()).digest()
    shuffled = list(kept)
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(shuffled)
    return tuple(shuffled)


def judge_selection(question: str, documents: Sequence[Document], scores: Sequence[float],
                    details: Sequence[Mapping], config: JudgeConfig) -> FilterResult:
    """Keep the documents with r ≥ τq (`judge_bar` with `config.bar_n`), in `config.order`;
    `details` is each document's evidence for the record (Agent-1's answer)."""
    if not documents:
        return FilterResult(kept=(), scored=(), threshold=None)
    bar = judge_bar(scores, config.bar_n)
    scored = tuple(ScoredDocument(d, r, r >= bar, dict(x))
                   for d, r, x in zip(documents, scores, details, strict=True))
    kept = reading_order([s for s in scored if s.kept], config.order, question, config.seed)
    return FilterResult(kept=kept, scored=scored, threshold=bar)


JUDGE_SECTION = Section("judge", JudgeConfig, "the MAIN-RAG judge's rules")


class MainRagJudge:
    """The `judge` filter: Predictor + Judge with the adaptive bar."""

    name = "judge"

    def __init__(self, backend: LLMBackend, config: JudgeConfig = JudgeConfig()) -> None:
        self.backend = backend
        self.config = config
        self.predictor_prompt = load_template("judge_predictor")
        self.judge_prompt = load_template("judge_evaluator")

    def predict_answers(self, question: str, documents: Sequence[Document]) -> list[str]:
        """Agent-1: one short answer per document, from that document alone."""
        prompts = [self.predictor_prompt.messages(question=question, document=d.as_context())
                   for d in documents]
        settings = GenerationSettings(max_new_tokens=self.config.predictor_max_new_tokens,
                                      stop=("\n",))
        return [a.strip() for a in self.backend.generate(prompts, settings, agent="predictor")]

    def judge_messages(self, question: str, document: Document, answer: str) -> Conversation:
        """Agent-2's prompt: Agent-1's conversation on `document`, its `answer`, then the
        evaluator's request."""
        return [*self.predictor_prompt.messages(question=question, document=document.as_context()),
                {"role": "assistant", "content": answer},
                *self.judge_prompt.messages()]

    def judge_scores(
        self, question: str, documents: Sequence[Document], answers: Sequence[str]
    ) -> list[float]:
        """Agent-2: r = log P("Yes") − log P("No") for each (document, answer)."""
        prompts = [self.judge_messages(question, d, a)
                   for d, a in zip(documents, answers, strict=True)]
        logprobs = self.backend.label_logprobs(prompts, [YES, NO], agent="judge")
        return [relevance_log_odds(lp, YES, NO) for lp in logprobs]

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        if not documents:
            return FilterResult(kept=(), scored=(), threshold=None)
        answers = self.predict_answers(question, documents)
        scores = self.judge_scores(question, documents, answers)
        return judge_selection(question, documents, scores,
                               [{"predicted_answer": a} for a in answers], self.config)
