"""Composition: a run config's model roles and sources → the objects pipelines use.

One place decides who runs what, for every command (`eval`, `ask`, `demo`, `eval-filter`):
* `resolve_roles(config)` — the trained filter's adapter found by path or name (installed,
  else shipped) and checked against its base model and prompts, so the run's config.yaml
  names the adapter folder it used;
* `build_roles(models)` — one backend per role (`generator`, `judge`, `filter`); roles with
  equal specs share one backend and one loaded model;
* `build_context(config)` — the pipelines' shared context: backends, the document source
  (the dataset's own documents or an index: fused, reranked and hygiene-filtered as
  `retrieval` says, one search rule for the question and for later queries), and for a run
  with `auto` its router (with the knowledge rule's sentence encoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sieverag.inference.config import ModelRoles, RetrievalConfig, RunConfig, eval_judge_spec
from sieverag.inference.data.gold_match import mark_gold
from sieverag.inference.errors import ConfigError, ModelNotFoundError
from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.registry import NEEDS_TRAINED_FILTER
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.llm.registry import BackendSpec, build_backend
from sieverag.inference.pipelines import PipelineContext
from sieverag.inference.pipelines.base import DocumentSource, QuerySearch, pipeline_entry
from sieverag.inference.pipelines.router import Router
from sieverag.inference.retrieval.hygiene import HygieneLog, search_with_hygiene
from sieverag.inference.types import Document, Example

if TYPE_CHECKING:
    from sieverag.inference.retrieval.dense import Encoder
    from sieverag.inference.retrieval.index import Index
    from sieverag.inference.retrieval.rerank import Reranker


@dataclass(frozen=True)
class Roles:
    """The backends of the three roles (`filter` is None when no pipeline uses it)."""

    generator: LLMBackend
    judge: LLMBackend
    filter: LLMBackend | None

    def distinct(self) -> list[LLMBackend]:
        """Each backend once (roles may share one), for usage accounting."""
        backends: list[LLMBackend] = []
        for backend in (self.generator, self.judge, self.filter):
            if backend is not None and all(backend is not b for b in backends):
                backends.append(backend)
        return backends


def eval_judge(config: RunConfig) -> LLMBackend:
    """The trust metrics' LLM judge (`config.eval_judge_spec`): a role's backend when its spec
    equals that role's (`build_backend` shares one backend per spec), else one of its own."""
    return build_backend(eval_judge_spec(config))


def run_pipelines(config: RunConfig) -> frozenset[str]:
    """The pipelines a run runs: those it names, and for `auto` the pipeline it routes to."""
    pipelines = set(config.pipelines)
    if "auto" in pipelines:
        pipelines.add(config.routed_pipeline)
    return frozenset(pipelines)


def needs_trained_filter(config: RunConfig) -> bool:
    """Whether some pipeline of the run filters with a filter that needs the trained one (MCF:
    `mcf` or `stack`), as each pipeline declares its filter stage."""
    return any(pipeline_entry(p).filter_stage(config.amber) in NEEDS_TRAINED_FILTER
               for p in run_pipelines(config))


def needs_given_documents(config: RunConfig) -> bool:
    """Whether the run reads the dataset's own documents: it retrieves none from an index
    and some pipeline it runs declares that it reads documents."""
    if config.retrieval is not None:
        return False
    return any(pipeline_entry(p).reads_documents for p in run_pipelines(config))


def resolve_filter_role(spec: BackendSpec) -> BackendSpec:
    """An in-process filter role with its adapter resolved to a checked folder (the given
    path or name, else the default filter); a served filter as it is."""
    if spec.endpoint is not None:
        return spec
    folder = resolve_filter(spec.adapter or DEFAULT_FILTER_NAME, spec.model)
    return replace(spec, adapter=str(folder))


def resolve_roles(config: RunConfig) -> RunConfig:
    """`config` with the filter role's adapter resolved when a pipeline uses the filter."""
    if not needs_trained_filter(config):
        return config
    models = replace(config.models, filter=resolve_filter_role(config.models.filter))
    return replace(config, models=models)


def build_roles(models: ModelRoles, *, with_filter: bool = True) -> Roles:
    """One backend per role; the filter's adapter must be resolved (`resolve_filter_role`)."""
    return Roles(generator=build_backend(models.generator),
                 judge=build_backend(models.judge_spec),
                 filter=build_backend(models.filter) if with_filter else None)


def _capped_documents(limit: int | None) -> DocumentSource:
    def documents(example: Example) -> Sequence[Document]:
        return example.documents if limit is None else example.documents[:limit]

    return documents


def _index_search(index: Index, config: RetrievalConfig, reranker: Reranker | None,
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


def _reranker(config: RetrievalConfig) -> Reranker | None:
    """The cross-encoder of `retrieval.reranker`, or None when it is unset."""
    if config.reranker is None:
        return None
    from sieverag.inference.retrieval.rerank import CrossEncoderReranker

    try:
        return CrossEncoderReranker(config.reranker)
    except ModelNotFoundError as error:
        raise ConfigError(f"retrieval.reranker: {error} (give a local folder holding a "
                          "sentence-transformers cross-encoder)") from None


def _router_encoder(config: RunConfig) -> Encoder | None:
    """The sentence encoder of the knowledge rule, for a run with `auto` under that rule.
    The model loads once per process per name, so the trust metrics' encoder of the same
    model (the runner's) shares it."""
    if "auto" not in config.pipelines or config.router.rule != "knowledge":
        return None
    from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

    try:
        return make_encoder(DenseConfig(model=config.router.embedding_model))
    except ModelNotFoundError as error:
        raise ConfigError(f"router.embedding_model: {error} (or choose router.rule "
                          "`corpus-match`, which needs no encoder)") from None


def build_context(config: RunConfig, *, removed: HygieneLog | None = None
                  ) -> tuple[PipelineContext, Roles]:
    """The pipelines' shared context for `config` (roles resolved by `resolve_roles`), and
    the role backends (for usage). Over an index, what evidence hygiene removes from each
    search is added to `removed` (a run takes it per question)."""
    index = None
    documents = _capped_documents(config.max_documents)
    search = None
    if config.retrieval is not None:  # before the models load: a bad index fails at once
        from sieverag.inference.retrieval.index import Index

        index = Index.load(config.retrieval.index, search_config=config.retrieval.search)
        search = _index_search(index, config.retrieval, _reranker(config.retrieval), removed)
        documents = _retrieved_documents(search, config.retrieval.k)
    router_encoder = _router_encoder(config)  # also before the models: a bad name fails at once
    roles = build_roles(config.models, with_filter=needs_trained_filter(config))
    context = PipelineContext(
        generator=roles.generator,
        judge_backend=roles.judge,
        generation=GenerationSettings(max_new_tokens=config.generation.max_new_tokens),
        judge=config.judge,
        answer_extraction=config.answer_extraction,
        documents=documents,
        routed_pipeline=config.routed_pipeline,
        router=(Router(config.router, index=index, embed=router_encoder,
                       backend=roles.generator if config.router.self_check else None)
                if "auto" in config.pipelines else None),
        mcf_backend=roles.filter,
        mcf=config.mcf,
        amber=config.amber,
        iter_retgen=config.iter_retgen,
        search=search,
    )
    return context, roles
