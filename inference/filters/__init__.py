"""Document filters: question + documents in, kept documents (ordered, scored, with the
threshold used) out. `none` keeps all; `judge` is MAIN-RAG's training-free judge; `mcf` is
Amber's multi-granular filter on the trained filter (chunks, then key sentences); `stack`
runs both. `build_filter(name, FilterSetup(...))` makes one by name. `adapters` finds the
trained filter (a folder, a name in the user's cache, or the one shipped in `shipped/`);
`windows` is how MCF reads a document longer than the filter was trained to read (window by
window, judged by its best); `sentence_priors` is MCF's sentence rule without the filter (a
sentence's BM25, dense score and place in its chunk)."""

from sieverag.inference.filters.document_filter import (
    DocumentFilter,
    FilterResult,
    KeepAll,
    ScoredDocument,
)
from sieverag.inference.filters.filter_registry import (
    FILTER_NAMES,
    FilterName,
    FilterSetup,
    build_filter,
)
from sieverag.inference.filters.judge import JudgeConfig, MainRagJudge, judge_bar
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.stack import StackConfig, StackedFilter

__all__ = ["FILTER_NAMES", "DocumentFilter", "FilterName", "FilterResult", "FilterSetup",
           "JudgeConfig", "KeepAll", "MCFConfig", "MainRagJudge", "MultiGranularFilter",
           "ScoredDocument", "StackConfig", "StackedFilter", "build_filter", "judge_bar"]
