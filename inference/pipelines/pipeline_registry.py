"""What every pipeline shares: its output record, its context, the registry and the reader.

A pipeline is one module of this package, or one package when it has parts (`amber/`,
`auto/`): its class, registered with `register_pipeline`, which declares what it needs —
whether it reads documents, its filter stage, the model roles it calls, the settings sections
it reads (each nested under the run config by its key), the other pipelines it runs inside it
and the part composition must build for it (auto: its router); and, for evaluation, its trace
(the model and the renderer `sieverag trace` shows it with, `traces.py`), the pipeline its
answers are compared with question by question, and whether a judge sweep may run it.
Composition, evaluation and the commands read these declarations and name no pipeline;
importing the package imports every module in it, so a new pipeline module needs no other
file changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from sieverag.inference.agents.answer_extraction import AnswerExtraction, extract_answer
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.settings import Section, with_sections
from sieverag.inference.core.types import Document, Example
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.document_filter import FilterResult
from sieverag.inference.filters.filter_registry import FILTER_ROLES
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend
from sieverag.inference.pipelines.traces import (
    PipelineTrace,
    TraceDeclaration,
    TraceRenderer,
    check_declaration,
)

T = TypeVar("T")
Role = Literal["generator", "judge", "filter"]
ROLES: tuple[Role, ...] = ("generator", "judge", "filter")

# How the generator writes an answer unless the run says otherwise (a run config's
# `generation:` section defaults to it too).
ANSWER_GENERATION = GenerationSettings(max_new_tokens=32)


@dataclass(frozen=True)
class PipelineOutput:
    """One question's result: the scored answer, the raw reply, what the generator read, and
    the pipeline's trace as JSON-ready data (its declared trace model, dumped; empty where it
    records none)."""

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


class PipelineSettings:
    """A run's settings sections by class: `settings(AmberConfig)` is the run's `amber`
    section, or the class's defaults where the run gives none."""

    def __init__(self, sections: Iterable[object] = ()) -> None:
        self._by_class = {type(section): section for section in sections}

    def __call__(self, cls: type[T]) -> T:
        found = self._by_class.get(cls)
        return found if found is not None else cls()

    def with_section(self, section: object) -> PipelineSettings:
        """These settings with `section` in place of the run's section of its class."""
        return PipelineSettings({**self._by_class, type(section): section}.values())


@dataclass(frozen=True)
class PipelineContext:
    """Everything a pipeline may use; built once per run and shared by its pipelines."""

    generator: LLMBackend
    judge_backend: LLMBackend | None = None  # the MAIN-RAG judge's model, where a pipeline uses it
    generation: GenerationSettings = ANSWER_GENERATION
    answer_extraction: AnswerExtraction = "first_sentence"
    documents: DocumentSource = given_documents
    mcf_backend: LLMBackend | None = None  # the trained filter; None where none is set up
    filter_combination: Combination | None = None  # its card's combination (MCF's score)
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    search: QuerySearch | None = None  # query-based search where an index is used
    # The parts composition built for the run's pipelines, by pipeline name (`register_pipeline`
    # `part=`; auto: its router).
    parts: Mapping[str, object] = field(default_factory=dict)

    def part(self, pipeline: str, what: str = "part") -> object:
        """The part built for `pipeline` (`what` it is, for the error); a ConfigError where the
        context was made without it."""
        if pipeline not in self.parts:
            raise ConfigError(f"the {pipeline!r} pipeline needs its {what} in the context "
                              "(`inference.compose.build_context` builds it; in code, pass "
                              f"`parts={{{pipeline!r}: ...}}` to PipelineContext)")
        return self.parts[pipeline]


class Pipeline(Protocol):
    name: str

    def run(self, example: Example) -> PipelineOutput: ...


PipelineFactory = Callable[[PipelineContext], Pipeline]
# The filter a pipeline runs (a name of `filters.filter_registry`, or None), given the run's
# settings.
FilterStage = Callable[[PipelineSettings], "str | None"]


def _no_filter(settings: PipelineSettings) -> str | None:
    return None


# The other registered pipelines a pipeline runs inside it, given the run's settings (auto: the
# routed pipeline its own section names); composition plans and builds them with the run's.
InnerPipelines = Callable[[PipelineSettings], Iterable[str]]


def _no_inner(settings: PipelineSettings) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class PartInputs:
    """What composition hands a pipeline's part builder: the run's settings sections, and its
    index (a `retrieval.search_backend.SearchBackend`: a local folder, a served index or Milvus;
    None over the dataset's own documents)."""

    settings: PipelineSettings
    index: object | None = None


# Builds a pipeline's own part for a run (auto: its router). Composition calls it before any
# model loads, so a part that cannot load fails first; it returns the step that finishes the
# part once the run's generator exists.
PartBuilder = Callable[[PartInputs], Callable[[LLMBackend], object]]


