"""Who runs each model role of a run — generator, judge, filter — in-process or served; shared by
every command that calls models by role (`eval`, `ask`, `demo`, `eval-filter`). The card a
filter role's scores are read by is `filters.card.filter_card`'s."""

from __future__ import annotations

from dataclasses import field, replace

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import settings
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.card.filter_card import RETRIEVAL_ONLY
from sieverag.inference.llm.backend_registry import BackendSpec


@settings
class ModelRoles:
    """The three model roles, each in-process (model + optional adapter) or served (endpoint +
    model name): the generator answers; the judge (MAIN-RAG, training-free) scores documents
    on a base model; the filter (MCF) is the trained LoRA adapter.

    `filter_card` lives here, not on the filter's `BackendSpec`: a spec says how a model is
    reached, which every role shares, while the card says how the filter's scores are read
    (`filter_card`), which only a served filter role needs named; an in-process filter's card
    is its adapter's, so naming one there is refused."""

    generator: BackendSpec = field(default_factory=BackendSpec,
                                   metadata={"help": "the model that answers"})
    judge: BackendSpec | None = field(default=None, metadata={
        "help": "the MAIN-RAG judge's model (unset: the generator's; once any judge field is "
                "set, its unset fields take their own defaults, not the generator's)"})
    filter: BackendSpec = field(default_factory=BackendSpec, metadata={
        "help": "the trained filter: in-process, its base `model` and `adapter` (a folder or "
                f"a filter's name; default {DEFAULT_FILTER_NAME}: installed, else shipped); "
                "served, `endpoint` and the served adapter's `model` name"})
    filter_card: str | None = field(default=None, metadata={
        "help": "a served filter's card, which says how its scores are read: a filter's name "
                "(`sieverag filter list`) or an adapter folder holding one, or "
                f"{RETRIEVAL_ONLY} (rank by BM25 + dense alone, on purpose); unset: the card "
                "the server shows on /v1/models (sieverag's server does), else the installed "
                "or shipped filter of the served name, else an error"})

    def __post_init__(self) -> None:
        if self.filter_card is not None and self.filter.endpoint is None:
            raise ConfigError(
                f"models.filter_card {self.filter_card!r} names the card of a served filter; "
                "an in-process filter's card is its adapter's (models.filter.adapter): unset "
                "filter_card")

    @property
    def judge_spec(self) -> BackendSpec:
        return self.judge or self.generator


def resolve_filter_role(spec: BackendSpec) -> BackendSpec:
    """An in-process filter role with its adapter resolved to a checked folder (the given
    path or name, else the default filter); a served filter as it is."""
    if spec.endpoint is not None:
        return spec
    folder = resolve_filter(spec.adapter or DEFAULT_FILTER_NAME, spec.model)
    return replace(spec, adapter=str(folder))
