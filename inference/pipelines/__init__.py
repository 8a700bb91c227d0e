"""Pipelines by name (`direct`, `vanilla`, `main-rag` and its naive multi-agent variant
`main-rag-naive`, `iter-retgen`, `amber` and its `amber-<filter>` and ablation variants,
`auto`), built from a shared PipelineContext.

A pipeline is one module of this package, or one package when it has parts: `amber/` (the
loop, its memory updater AMU and information collector AIC, its settings and its trace) and
`auto/` (the router and its settings). It registers itself (`pipeline_registry.register_pipeline`,
declaring what it needs, the settings it reads, the pipelines it runs inside it and the part
composition builds for it); importing this package imports every module and package in it, so
adding a pipeline is adding its module. `build_pipeline(name, context)` makes one. `rounds`
holds the round-by-round document source of the pipelines that search more than once.
"""

import importlib
import pkgutil

from sieverag.inference.pipelines.pipeline_registry import (
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