@dataclass(frozen=True)
class PipelineEntry:
    """A registered pipeline: how it is built, and what it declares it needs (composition
    and the commands read these; nothing else keeps facts about a pipeline by its name)."""

    build: PipelineFactory
    reads_documents: bool  # False: it answers without any (given or retrieved) document
    filter_stage: FilterStage  # its filter; one that needs training loads the trained filter
    roles: frozenset[Role]  # the model roles it calls itself, besides its filter's
    sections: tuple[Section, ...]  # the settings sections it reads
    inner: InnerPipelines = _no_inner  # the pipelines it runs inside it
    part: PartBuilder | None = None  # what composition builds for it (context.part(name))
    trace: TraceDeclaration | None = None  # its trace's model and renderer; None: undeclared
    # The pipeline its answers are compared with question by question (the report's Δ table;
    # `auto` with the model alone, `direct`); None: none.
    compares_with: str | None = None
    # Its records hold judge scores under one bar over all their documents, so `sieverag
    # judge-sweep` may recompute the bar from them.
    judge_sweep: bool = False

    def roles_in(self, settings: PipelineSettings) -> frozenset[str]:
        """The model roles it calls in a run with these settings: its own and its filter's."""
        stage = self.filter_stage(settings)
        return self.roles | (FILTER_ROLES[stage] if stage is not None else frozenset())


PIPELINES: dict[str, PipelineEntry] = {}
DEFAULT: list[str] = []  # the pipeline registered with `default=True`
# Every declared section by key; pipelines sharing a section (amber's variants) declare the
# same one.
SECTIONS: dict[str, Section] = {}


def register_pipeline(name: str, *, reads_documents: bool = True,
                      filter_stage: FilterStage = _no_filter,
                      roles: Iterable[Role] = ("generator",),
                      sections: Sequence[Section] = (),
                      inner: InnerPipelines = _no_inner,
                      part: PartBuilder | None = None,
                      default: bool = False,
                      trace: type[PipelineTrace] | None = None,
                      render_trace: TraceRenderer | None = None,
                      trace_beside_inner: bool = False,
                      compares_with: str | None = None,
                      judge_sweep: bool = False,
                      ) -> Callable[[PipelineFactory], PipelineFactory]:
    """Class decorator adding a pipeline to the registry under `name`, with what it needs;
    `default`: the pipeline a run runs when its config names none (one pipeline says so).
    `trace` and `render_trace` come together: the model of its `PipelineOutput.trace` (a
    `traces.PipelineTrace`) and the function showing one as text; `trace_beside_inner`: its
    trace's keys sit beside those of the pipeline it runs inside it (`auto`'s route).
    `compares_with` and `judge_sweep`: see `PipelineEntry`."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ConfigError(f"pipeline {name!r} declares unknown role(s) {sorted(unknown)} "
                          f"(roles: {', '.join(ROLES)})")
    for section in sections:
        known = SECTIONS.setdefault(section.key, section)
        if known.cls is not section.cls:
            raise ConfigError(f"pipeline {name!r} declares section {section.key!r} as "
                              f"{section.cls.__name__}, already declared as "
                              f"{known.cls.__name__}")
    if (trace is None) != (render_trace is None):
        raise ConfigError(f"pipeline {name!r} declares a trace without its renderer, or a "
                          "renderer without its trace: give both `trace` and `render_trace`")
    declared = (TraceDeclaration(trace, render_trace, trace_beside_inner)
                if trace is not None and render_trace is not None else None)
    if declared is not None:
        check_declaration(name, declared, declared_traces())

    def add(factory: PipelineFactory) -> PipelineFactory:
        if default and DEFAULT and DEFAULT[0] != name:
            raise ConfigError(f"pipelines {DEFAULT[0]!r} and {name!r} both declare "
                              "themselves the default")
        PIPELINES[name] = PipelineEntry(factory, reads_documents, filter_stage,
                                        frozenset(roles), tuple(sections), inner, part,
                                        declared, compares_with, judge_sweep)
        if default:
            DEFAULT[:] = [name]
        return factory

    return add


def default_pipeline() -> str:
    """The pipeline a run runs when its config names none."""
    if not DEFAULT:
        raise ConfigError("no pipeline is registered as the default (import "
                          "`sieverag.inference.pipelines`, the package, first)")
    return DEFAULT[0]


def pipeline_entry(name: str) -> PipelineEntry:
    """The pipeline registered as `name`; a ConfigError listing the known ones if none is."""
    if name not in PIPELINES:
        raise ConfigError(f"unknown pipeline {name!r} (known: {', '.join(sorted(PIPELINES))})")
    return PIPELINES[name]


def declared_traces() -> list[TraceDeclaration]:
    """The traces the registered pipelines declare, in the order they registered (a model
    several pipelines share, once per pipeline)."""
    return [entry.trace for entry in PIPELINES.values() if entry.trace is not None]


def pipelines_run(names: Iterable[str], settings: PipelineSettings) -> frozenset[str]:
    """`names` and every pipeline they run inside them, with these settings (an unknown name:
    the ConfigError of `pipeline_entry`)."""
    found: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in found:
            found.add(name)
            pending.extend(pipeline_entry(name).inner(settings))
    return frozenset(found)


def with_pipeline_sections(cls: type[T]) -> type[T]:
    """Class decorator (under `@settings`) giving a command one field per declared section:
    the run config, `ask`, `demo`. The registry must be complete: import
    `sieverag.inference.pipelines` (the package) first."""
    return with_sections(cls, [SECTIONS[key] for key in sorted(SECTIONS)])


def section_values(config: object) -> dict[str, object]:
    """The sections of a config made by `with_pipeline_sections`, by key (to pass them on to
    another such config: `RunConfig(..., **section_values(command))`)."""
    return {key: getattr(config, key) for key in SECTIONS}


def pipeline_settings(config: object) -> PipelineSettings:
    """The sections of a config made by `with_pipeline_sections`, for the context."""
    return PipelineSettings(section_values(config).values())


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
