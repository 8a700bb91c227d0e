"""Pipelines by name (`direct`, `vanilla`, `main-rag` and its naive multi-agent variant
`main-rag-naive`, `iter-retgen`, `amber` and its `amber-<filter>` and ablation variants,
`auto`), built from a shared PipelineContext.

Importing this package registers every pipeline; `build_pipeline(name, context)` makes one.
Beside the pipelines sit the agents only they use: amber's memory updater (`memory`, AMU)
and information collector (`collector`, AIC), amber's settings (`amber_config`) and typed
trace (`amber_trace`), and the retrieve-or-not `router` of `auto`.
"""

from sieverag.inference.pipelines import (  # noqa: F401  (registration on import)
    amber,
    auto,
    iter_retgen,
    main_rag,
    simple,
)
from sieverag.inference.pipelines.base import (
    PIPELINES,
    Pipeline,
    PipelineContext,
    PipelineOutput,
    build_pipeline,
)

__all__ = ["PIPELINES", "Pipeline", "PipelineContext", "PipelineOutput", "build_pipeline"]
