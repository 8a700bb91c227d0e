"""A pipeline's trace: the typed record of how it answered one question (`PipelineOutput.trace`
as JSON-ready data, a result record's `trace`), which the pipeline declares where it registers
(`register_pipeline(trace=..., render_trace=...)`), so evaluation stores, reads and shows any
pipeline's trace without naming one.

- `PipelineTrace`: the base of every declared trace model (a `JsonlRecord`: unknown keys
  refused). A pipeline that decides per question whether to retrieve says what it decided
  (`retrieval_decision`).
- `OpenTrace`: a trace no declared model matches — that of a pipeline declaring none, or of a
  run made with a pipeline no longer registered — read as it is, any JSON values.
- `TraceDeclaration`: what a pipeline declares (its model, its renderer, and whether its keys
  sit beside the trace of the pipeline it runs inside it, as `auto`'s route does).
- `trace_model(data, declared)`: the model a stored trace is read as, from its keys.
- `wrap`, `scored_document_lines`: the text helpers renderers share (`sieverag trace`).
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, JsonValue

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.filters.document_filter import ScoredDocumentRecord

WIDTH = 100  # the terminal width a rendered trace wraps at


class PipelineTrace(JsonlRecord):
    """The base of a pipeline's declared trace model."""

    def retrieval_decision(self) -> bool | None:
        """Whether the pipeline decided to answer this question with retrieval; None where it
        decides nothing per question (whether the generator read retrieved text says)."""
        return None


class OpenTrace(PipelineTrace):
    """A trace no declared model matches, read as it is: any keys, JSON values."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)


# A declared trace (an instance of the pipeline's model) → the lines `sieverag trace` shows.
TraceRenderer = Callable[[Any], str]


@dataclass(frozen=True)
class TraceDeclaration:
    """A pipeline's trace, as it registers it."""

    model: type[PipelineTrace]
    render: TraceRenderer
    # True: its keys sit beside those of the trace of the pipeline it runs inside it (`auto`
    # adds its route to the routed pipeline's trace), so a stored trace may hold both.
    beside_inner: bool = False


def _keys(model: type[PipelineTrace]) -> frozenset[str]:
    return frozenset(model.model_fields)


def _missing(model: type[PipelineTrace], keys: frozenset[str]) -> int:
    return sum(1 for name, info in model.model_fields.items()
               if info.is_required() and name not in keys)


def trace_model(data: Mapping[str, Any],
                declared: Iterable[TraceDeclaration]) -> type[PipelineTrace]:
    """The model a stored trace `data` is read as, from its keys and the `declared` traces:

    - every declared trace that sits beside an inner one (`beside_inner`) whose keys appear;
    - for the other keys, the declared trace they match best: the fewest of its required keys
      missing, then the most keys in common, then the first declared. A trace holding any of
      a model's keys is read as that model, so a renamed key is an error naming it, not
      silently another trace;
    - `OpenTrace` where no declared model has any of those keys (or the trace is empty).

    More than one found are one model, a subclass of each (built once)."""
    keys = frozenset(data)
    models = list(dict.fromkeys(d.model for d in declared if not d.beside_inner))
    beside = [m for m in dict.fromkeys(d.model for d in declared if d.beside_inner)
              if keys & _keys(m)]
    rest = keys.difference(*map(_keys, beside))
    matching = [m for m in models if rest & _keys(m)]
    if matching:
        main = min(matching, key=lambda m: (_missing(m, rest), -len(rest & _keys(m))))
        parts = (*beside, main)
    else:
        parts = (*beside, OpenTrace) if rest or not beside else tuple(beside)
    return parts[0] if len(parts) == 1 else _joined(parts)


