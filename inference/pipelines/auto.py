"""`auto`: the conditional router (inference/pipelines/router.py) in front of another pipeline.

Per question the router decides whether retrieval is worth it; if so the routed pipeline
(`vanilla` by default, any registered one) runs, else the question is answered directly.
Under the router's `knowledge` rule the direct answer comes first, as the draft the router
compares with the question: a question the model knows returns that draft as it is (one
generator call), one it does not runs the routed pipeline too (the draft's call then shows
in the record's usage). Under `corpus-match` the router decides from the question alone.
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
from sieverag.inference.pipelines.router import ROUTER_SECTION
from sieverag.inference.pipelines.simple import DirectPipeline
from sieverag.inference.types import Example


# Its documents are its routed pipeline's, which the run counts among its pipelines.
@register_pipeline("auto", reads_documents=False, sections=[ROUTER_SECTION])
class AutoPipeline:
    """Route each question to retrieval (the routed pipeline) or to a direct answer."""

    name = "auto"

    def __init__(self, context: PipelineContext) -> None:
        if context.routed_pipeline == "auto":
            raise ConfigError("routed_pipeline cannot be `auto` itself")
        if context.router is None:
            raise ConfigError("the `auto` pipeline needs a router in its context "
                              "(`inference.compose.build_context` makes one)")
        self.router = context.router
        self.routed = build_pipeline(context.routed_pipeline, context)
        self.direct = DirectPipeline(context)

    def run(self, example: Example) -> PipelineOutput:
        if self.router.needs_draft:
            draft = self.direct.run(example)
            decision = self.router.decide(example.question, draft=draft.raw_answer)
            output = self.routed.run(example) if decision.retrieve else draft
        else:
            decision = self.router.decide(example.question)
            output = (self.routed if decision.retrieve else self.direct).run(example)
        trace = {**output.trace, "route": decision.to_json()}
        return replace(output, trace=trace)
