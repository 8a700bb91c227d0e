"""Composition: a run config's model roles and sources → the objects pipelines use.

One place decides who runs what, for every command (`eval`, `ask`, `demo`, `judge-sweep`),
in two steps:
* `plan_run(config)` reads the config once, with what each pipeline declares
  (`pipelines.pipeline_registry.register_pipeline`), into the `RunPlan` every command then
  reads, never the config again: the pipelines the run runs (and those they run inside
  them), the model roles they call and each role's spec (`RunPlan.role_specs`), whether the
  trust metrics' LLM grader runs and on which model (`RunPlan.grader`), whether they read the
  dataset's own documents, and the trained filter's adapter found by path or name (installed,
  else shipped) and checked against its base model and prompts — so the run's config.yaml
  names the adapter folder it used;
* `build_context(plan)` builds what the plan says: one backend per spec of `role_specs` and
  the grader's (roles with equal specs share one backend and one loaded model,
  `llm.backend_registry.build_backend`), the document source (the dataset's own documents or
  an index: fused, reranked and hygiene-filtered as `retrieval` says, one search rule for the
  question and for later queries), and the part each pipeline declares it needs (auto: its
  router), begun before the models load so that a part that cannot load fails first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sieverag.inference.agents.roles import resolve_filter_role
from sieverag.inference.composition.config import RetrievalConfig, RunConfig
from sieverag.inference.core.errors import ConfigError, ModelNotFoundError
from sieverag.inference.core.types import Document, Example, check_device_present
from sieverag.inference.data.gold_match import mark_gold
from sieverag.inference.filters.card.filter_card import FilterCard
from sieverag.inference.filters.embeddings import round_vectors
from sieverag.inference.filters.home import RoundVectors
from sieverag.inference.filters.mcf import MCFConfig, dataset_home
from sieverag.inference.filters.role_card import filter_card
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.inference.llm.call_batching import CallBatcher, on_batcher
from sieverag.inference.pipelines import PipelineContext
from sieverag.inference.pipelines.pipeline_registry import (
    DocumentSource,
    PartInputs,
    PipelineSettings,
    QuerySearch,
    pipeline_entry,
    pipeline_settings,
    pipelines_run,
)
from sieverag.inference.retrieval.hygiene import HygieneLog, search_with_hygiene

if TYPE_CHECKING:
    from sieverag.inference.retrieval.rerank import HitReranker
    from sieverag.inference.retrieval.search_backend import SearchBackend


@dataclass(frozen=True)
class RunPlan:
    """What a run needs, decided once from its config (`plan_run`): the commands read these
    decisions here, not from the config."""

    config: RunConfig  # the filter role's adapter resolved where the run calls the filter
    pipelines: frozenset[str]  # those it names, and those they run inside them
    settings: PipelineSettings  # the pipelines' settings sections
    roles: frozenset[str]  # the model roles its pipelines call
    # The spec of each role the run builds a backend for: the generator always, the judge and
    # the filter (its adapter resolved) where `roles` has them.
    role_specs: Mapping[str, BackendSpec]
    grader: BackendSpec | None  # the trust metrics' LLM grader's model; None: no grader runs
    reads_given_documents: bool  # no index, and some pipeline reads documents

    @property
    def trained_filter(self) -> BackendSpec | None:
        """The filter role's spec where the run calls the trained filter."""
        return self.role_specs.get("filter")

    @functools.cached_property
    def filter_card(self) -> FilterCard | None:
        """The card the trained filter's scores are read by (`filter_card.filter_card`; None:
        the run calls no filter), read once on first use, before the run writes anything: a
        served filter with no card fails there, and its corrected command reruns in the same
        folder."""
        spec = self.trained_filter
        return filter_card(spec, self.config.models.filter_card) if spec is not None else None

    @property
    def ranking(self) -> str | None:
        """Which score the run's trained filter ranks passages by, and why
        (`FilterCard.ranking_statement`): the line a command prints at start; None: the run
        calls no filter."""
        card = self.filter_card
        return None if card is None else card.ranking_statement(self.settings(MCFConfig))

    @property
    def model_specs(self) -> list[BackendSpec]:
        """The spec of every model the run calls: its roles', and the grader's."""
        return [*self.role_specs.values(), *([self.grader] if self.grader is not None else [])]

    @property
    def all_served(self) -> bool:
        """Every model the run calls is served (none runs in-process)."""
        return all(spec.endpoint is not None for spec in self.model_specs)

    @property
    def logs_hygiene(self) -> bool:
        """The run searches an index with evidence hygiene on: what it removes is recorded
        per question."""
        return self.config.retrieval is not None and self.config.retrieval.hygiene != "off"


