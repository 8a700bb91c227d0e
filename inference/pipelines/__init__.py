"""Pipelines by name (`direct`, `vanilla`, `main-rag` and its naive multi-agent variant
`main-rag-naive`, `iter-retgen`, `amber` and its `amber-<filter>` and ablation variants,
`auto`), built from a shared PipelineContext.

A pipeline is one module of this package that registers itself (`base.register_pipeline`,
declaring what it needs and the settings it reads); importing this package imports every
module in it, so adding a pipeline is adding its module. `build_pipeline(name, context)` makes
one. Beside the pipelines sit the agents only they use: amber's memory updater (`memory`, AMU)
and information collector (`collector`, AIC), amber's settings (`amber_config`) and typed
trace (`amber_trace`), and the retrieve-or-not `router` of `auto`.
"""

import importlib
import pkgutil

from sieverag.inference.pipelines.base import (
    PIPELINES,
    Pipeline,
    PipelineContext,
    PipelineOutput,
    PipelineSettings,
    build_pipeline,
)

for _module in pkgutil.iter_modules(__path__):  # registration on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PIPELINES", "Pipeline", "PipelineContext", "PipelineOutput", "PipelineSettings",
           "build_pipeline"]
