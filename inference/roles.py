"""Who runs each model role of a run — generator, judge, filter — in-process or served; shared by
every command that calls models by role (`eval`, `ask`, `demo`, `eval-filter`)."""

from __future__ import annotations

from dataclasses import field, replace

from sieverag.inference.filters.adapters import (
    DEFAULT_FILTER_NAME,
    AdapterError,
    find_adapter,
    resolve_filter,
)
from sieverag.inference.llm.registry import BackendSpec
from sieverag.inference.settings import settings


@settings
class ModelRoles:
    """The three model roles, each in-process (model + optional adapter) or served (endpoint +
    model name): the generator answers; the judge (MAIN-RAG, training-free) scores documents
    on a base model; the filter (MCF) is the trained LoRA adapter."""

    generator: BackendSpec = field(default_factory=BackendSpec,
                                   metadata={"help": "the model that answers"})
    judge: BackendSpec | None = field(default=None, metadata={
        "help": "the MAIN-RAG judge's model (unset: the generator's; once any judge field is "
                "set, its unset fields take their own defaults, not the generator's)"})
    filter: BackendSpec = field(default_factory=BackendSpec, metadata={
        "help": "the trained filter: in-process, its base `model` and `adapter` (a folder or "
                f"a filter's name; default {DEFAULT_FILTER_NAME}: installed, else shipped); "
                "served, `endpoint` and the served adapter's `model` name"})

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


def filter_card_folder(spec: BackendSpec) -> str | None:
    """The adapter folder whose card (`sieverag_adapter.json`: the fitted combination, the
    training questions) describes the filter role `spec` (resolved by `resolve_filter_role`):
    an in-process filter's adapter; for a served filter, the installed or shipped filter that
    its served `model` name names (serve a filter under its own name, e.g. `sieverag serve
    --adapters smollm2-filter=smollm2-filter`); None for any other served name."""
    if spec.endpoint is None:
        return spec.adapter
    try:
        return str(find_adapter(spec.model or "").path)
    except AdapterError:
        return None