def plan_run(config: RunConfig) -> RunPlan:
    """The plan of a run: what its pipelines declare they need, for this config."""
    settings = pipeline_settings(config)
    names = pipelines_run(config.pipelines, settings)
    entries = [pipeline_entry(name) for name in sorted(names)]
    roles = frozenset().union(*(entry.roles_in(settings) for entry in entries))
    if "filter" in roles:
        models = replace(config.models, filter=resolve_filter_role(config.models.filter))
        config = replace(config, models=models)
    models = config.models
    role_specs = {role: spec for role, spec in (("generator", models.generator),
                                                ("judge", models.judge_spec),
                                                ("filter", models.filter))
                  if role == "generator" or role in roles}
    return RunPlan(config=config, pipelines=frozenset(names), settings=settings, roles=roles,
                   role_specs=role_specs, grader=_grader(config),
                   reads_given_documents=(config.retrieval is None
                                          and any(e.reads_documents for e in entries)))


def with_dataset_home(plan: RunPlan, examples: Sequence[Example], name: str,
                      vectors: RoundVectors = round_vectors) -> tuple[RunPlan, str | None]:
    """The plan with MCF's `home` decided once for the whole dataset (`mcf.dataset_home`:
    home where its questions' mean P(home) reaches the card's dataset bar), where the run
    ranks by a trained filter's card with a home rule, `mcf.home` is auto and the run reads
    the dataset's own passages; and the line that says why (None: nothing decided). A run
    that retrieves its passages tests each round on its own."""
    card = plan.filter_card
    if card is None or not plan.reads_given_documents:
        return plan, None
    mcf = plan.settings(MCFConfig)
    mode, line = dataset_home(mcf, card.combination,
                              [(e.question, e.documents) for e in examples], name, vectors)
    if mode == mcf.home:
        return plan, line
    return replace(plan, settings=plan.settings.with_section(replace(mcf, home=mode))), line


def _grader(config: RunConfig) -> BackendSpec | None:
    """The trust metrics' LLM grader's model where the run grades answers (`trust.enabled`
    and `trust.llm_grader`): `trust.grader_model`, else the MAIN-RAG judge role's (itself
    the generator's unless `models.judge` is set); None: no grader runs."""
    trust = config.trust
    if not (trust.enabled and trust.llm_grader):
        return None
    return trust.grader_model or config.models.judge_spec


@dataclass(frozen=True)
class Roles:
    """The backends of the roles a run calls (None: a role no pipeline of the run calls), and
    the trust metrics' LLM grader where the run grades answers."""

    generator: LLMBackend
    judge: LLMBackend | None = None
    filter: LLMBackend | None = None
    grader: LLMBackend | None = None



def build_roles(plan: RunPlan, batcher: CallBatcher | None = None) -> Roles:
    """One backend per spec of `plan.role_specs`, and the grader's where `plan.grader` names
    one (a backend per spec: a grader on a role's spec shares that role's). With `batcher`,
    in-process backends run their calls on it, merged across the questions in flight
    (`llm.call_batching`)."""
    check_role_devices(plan.role_specs)
    grader = plan.grader
    # A grader of its own (`trust.grader_model`) is checked under that name; else it runs on
    # the judge role's spec.
    if (grader is not None and grader.endpoint is None
            and plan.config.trust.grader_model is not None):
        check_device_present(grader.device, "trust.grader_model.device")
    build = functools.partial(role_backend, batcher=batcher)
    backends = {role: build(spec) for role, spec in plan.role_specs.items()}
    return Roles(**backends, grader=build(grader) if grader is not None else None)


