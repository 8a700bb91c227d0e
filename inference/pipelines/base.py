"""What every pipeline shares: its output record, its context, the registry and the reader."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sieverag.inference.answers import AnswerExtraction, extract_answer
from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.base import FilterResult
from sieverag.inference.filters.judge import JudgeConfig
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.pipelines.amber_config import AmberConfig
from sieverag.inference.pipelines.iter_retgen_config import IterRetGenConfig
from sieverag.inference.pipelines.router import Router
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.types import Document, Example


@dataclass(frozen=True)
class PipelineOutput:
    """One question's result: the scored answer, the raw reply, what the generator read, and
    the pipeline's trace as JSON-ready data (amber: an `AmberTrace`, dumped; `auto` adds its
    `route`)."""

    answer: str
    raw_answer: str
    documents_read: tuple[Document, ...]
    filter_result: FilterResult | None = None
    trace: dict = field(default_factory=dict)


DocumentSource = Callable[[Example], Sequence[Document]]
# (query, k) → the top-k documents for the query, best first (an index search).
QuerySearch = Callable[[str, int], Sequence[Document]]


def given_documents(example: Example) -> Sequence[Document]:
    """The default document source: the documents the dataset hands over."""
    return example.documents


@dataclass(frozen=True)
class PipelineContext:
    """Everything a pipeline may use; built once per run and shared by its pipelines."""

    generator: LLMBackend
    judge_backend: LLMBackend  # the MAIN-RAG judge's model
    generation: GenerationSettings = GenerationSettings(max_new_tokens=32)
    judge: JudgeConfig = JudgeConfig()
    answer_extraction: AnswerExtraction = "first_sentence"
    documents: DocumentSource = given_documents
    router: Router | None = None
    routed_pipeline: str = "vanilla"
    mcf_backend: LLMBackend | None = None  # the trained filter; None where none is set up
    mcf: MCFConfig = MCFConfig()
    amber: AmberConfig = AmberConfig()
    iter_retgen: IterRetGenConfig = IterRetGenConfig()
    search: QuerySearch | None = None  # query-based search where an index is used


class Pipeline(Protocol):
    name: str

    def run(self, example: Example) -> PipelineOutput: ...


PipelineFactory = Callable[[PipelineContext], Pipeline]
# The filter a pipeline runs (a name of `filters.registry`), given the run's amber settings.
FilterStage = Callable[[AmberConfig], "str | None"]


def _no_filter(amber: AmberConfig) -> str | None:
    return None


@dataclass(frozen=True)
class PipelineEntry:
    """A registered pipeline: how it is built, and what it declares it needs (composition
    reads these; nothing else keeps facts about a pipeline by its name)."""

    build: PipelineFactory
    reads_documents: bool  # False: it answers without any (given or retrieved) document
    filter_stage: FilterStage  # its filter; one that needs training loads the trained filter


PIPELINES: dict[str, PipelineEntry] = {}


def register_pipeline(name: str, *, reads_documents: bool = True,
                      filter_stage: FilterStage = _no_filter,
                      ) -> Callable[[PipelineFactory], PipelineFactory]:
    """Class decorator adding a pipeline to the registry under `name`, with what it needs."""

    def add(factory: PipelineFactory) -> PipelineFactory:
        PIPELINES[name] = PipelineEntry(factory, reads_documents, filter_stage)
        return factory

    return add


def pipeline_entry(name: str) -> PipelineEntry:
    """The pipeline registered as `name`; a ConfigError listing the known ones if none is."""
    if name not in PIPELINES:
        raise ConfigError(f"unknown pipeline {name!r} (known: {', '.join(sorted(PIPELINES))})")
    return PIPELINES[name]


def build_pipeline(name: str, context: PipelineContext) -> Pipeline:
    """Instantiate the pipeline registered as `name`."""
    return pipeline_entry(name).build(context)


def question_text(example: Example) -> str:
    """The question as the model sees it; multiple-choice options are listed under it."""
    if not example.choices:
        return example.question
    options = "\n".join(f"{label}. {text}" for label, text in example.choices.items())
    return f"{example.question}\n{options}\nAnswer with the letter of the correct option."


def format_documents(documents: Sequence[Document]) -> str:
    """Documents numbered in reading order, each with its title line."""
    return "\n\n".join(f"[{i}] {d.as_context()}" for i, d in enumerate(documents, start=1))


class Reader:
    """The final generator call shared by all pipelines (MAIN-RAG's Agent-3 among them)."""

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.with_documents = load_template("answer_with_documents")
        self.without_documents = load_template("answer_direct")

    def answer(self, example: Example, documents: Sequence[Document]) -> tuple[str, str]:
        """(extracted answer, raw reply) from the given documents, or none."""
        question = question_text(example)
        if documents:
            prompt = self.with_documents.messages(question=question,
                                                  documents=format_documents(documents))
        else:
            prompt = self.without_documents.messages(question=question)
        raw = self.context.generator.generate([prompt], self.context.generation,
                                              agent="generator")[0]
        return extract_answer(raw, example.question, self.context.answer_extraction), raw
