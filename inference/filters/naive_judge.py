"""MAIN-RAG's naive multi-agent baseline (the paper's ablation): Agent-2 *says* its verdict.

Agent-1 answers from each document alone, as in `judge.MainRagJudge`. Agent-2 reads the same
evaluator conversation but generates its reply (greedy, at most `judge.verdict_max_new_tokens`
tokens, one line) instead of being scored: a document is kept when the reply, stripped,
starts with "Yes" (any case). There is no score and no adaptive bar; kept documents keep the
retrieved order. A record stores score 1.0 for a kept document and 0.0 for a dropped one,
with the reply itself as `verdict`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
from sieverag.inference.filters.judge import YES, JudgeConfig, MainRagJudge
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend


def says_yes(verdict: str) -> bool:
    """Whether a generated verdict keeps its document: it starts with "Yes", any case."""
    return verdict.strip().lower().startswith(YES.lower())


class NaiveJudge:
    """The `main-rag-naive` filter: Predictor + a generated Yes/No verdict per document."""

    name = "naive-judge"

    def __init__(self, backend: LLMBackend, config: JudgeConfig = JudgeConfig()) -> None:
        self.judge = MainRagJudge(backend, config)
        self.verdict_settings = GenerationSettings(
            max_new_tokens=config.verdict_max_new_tokens, stop=("\n",))

    def verdicts(self, question: str, documents: Sequence[Document],
                 answers: Sequence[str]) -> list[str]:
        """Agent-2's replies, generated on `MainRagJudge.judge_messages`'s conversations."""
        prompts = [self.judge.judge_messages(question, d, a)
                   for d, a in zip(documents, answers, strict=True)]
        return self.judge.backend.generate(prompts, self.verdict_settings, agent="judge")

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        if not documents:
            return FilterResult(kept=(), scored=(), threshold=None)
        answers = self.judge.predict_answers(question, documents)
        verdicts = self.verdicts(question, documents, answers)
        scored = tuple(
            ScoredDocument(d, float(says_yes(v)), says_yes(v),
                           {"predicted_answer": a, "verdict": v.strip()})
            for d, a, v in zip(documents, answers, verdicts, strict=True))
        return FilterResult(kept=tuple(s for s in scored if s.kept), scored=scored,
                            threshold=None)