def check_role_devices(role_specs: Mapping[str, BackendSpec]) -> None:
    """Every in-process role of `role_specs` (`RunPlan.role_specs`) names a device this
    machine has, before any model loads: else one ConfigError naming the role's setting and
    the GPUs there are (e.g. `models.filter.device is cuda:3, but this machine has 2 CUDA
    GPUs`)."""
    for role, spec in role_specs.items():
        if spec.endpoint is None:
            check_device_present(spec.device, f"models.{role}.device")


def role_backend(spec: BackendSpec, batcher: CallBatcher | None = None) -> LLMBackend:
    """The backend of one role (`build_backend`), on `batcher` when given and in-process."""
    return on_batcher(build_backend(spec), spec.endpoint is not None, batcher)


def _capped_documents(limit: int | None) -> DocumentSource:
    def documents(example: Example) -> Sequence[Document]:
        return example.documents if limit is None else example.documents[:limit]

    return documents


def _index_search(index: SearchBackend, config: RetrievalConfig, reranker: HitReranker | None,
                  removed: HygieneLog | None) -> QuerySearch:
    """Query-based search on the index as `config` says (mode, reranker, evidence hygiene);
    what hygiene removes goes to `removed`."""

    def search(query: str, k: int) -> Sequence[Document]:
        report = search_with_hygiene(index, query, k, config.mode, config.hygiene, reranker)
        if removed is not None:
            removed.add(report.removed)
        return [hit.document for hit in report.kept]

    return search


def _retrieved_documents(search: QuerySearch, k: int) -> DocumentSource:
    """Each question's top-k chunks from the index (its retrieval cache spares repeats),
    marked gold from the question's given passages (`inference.data.gold_match`)."""

    def documents(example: Example) -> Sequence[Document]:
        return mark_gold(example, search(example.question, k))

    return documents


def _reranker(config: RetrievalConfig) -> HitReranker | None:
    """The cross-encoder of `retrieval.reranker`, or None when it is unset."""
    if config.reranker is None:
        return None
    from sieverag.inference.retrieval.rerank import CrossEncoderReranker

    try:
        return CrossEncoderReranker(config.reranker)
    except ModelNotFoundError as error:
        raise ConfigError(f"retrieval.reranker: {error} (give a local folder holding a "
                          "sentence-transformers cross-encoder)") from None


def build_context(plan: RunPlan, *, removed: HygieneLog | None = None,
                  batcher: CallBatcher | None = None) -> tuple[PipelineContext, Roles]:
    """The pipelines' shared context for a run's plan, and the role backends (for usage; with
    the LLM grader where `RunPlan.grader` names one). Over an index, what evidence hygiene
    removes from each search is added to `removed` (a run takes it per question). `batcher`:
    the in-process models' shared batcher, for many questions in flight."""
    config = plan.config
    index = None
    documents = _capped_documents(config.max_documents)
    search = None
    if config.retrieval is not None:  # before the models load: a bad index fails at once
        from sieverag.inference.retrieval.chooser import open_backend

        index = open_backend(config.retrieval, config.retrieval.search)
        search = _index_search(index, config.retrieval, _reranker(config.retrieval), removed)
        documents = _retrieved_documents(search, config.retrieval.k)
    # Each pipeline's own part, begun before the models load (a part that cannot load fails
    # first) and finished with the run's generator.
    inputs = PartInputs(settings=plan.settings, index=index)
    finish_part = {name: entry.part(inputs) for name in sorted(plan.pipelines)
                   if (entry := pipeline_entry(name)).part is not None}
    # The filter's card (read once, `RunPlan.filter_card`) before any model loads.
    card = plan.filter_card
    roles = build_roles(plan, batcher)
    context = PipelineContext(
        generator=roles.generator,
        judge_backend=roles.judge,
        generation=config.generation,
        answer_extraction=config.answer_extraction,
        documents=documents,
        mcf_backend=roles.filter,
        filter_combination=card.combination if card is not None else None,
        settings=plan.settings,
        search=search,
        parts={name: finish(roles.generator) for name, finish in finish_part.items()},
    )
    return context, roles
