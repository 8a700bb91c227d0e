"""`auto`: the conditional router (inference/pipelines/router.py) in front of another pipeline.

Per question the router decides whether retrieval is worth it; if so the routed pipeline
(`vanilla` by default, any registered one) runs, else the question is answered directly.
The decision and its features are kept in the trace.
"""

from __future__ import annotations

from dataclasses import replace

from sieverag.inference.errors import ConfigError
from sieverag.inference.pipelines.base import (
    PipelineContext,
    PipelineOutput,
    build_pipeline,
    register_pipeline,
)
from sieverag.inference.pipelines.router import Router
from sieverag.inference.pipelines.simple import DirectPipeline
from sieverag.inference.types import Example


@register_pipeline("auto")
class AutoPipeline:
    """Route each question to retrieval (the routed pipeline) or to a direct answer."""

    name = "auto"

    def __init__(self, context: PipelineContext) -> None:
        if context.routed_pipeline == "auto":
            raise ConfigError("routed_pipeline cannot be `auto` itself")
        self.router = context.router or Router()
        self.routed = build_pipeline(context.routed_pipeline, context)
        self.direct = DirectPipeline(context)

    def run(self, example: Example) -> PipelineOutput:
        decision = self.router.decide(example.question)
        output = (self.routed if decision.retrieve else self.direct).run(example)
        trace = {**output.trace, "route": decision.to_json()}
        return replace(output, trace=trace)
