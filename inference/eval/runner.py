"""Run pipelines over a dataset: resumable per-example jsonl, summary.json, report.md.

A run folder holds `config.yaml` (the resolved config plus provenance), `results/<pipeline>.jsonl`
(one line per finished example, appended as it finishes), `summary.json` and `report.md`.
Rerunning into the same folder skips finished examples; a different config is refused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from sieverag.inference.config import RetrievalConfig, RunConfig, load_run_config
from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.eval.datasets import load_examples
from sieverag.inference.eval.records import build_record, trust_metrics
from sieverag.inference.eval.report import write_report
from sieverag.inference.eval.summary import summarize
from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.registry import NEEDS_TRAINED_FILTER
from sieverag.inference.io_utils import JsonlLog, write_atomic
from sieverag.inference.llm.base import GenerationSettings, LLMBackend, Usage
from sieverag.inference.llm.registry import BackendSpec, build_backend
from sieverag.inference.pipelines import PipelineContext, build_pipeline
from sieverag.inference.pipelines.amber import amber_filter
from sieverag.inference.pipelines.base import DocumentSource, QuerySearch
from sieverag.inference.prompt_templates import PROMPTS_DIR, load_template
from sieverag.inference.router import Router
from sieverag.inference.types import Document, Example


def dataset_fingerprint(path: str | Path) -> str:
    """sha256 of the dataset file's bytes (first 16 hex digits)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def read_question_ids(path: str | Path) -> list[str]:
    """The ids listed in `path`, one a line (blank lines ignored)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"question ids file {path} not found")
    ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    ids = [i for i in ids if i]
    if not ids:
        raise DatasetError(f"question ids file {path} lists no id")
    return ids


def selected_examples(config: RunConfig) -> list[Example]:
    """The run's examples: the dataset (or the listed ids of it, in dataset order), first N."""
    if config.question_ids is None:
        return load_examples(config.dataset, config.dataset_format, config.limit)
    wanted = read_question_ids(config.question_ids)
    examples = [e for e in load_examples(config.dataset, config.dataset_format)
                if e.id in set(wanted)]
    missing = sorted(set(wanted) - {e.id for e in examples})
    if missing:
        raise DatasetError(f"{config.question_ids}: {len(missing)} listed id(s) are not in "
                           f"{config.dataset}, e.g. {missing[0]!r}")
    return examples[:config.limit]


