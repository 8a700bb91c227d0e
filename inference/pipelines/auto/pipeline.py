"""`auto`: the conditional router (`retrieval_router`) in front of another pipeline.

Per question the router decides whether retrieval is worth it; if so the routed pipeline
(`auto.routed_pipeline`: `vanilla` by default, any registered one) runs, else the question is
answered directly. Under the router's `knowledge` rule the direct answer comes first, as the
draft the router compares with the question: a question the model knows returns that draft as
it is (one generator call), one it does not runs the routed pipeline too (the draft's call then
shows in the record's usage). Under `corpus-match` the router decides from the question alone.
The decision and its features are kept in the trace (`RouteTrace`: its `route`, beside the
trace of the pipeline that answered), and the report compares its answers with the model
alone's (`direct`) question by question.

What composition builds for it, it declares here: the routed pipeline (`inner`), planned and
built with the run's own, and the router (`part`), whose sentence encoder loads before any
model so that a missing encoder fails first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, replace
from typing import TYPE_CHECKING

from pydantic import Field

from sieverag.inference.core.errors import ConfigError, ModelNotFoundError
from sieverag.inference.core.settings import Section, settings
from sieverag.inference.core.types import Example
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.pipelines.auto.retrieval_router import (
    ROUTER_SECTION,
    RouteDecision,
    Router,
    RouterConfig,
)
from sieverag.inference.pipelines.pipeline_registry import (
    PartInputs,
    PipelineContext,
    PipelineOutput,
    PipelineSettings,
    build_pipeline,
    default_pipeline,
    register_pipeline,
)
from sieverag.inference.pipelines.simple import DirectPipeline
from sieverag.inference.pipelines.traces import PipelineTrace

if TYPE_CHECKING:
    from sieverag.inference.retrieval.dense import Encoder

NAME = "auto"


@settings
class AutoConfig:
    """What `auto` runs when its router retrieves."""

    routed_pipeline: str = field(default_factory=default_pipeline, metadata={
        "help": "the pipeline `auto` runs when its router retrieves (any registered one but "
                "`auto`; default: the run's default pipeline, vanilla)"})

    def __post_init__(self) -> None:
        if self.routed_pipeline == NAME:
            raise ConfigError("auto.routed_pipeline cannot be `auto` itself")


# `routed_pipeline` was a run config's own key before `auto` became a package: read there still.
AUTO_SECTION = Section(NAME, AutoConfig, "what the `auto` pipeline routes to",
                       moved_keys=("routed_pipeline",))


def router_encoder(config: RouterConfig) -> Encoder | None:
    """The sentence encoder of the knowledge rule (None under `corpus-match`). The model loads
    once per process per name, so the trust metrics' encoder of the same model shares it."""
    if config.rule != "knowledge":
        return None
    from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

    try:
        return make_encoder(DenseConfig(model=config.embedding_model))
    except ModelNotFoundError as error:
        raise ConfigError(f"router.embedding_model: {error} (or choose router.rule "
                          "`corpus-match`, which needs no encoder)") from None


def build_router(inputs: PartInputs) -> Callable[[LLMBackend], Router]:
    """The run's router: its encoder now (before the models), the router once the generator
    (its self-check's model) exists."""
    config = inputs.settings(RouterConfig)
    encoder = router_encoder(config)
    return lambda generator: Router(config, index=inputs.index, embed=encoder,
                                    backend=generator if config.self_check else None)


def routed(settings: PipelineSettings) -> tuple[str]:
    return (settings(AutoConfig).routed_pipeline,)


class RouteTrace(PipelineTrace):
    """`auto`'s trace: its routing decision, beside the trace of the pipeline that answered
    (the routed one's, or none for a direct answer)."""

    route: RouteDecision = Field(description="the router's decision")

    def retrieval_decision(self) -> bool:
        return self.route.retrieve


def render_route(trace: RouteTrace) -> str:
    """The router's decision in a line."""
    route = trace.route
    return f"Router: {'retrieve' if route.retrieve else 'answer directly'} ({route.reason})"


# Its documents are its routed pipeline's, which the run counts among its pipelines.
@register_pipeline(NAME, reads_documents=False, sections=[AUTO_SECTION, ROUTER_SECTION],
                   inner=routed, part=build_router, trace=RouteTrace, render_trace=render_route,
                   trace_beside_inner=True, compares_with=DirectPipeline.name)
class AutoPipeline:
    """Route each question to retrieval (the routed pipeline) or to a direct answer."""

    name = NAME

    def __init__(self, context: PipelineContext) -> None:
        router = context.part(NAME, "router")
        if not isinstance(router, Router):
            raise ConfigError(f"the `auto` pipeline's part must be a Router, got "
                              f"{type(router).__name__}")
        self.router = router
        self.routed = build_pipeline(context.settings(AutoConfig).routed_pipeline, context)
        self.direct = DirectPipeline(context)

    def run(self, example: Example) -> PipelineOutput:
        if self.router.needs_draft:
            draft = self.direct.run(example)
            decision = self.router.decide(example.question, draft=draft.raw_answer)
            output = self.routed.run(example) if decision.retrieve else draft
        else:
            decision = self.router.decide(example.question)
            output = (self.routed if decision.retrieve else self.direct).run(example)
        return replace(output, trace={**output.trace, **RouteTrace(route=decision).to_json()})
