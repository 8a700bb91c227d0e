"""`CachingBackend`: an LLM backend that answers each distinct request once.

`eval-filter` runs the real MCF (`MultiGranularFilter`) under several bars on the same
passages; wrapped in this backend, every passage's label log-probs and every sentence-stage
reply come from the model once, and the other rows read them back. The decision rules stay
MCF's own code: only the transport is cached.

Entries are keyed by a SHA-256 digest of the request (the conversation and the labels, or
the conversation and the decoding settings), so a changed prompt template or question is a
new entry, never a stale answer. The tables (label log-probs, replies, and the reads of
marked prompts) are plain JSON-ready dicts; `eval-filter` stores the first two between runs.

Questions in flight: in-process, `eval-filter` wraps this backend (the outermost one) in a
`CallBatcher`, so every call runs on its one worker thread and a merged call of several
questions' prompts fills and reads the tables in one step (a request two questions share is
asked once). Served, several threads call it at once; that is safe because each table read
or write is one dict operation, and two questions asking the same new request at the same
moment may both ask the model (one answer stays). A table is saved from a copy
(`dict(table)`, one step) so no thread in flight changes it while it is written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend, UsageMeter


def request_key(prompt: Conversation, detail: object) -> str:
    """The digest that identifies one request: its conversation and what else decides it."""
    text = json.dumps([prompt, detail], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CachingBackend:
    """Wraps `inner`; label log-probs (plain or read at marks) and greedy replies are
    answered from memory when the same request was made before (sampled replies and
    continuation log-probs pass through).

    `labels`, `replies` and `marked` (key → answer) may be given pre-filled from an earlier
    run."""

    def __init__(self, inner: LLMBackend, labels: dict[str, dict[str, float]] | None = None,
                 replies: dict[str, str] | None = None,
                 marked: dict[str, list[dict[str, float]]] | None = None) -> None:
        self.inner = inner
        self.labels: dict[str, dict[str, float]] = dict(labels or {})
        self.replies: dict[str, str] = dict(replies or {})
        self.marked: dict[str, list[dict[str, float]]] = dict(marked or {})

    @property
    def meter(self) -> UsageMeter:
        """The wrapped backend's meter: it counts the requests that reached the model."""
        return self.inner.meter

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def generate(self, prompts: Sequence[Conversation],
                 settings: GenerationSettings = GenerationSettings(), *,
                 agent: str = "generator") -> list[str]:
        if settings.temperature > 0:  # a sampled reply is not a fixed answer to remember
            return self.inner.generate(prompts, settings, agent=agent)
        detail = {"max_new_tokens": settings.max_new_tokens, "stop": list(settings.stop)}
        keys = [request_key(p, detail) for p in prompts]
        _fill(self.replies, keys, prompts,
              lambda asked: self.inner.generate(asked, settings, agent=agent))
        return [self.replies[k] for k in keys]

    def label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                       agent: str = "scorer") -> list[dict[str, float]]:
        keys = [request_key(p, list(labels)) for p in prompts]
        _fill(self.labels, keys, prompts,
              lambda asked: self.inner.label_logprobs(asked, labels, agent=agent))
        return [dict(self.labels[k]) for k in keys]

    def marked_label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                              agent: str = "scorer") -> list[list[dict[str, float]]]:
        keys = [request_key(p, list(labels)) for p in prompts]
        _fill(self.marked, keys, prompts,
              lambda asked: self.inner.marked_label_logprobs(asked, labels, agent=agent))
        return [[dict(read) for read in self.marked[k]] for k in keys]

    def continuation_logprob(self, prompts: Sequence[Conversation],
                             continuations: Sequence[str], *, agent: str = "scorer"
                             ) -> list[float]:
        return self.inner.continuation_logprob(prompts, continuations, agent=agent)


def _fill(table: dict, keys: Sequence[str], prompts: Sequence[Conversation],
          ask: Callable[[list[Conversation]], list]) -> None:
    """Answer into `table` the requests whose keys it lacks, in one call of `ask`."""
    missing = _first_occurrences(keys, table)
    if missing:
        answers = ask([prompts[i] for i in missing])
        table.update(zip((keys[i] for i in missing), answers, strict=True))


def _first_occurrences(keys: Sequence[str], known: dict) -> list[int]:
    """Indices of the keys not in `known`, each distinct key once (one model call per request)."""
    seen: set[str] = set()
    missing = []
    for index, key in enumerate(keys):
        if key not in known and key not in seen:
            seen.add(key)
            missing.append(index)
    return missing
