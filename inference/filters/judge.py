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
Documents with r ≥ τq are kept, ordered by r descending. Agent-3 (Final-Predictor) is the
`main-rag` pipeline's generator.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import field

from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.base import FilterResult, ScoredDocument
from sieverag.inference.filters.filter_format import relevance_log_odds
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.settings import settings
from sieverag.inference.types import Conversation, Document

YES, NO = "Yes", "No"


@settings
class JudgeConfig:
    """Settings of the MAIN-RAG judge."""

    bar_n: float = field(default=0.0, metadata={"help": "n in τq = mean(r) − n·σ(r)"})
    predictor_max_new_tokens: int = field(
        default=32, metadata={"help": "length cap of Agent-1's per-document answers"}
    )

    def __post_init__(self) -> None:
        if self.predictor_max_new_tokens < 1:
            raise ConfigError(
                f"judge.predictor_max_new_tokens must be >= 1, got {self.predictor_max_new_tokens}"
            )


def judge_bar(scores: Sequence[float], n: float) -> float:
    """τq = mean(r) − n·σ(r), σ the population standard deviation (0 for one document)."""
    if not scores:
        raise ValueError("judge_bar needs at least one score")
    return statistics.fmean(scores) - n * statistics.pstdev(scores)


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
        bar = judge_bar(scores, self.config.bar_n)
        scored = tuple(
            ScoredDocument(d, r, r >= bar, {"predicted_answer": a})
            for d, r, a in zip(documents, scores, answers, strict=True)
        )
        kept = tuple(sorted((s for s in scored if s.kept), key=lambda s: -s.score))
        return FilterResult(kept=kept, scored=scored, threshold=bar)
