"""The typed, validated configuration of an evaluation run (`config.yaml` in a run folder)."""

from __future__ import annotations

from dataclasses import field, replace
from pathlib import Path
from typing import Any

from sieverag.inference.agents.answer_extraction import AnswerExtraction
from sieverag.inference.agents.roles import ModelRoles
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import (
    at_least,
    load_settings,
    reads_old_keys,
    settings,
    settings_to_yaml,
)
from sieverag.inference.core.types import Device
from sieverag.inference.data.dataset_fields import dataset_field, dataset_format_field, limit_field
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.metrics.trust import (
    ALIGNMENT_THRESHOLD,
    NOISE_THRESHOLD,
    SUPPORT_THRESHOLD,
    QualityWeights,
    TAASWeights,
)
from sieverag.inference.pipelines.pipeline_registry import (
    ANSWER_GENERATION,
    PIPELINES,
    default_pipeline,
    with_pipeline_sections,
)
from sieverag.inference.retrieval.config import SearchConfig
from sieverag.inference.retrieval.hygiene import HygienePreset
from sieverag.inference.retrieval.index_folder import SearchMode
from sieverag.inference.retrieval.search_backend import IndexSource


@settings
class RetrievalConfig(IndexSource):
    """Retrieve each question's documents from an index instead of the dataset's own: a local
    folder (`index`), `sieverag index serve` (`endpoint`) or Milvus (`backend`, `uri`); every
    search (the question's, and the later queries of iterative pipelines) is fused by
    `search`, reranked by `reranker` when set, then cleaned by `hygiene`, keeping k."""

    mode: SearchMode = field(default="hybrid", metadata={"help": "bm25, dense, hybrid or rrf"})
    k: int = field(default=5, metadata={"help": "documents retrieved per query"})
    hygiene: HygienePreset = field(default="off", metadata={
        "help": "evidence hygiene: off, loose or strict (drops non-informative chunks; each "
                "record lists what it removed, in hygiene_removed)"})
    search: SearchConfig = field(default_factory=SearchConfig, metadata={
        "help": "how searches fuse (alpha: the dense weight of hybrid) and rerank"})
    reranker: str | None = field(default=None, metadata={
        "help": "local cross-encoder model folder to rerank the hits (default: none)"})

    def __post_init__(self) -> None:
        IndexSource.__post_init__(self)
        at_least(1, "retrieval.", k=self.k)
        if self.reranker is not None and not self.reranker.strip():
            raise ConfigError("retrieval.reranker must name a local cross-encoder model "
                              "folder, or be left unset")


# Trust keys before the answer-grading LLM was named the grader, "judge" being the MAIN-RAG
# judge's name (docs/compatibility.md): a config.yaml of an older run still reads.
_OLD_TRUST_KEYS = {"llm_judge": "llm_grader", "judge_model": "grader_model"}


@settings
class TrustConfig:
    """Trust-aware metrics computed for every answer (inference/metrics/trust.py); the old keys
    `llm_judge` and `judge_model` are read as `llm_grader` and `grader_model`."""

    enabled: bool = field(default=True, metadata={"help": "compute trust metrics"})
    embedding_model: str = field(default="all-minilm-l6-v2",
                                 metadata={"help": "sentence encoder of the trust metrics"})
    embedding_device: Device = field(default="auto", metadata={
        "help": "device of the trust metrics' sentence encoder: auto, cpu, cuda or cuda:N"})
    alignment_threshold: float = field(default=ALIGNMENT_THRESHOLD, metadata={
        "help": "the study's τ: cosine at which a retrieved chunk supports an answer sentence "
                "(sentence_support_rate; the study gives no value)"})
    support_threshold: float = field(default=SUPPORT_THRESHOLD, metadata={
        "help": "ours: cosine at which a context sentence supports an answer sentence "
                "(sentence_support_by_sentence, sentence_context_precision)"})
    noise_threshold: float = field(default=NOISE_THRESHOLD, metadata={
        "help": "ours: cosine to the question under which a context sentence is noise "
                "(sentence_evidence_noise)"})
    quality: QualityWeights = field(default_factory=QualityWeights,
                                    metadata={"help": "AQS weights"})
    taas: TAASWeights = field(default_factory=TAASWeights, metadata={
        "help": "sentence TAAS weights when the answer retrieved (the study's TAAS has fixed "
                "weights)"})
    llm_grader: bool = field(default=False,
                             metadata={"help": "also grade answers 1-5 with an LLM grader"})
    grader_model: BackendSpec | None = field(default=None, metadata={
        "help": "the LLM grader's model, in-process or served (unset: the models.judge role's, "
                "which is the generator's unless set: the generator then grades itself, and "
                "the summary says so)"})

    _read_old_keys = reads_old_keys(_OLD_TRUST_KEYS)

    def __post_init__(self) -> None:
        for name in ("alignment_threshold", "support_threshold", "noise_threshold"):
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise ConfigError(f"trust.{name} is a cosine in [-1, 1], got {value}")


# Every command that runs pipelines (eval's RunConfig, demo, ask) declares `models` with this
# field, and takes the pipelines' settings sections with `@with_pipeline_sections`, so each
# flag and its help read the same everywhere.
def models_field() -> Any:
    """`models`: who runs each role."""
    return field(default_factory=ModelRoles, metadata={
        "help": "who runs each role: generator, judge, filter"})


@settings
@with_pipeline_sections
class RunConfig:
    """Everything that determines a run's results; `provenance` only records where it ran.
    After its own fields come the settings sections the pipelines declare (`amber`, `judge`,
    `mcf`, `iter_retgen`, `router`, ...: see `sieverag.inference.pipelines.pipeline_registry`)."""

    dataset: str = dataset_field()
    pipelines: tuple[str, ...] = field(default=(default_pipeline(),), metadata={
        "help": "pipeline names: " + ", ".join(sorted(PIPELINES))})
    dataset_format: str = dataset_format_field()
    limit: int | None = limit_field()
    question_ids: str | None = field(default=None, metadata={
        "help": "file of example ids to evaluate, one a line (e.g. build-dataset's "
                "validation_ids.txt: the questions a filter was not trained on); limit then "
                "keeps the first N of them in dataset order"})
    max_documents: int | None = field(default=None,
                                      metadata={"help": "read at most N documents per example"})
    models: ModelRoles = models_field()
    generation: GenerationSettings = field(
        default=ANSWER_GENERATION,
        metadata={"help": "decoding of the generator's answers"})
    answer_extraction: AnswerExtraction = field(
        default="first_sentence", metadata={"help": "none, first_line, first_sentence"})
    retrieval: RetrievalConfig | None = field(
        default=None, metadata={"help": "retrieve from an index; default: given documents"})
    trust: TrustConfig = field(default_factory=TrustConfig)
    seed: int = field(default=0, metadata={"help": "seed for any sampling"})
    provenance: dict = field(default_factory=dict,
                             metadata={"help": "written by the runner; ignored when comparing"})

    def __post_init__(self) -> None:
        if not self.pipelines:
            raise ConfigError("pipelines must name at least one pipeline")
        at_least(1, limit=self.limit, max_documents=self.max_documents)

    def without_provenance(self) -> RunConfig:
        return replace(self, provenance={})

    def to_yaml(self) -> str:
        return settings_to_yaml(self)


def load_run_config(path: str | Path) -> RunConfig:
    """Read a run config YAML strictly (unknown keys and bad values are errors)."""
    return load_settings(RunConfig, path)

