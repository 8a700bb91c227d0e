"""Document filters: question + documents in, kept documents (ordered, scored, with the
threshold used) out. `none` keeps all; `judge` is MAIN-RAG's training-free judge."""

from inference.filters.base import DocumentFilter, FilterResult, KeepAll, ScoredDocument
from inference.filters.judge import JudgeConfig, MainRagJudge, judge_bar

__all__ = ["DocumentFilter", "FilterResult", "JudgeConfig", "KeepAll", "MainRagJudge",
           "ScoredDocument", "judge_bar"]