def provenance(config: RunConfig) -> dict:
    """Where and with what a run was made: prompt hashes, data fingerprint, versions."""
    versions = {}
    for package in ("sieverag", "torch", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    adapter_card = (Path(config.mcf.adapter) / "sieverag_adapter.json"
                    if config.mcf.adapter else None)
    return {
        "dataset_sha256": dataset_fingerprint(config.dataset),
        "question_ids_sha256": (dataset_fingerprint(config.question_ids)
                                if config.question_ids else None),
        "filter_adapter": (json.loads(adapter_card.read_text(encoding="utf-8"))
                           if adapter_card is not None and adapter_card.is_file() else None),
        "prompt_sha256": {
            p.stem: load_template(p.stem).sha256[:16] for p in sorted(PROMPTS_DIR.glob("*.yaml"))
        },
        "versions": versions,
    }


def _check_same_run(config: RunConfig, out_dir: Path) -> None:
    existing_path = out_dir / "config.yaml"
    if not existing_path.exists():
        return
    existing = load_run_config(existing_path).without_provenance()
    if existing != config.without_provenance():
        raise ConfigError(
            f"{out_dir} holds a run with a different configuration: use another --out, or "
            f"repeat that run with `sieverag eval --config {existing_path}`"
        )


def _merged_usage(
    backends: Sequence[LLMBackend], before: Sequence[dict[str, Usage]]
) -> dict[str, Usage]:
    merged: dict[str, Usage] = {}
    for backend, snapshot in zip(backends, before, strict=True):
        for agent, usage in backend.meter.since(snapshot).items():
            merged.setdefault(agent, Usage()).add(usage)
    return merged


def _capped_documents(limit: int | None) -> DocumentSource:
    def documents(example: Example) -> Sequence[Document]:
        return example.documents if limit is None else example.documents[:limit]

    return documents


def _retrieved_documents(index, config: RetrievalConfig) -> DocumentSource:
    """Each question's top-k chunks from the index (its retrieval cache spares repeats)."""

    def documents(example: Example) -> Sequence[Document]:
        return [hit.document for hit in index.search(example.question, config.k, config.mode)]

    return documents


def _index_search(index, config: RetrievalConfig) -> QuerySearch:
    """Query-based search on the index in the configured mode (for later amber rounds)."""

    def search(query: str, k: int) -> Sequence[Document]:
        return [hit.document for hit in index.search(query, k, config.mode)]

    return search


def needs_trained_filter(config: RunConfig) -> bool:
    """Whether some pipeline of the run filters with MCF (`mcf` or `stack`)."""
    pipelines = set(config.pipelines)
    if "auto" in pipelines:
        pipelines.add(config.routed_pipeline)
    return any(amber_filter(p, config.amber) in NEEDS_TRAINED_FILTER for p in pipelines)


def _served_filter(config: RunConfig) -> bool:
    return config.filter is not None and config.filter.kind == "openai"


def with_trained_filter(config: RunConfig) -> RunConfig:
    """`config` with `mcf.adapter` resolved to the folder of the trained filter MCF runs
    in-process (the one given by path or name, else `smollm2-filter`: installed or shipped),
    checked against the filter's base model and prompts, so the run's config.yaml names the
    adapter it used. A served filter is taken as configured."""
    if not needs_trained_filter(config) or _served_filter(config):
        return config
    folder = resolve_filter(config.mcf.adapter or DEFAULT_FILTER_NAME,
                            _filter_base(config).model)
    return replace(config, mcf=replace(config.mcf, adapter=str(folder)))


def _filter_base(config: RunConfig) -> BackendSpec:
    """The in-process model the trained filter's adapter goes on."""
    return config.filter_backend if config.filter_backend.kind == "hf" else BackendSpec()


def mcf_backend_spec(config: RunConfig) -> BackendSpec | None:
    """The trained filter: the served filter when one is configured, else its base model
    in-process with `mcf.adapter` (see `with_trained_filter`); None when neither is set."""
    if _served_filter(config):
        return config.filter
    if config.mcf.adapter is None:
        return None
    return replace(_filter_base(config), adapter=config.mcf.adapter)


def build_context(config: RunConfig) -> tuple[PipelineContext, list[LLMBackend]]:
    """The pipelines' shared context for `config`, and its distinct backends (for usage)."""
    generator = build_backend(config.generator)
    filter_backend = build_backend(config.filter_backend)
    mcf_spec = mcf_backend_spec(config) if needs_trained_filter(config) else None
    mcf_backend = build_backend(mcf_spec) if mcf_spec is not None else None
    backends: list[LLMBackend] = []
    for backend in (generator, filter_backend, mcf_backend):
        if backend is not None and all(backend is not b for b in backends):
            backends.append(backend)
    index = None
    documents = _capped_documents(config.max_documents)
    search = None
    if config.retrieval is not None:
        from sieverag.inference.retrieval.index import Index

        index = Index.load(config.retrieval.index)
        documents = _retrieved_documents(index, config.retrieval)
        search = _index_search(index, config.retrieval)
    context = PipelineContext(
        generator=generator,
        filter_backend=filter_backend,
        generation=GenerationSettings(max_new_tokens=config.generation.max_new_tokens),
        judge=config.judge,
        answer_extraction=config.answer_extraction,
        documents=documents,
        routed_pipeline=config.routed_pipeline,
        router=Router(config.router, index=index,
                      backend=generator if config.router.self_check else None),
        mcf_backend=mcf_backend,
        mcf=config.mcf,
        amber=config.amber,
        search=search,
    )
    return context, backends


def run_evaluation(config: RunConfig, out_dir: str | Path, *, progress: bool = True) -> dict:
    """Run every pipeline of `config` on its dataset into `out_dir`; returns the summaries."""
    out_dir = Path(out_dir)
    config = with_trained_filter(config)
    examples = selected_examples(config)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"{config.dataset}: example id {duplicate!r} appears more than once")
    _check_same_run(config, out_dir)
    config = replace(config, provenance=provenance(config))
    write_atomic(out_dir / "config.yaml", config.to_yaml())

    random.seed(config.seed)
    import torch

    torch.manual_seed(config.seed)
    context, backends = build_context(config)
    embed = None
    if config.trust.enabled:
        from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

        embed = make_encoder(DenseConfig(model=config.trust.embedding_model))
    llm_judge = context.generator if config.trust.llm_judge else None
    all_records: dict[str, list[dict]] = {}
    for name in config.pipelines:
        pipeline = build_pipeline(name, context)
        log = JsonlLog(out_dir / "results" / f"{name}.jsonl")
        records = [r for r in log.read() if r.get("id") in set(ids)]
        done = {r["id"] for r in records}
        todo = [e for e in examples if e.id not in done]
        for example in tqdm(
            todo, desc=name, unit="q", disable=not progress, initial=len(done), total=len(examples)
        ):
            before = [b.meter.snapshot() for b in backends]
            start = time.perf_counter()
            output = pipeline.run(example)
            record = build_record(
                example, output, _merged_usage(backends, before), time.perf_counter() - start
            )
            if config.trust.enabled:
                record["trust"] = trust_metrics(example, output, embed,
                                                config.trust.support_threshold, llm_judge)
            log.append(record)
            records.append(record)
        order = {example_id: i for i, example_id in enumerate(ids)}
        all_records[name] = sorted(records, key=lambda r: order[r["id"]])
    summaries = {name: summarize(records) for name, records in all_records.items()}
    write_atomic(
        out_dir / "summary.json",
        json.dumps({"dataset": config.dataset, "pipelines": summaries}, indent=2) + "\n",
    )
    write_report(out_dir, config.dataset, summaries, all_records)
    return summaries
