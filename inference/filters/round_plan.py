"""What a round of MCF will ask of the filter, known before it runs: a server checks it
against its limits (every prompt fits the context, the round's filter tokens within the
request budget) before any work, and then runs that same MCF.

The plan reads MCF's own rules: its window rule (`MultiGranularFilter.windows`: the windows
a document is read in, at most `max_windows_per_doc` of them) and the prompts it asks
(`MultiGranularFilter.chunk_prompt`, `sentence_prompt`: the functions its chunk and sentence
stages build their prompts with), so what it counts is what MCF asks. It is a bound: every
document counted as read by the filter (a round whose combination leaves the filter out, or
a home round that reads only the priors' best few, asks less).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sieverag.inference.core.types import Conversation, Document
from sieverag.inference.filters.mcf import MultiGranularFilter, document_sentences
from sieverag.inference.filters.windows import window_document
from sieverag.inference.llm.backend_protocol import marked_prompt_ids

_BLANK = Document(id="", text="")


@dataclass(frozen=True)
class PromptCost:
    """A prompt the filter asks on a document: its stage, its tokens and its answer's."""

    stage: Literal["chunk", "sentence"]
    prompt_tokens: int
    answer_tokens: int


@dataclass(frozen=True)
class RoundPlan:
    """Per document, the prompts on its largest window (the ones that must fit the context;
    none for a blank document), and the filter tokens (prompts and answers) the round may
    use."""

    prompts: tuple[tuple[PromptCost, ...], ...]
    tokens: int


def prompt_tokens(mcf: MultiGranularFilter, conversation: Conversation) -> int:
    """The tokens the filter's model reads for `conversation`, as its backend renders it (a
    one-pass prompt's label marks are not read: `marked_prompt_ids`). The backend is one
    with its model's tokenizer at hand (`tokenizer`, `render`: in process, or the server's
    engine); one that remembers what it tokenised (`read_ids`: the server's engine) is
    asked through that, so the round it then runs does not tokenise the prompt again."""
    backend = mcf.backend
    read_ids = getattr(backend, "read_ids", None)
    if read_ids is not None:
        return len(read_ids(conversation)[1])
    ids, _ = marked_prompt_ids(backend.tokenizer, backend.render(conversation))
    return len(ids)


def prompt_costs(mcf: MultiGranularFilter, question: str, document: Document
                 ) -> list[PromptCost]:
    """Each prompt MCF asks on `document` read as one window: its chunk-stage prompt and,
    where its sentence stage asks one (`asks_sentences`, a chunk of two or more sentences),
    its sentence prompt."""
    costs = [PromptCost("chunk", prompt_tokens(mcf, mcf.chunk_prompt(question, document)), 1)]
    sentences = document_sentences(document)
    if mcf.asks_sentences and len(sentences) > 1:
        prompt = mcf.sentence_prompt(question, sentences, document.title)
        costs.append(PromptCost("sentence", prompt_tokens(mcf, prompt),
                                mcf.config.sentence_max_new_tokens))
    return costs


def plan_round(mcf: MultiGranularFilter, question: str, documents: Sequence[Document]
               ) -> RoundPlan:
    """The round's plan: for each document, the prompts on its largest window, and the
    tokens of the prompts on its largest windows, as many as MCF reads (all of a document
    that fits), each with its answer; where the sentence stage asks, one more prompt on its
    largest window. A blank document asks nothing."""
    chunk_around = prompt_tokens(mcf, mcf.chunk_prompt(question, _BLANK)) + 1
    sentence_around = (prompt_tokens(mcf, mcf.sentence_prompt(question, [""]))
                       + mcf.config.sentence_max_new_tokens if mcf.asks_sentences else None)
    prompts: list[tuple[PromptCost, ...]] = []
    total = 0
    for document in documents:
        windows = mcf.windows.windows(document.text)
        if not windows:
            prompts.append(())
            continue
        largest = max(windows, key=lambda w: w.tokens)
        probe = document if len(windows) == 1 else window_document(document, largest)
        prompts.append(tuple(prompt_costs(mcf, question, probe)))
        read = sorted((w.tokens for w in windows), reverse=True)[:mcf.windows.max_windows]
        total += sum(read) + len(read) * chunk_around
        if sentence_around is not None:
            total += read[0] + sentence_around
    return RoundPlan(tuple(prompts), total)