@functools.cache
def _joined(parts: tuple[type[PipelineTrace], ...]) -> type[PipelineTrace]:
    """One model holding the keys of each part (the main trace's first, as it is written), an
    instance of each: the parts that sit beside come first in the method order, so their
    `retrieval_decision` is the one asked."""
    namespace: dict[str, Any] = {"__module__": __name__,
                                 "__doc__": " and ".join(p.__name__ for p in parts)}
    if OpenTrace in parts:
        namespace["model_config"] = ConfigDict(extra="allow")
    return type("+".join(p.__name__ for p in parts), parts, namespace)


def check_declaration(name: str, new: TraceDeclaration,
                      declared: Iterable[TraceDeclaration]) -> None:
    """Refuse (a ConfigError naming pipeline `name`) a trace declaration that would make stored
    traces ambiguous: a model declared again with another renderer or placement, or a trace
    that sits beside an inner one sharing a key with another declared trace."""
    if not issubclass(new.model, PipelineTrace):
        raise ConfigError(f"pipeline {name!r} declares trace {new.model.__name__}, which is "
                         "not a PipelineTrace (inference/pipelines/traces.py)")
    for known in declared:
        if known.model is new.model:
            if known != new:
                raise ConfigError(f"pipeline {name!r} declares trace {new.model.__name__} with "
                                 "another renderer or placement than a pipeline before it")
            continue
        shared = _keys(known.model) & _keys(new.model)
        if shared and (known.beside_inner or new.beside_inner):
            raise ConfigError(
                f"pipeline {name!r}'s trace {new.model.__name__} shares the key(s) "
                f"{sorted(shared)} with {known.model.__name__}, and one sits beside the "
                "other in a stored trace: rename them")


def wrap(label: str, text: str, indent: int = 2) -> list[str]:
    """`label` then `text` (its whitespace collapsed) wrapped at WIDTH, the lines after the
    first indented under the text."""
    prefix = " " * indent + label
    body = " ".join(str(text).split()) or "(empty)"
    return textwrap.wrap(body, WIDTH, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix)) or [prefix]


def scored_document_lines(entry: ScoredDocumentRecord, indent: int = 4) -> list[str]:
    """A scored document: kept or not, its score, title, id and gold mark, then the filter's
    evidence for it (P(Yes), the parts of a fused score, each filter's vote, the predicted
    answer, the kept sentences)."""
    mark = "✓" if entry.kept else "✗"
    gold = " [gold]" if entry.is_gold else ""
    title = f"{entry.title} " if entry.title else ""
    line = f"{' ' * indent}{mark} {entry.score:+7.3f}  {title}({entry.id}){gold}"
    extras = []
    if entry.p_yes is not None:
        extras.append(f"P(Yes) {entry.p_yes:.2f}")
    if entry.bm25 is not None:  # a score fused with the lexical prior: show its parts
        if entry.filter_score is not None:  # None: the card ranks without the filter
            extras.append(f"filter s {entry.filter_score:+.2f}")
        extras.append(f"BM25 {entry.bm25:.2f}")
    if entry.p_yes is None and entry.p_relevant is not None:  # the filter was not asked
        extras.append(f"relevance {entry.p_relevant:.2f} (not calibrated here)"
                      if entry.calibrated is False else f"P(relevant) {entry.p_relevant:.2f}")
    if entry.mcf_score is not None:
        extras.append(f"mcf {entry.mcf_score:+.2f}{'✓' if entry.mcf_kept else '✗'}")
    if entry.judge_score is not None:
        extras.append(f"judge {entry.judge_score:+.2f}{'✓' if entry.judge_kept else '✗'}")
    if entry.predicted_answer is not None:
        extras.append(f"predicted {entry.predicted_answer!r}")
    if entry.verdict is not None:
        extras.append(f"verdict {entry.verdict!r}")
    if entry.kept and entry.sentence_status is not None:
        numbers = ", ".join(str(i + 1) for i in entry.key_sentences or []) or "none"
        extras.append(f"sentences {numbers} ({entry.sentence_status})")
    lines = [line]
    if extras:
        lines.append(" " * (indent + 11) + " · ".join(extras))
    return lines
