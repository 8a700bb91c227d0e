"""The one query every rerank dialect maps its request to (`RankingQuery`), and the filter's
ranking that each maps back to its client's answer (`Ranking`): the work (`serving.RerankServing`)
reads these two and no dialect's fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sieverag.inference.core.types import RerankResult
from sieverag.inference.filters.ranking import best_first
from sieverag.serving.refusals import APIError
from sieverag.serving.request_limits import DocumentRefusal, Truncation


@dataclass(frozen=True)
class RankingQuery:
    """A rerank request as the filter ranks it, whatever dialect it came in.

    * `query`, `texts` — the question and the documents' texts as sent, in request order;
    * `refusal` — how a refusal names the documents' field, and what this client sends to have
      a document too long cut instead;
    * `truncation` — how a document too long is cut (None: read window by window, whole);
    * `max_tokens_per_doc`, `max_tokens_per_query` — each document, the query, cut to its
      first this many tokens before it is judged (None: not cut);
    * `max_windows_per_doc` — the most windows read of a long document (None: the server's);
    * `granularity`, `return_spans` — whether the sentence stage runs and its spans are sent
      (`sentence_stage`, `wants_spans`);
    * `context_tokens` — the context budget: only the best context that fits this many tokens
      is sent (`serving.within_budget`; None: no budget);
    * `top_n` — how many results are sent, best first (0 or None: all); `return_documents` —
      each with its document's text; `raw_scores` — each score as the combined logit rather
      than P(relevant).
    """

    query: str
    texts: tuple[str, ...]
    refusal: DocumentRefusal = DocumentRefusal()
    truncation: Truncation | None = None
    max_tokens_per_doc: int | None = None
    max_tokens_per_query: int | None = None
    max_windows_per_doc: int | None = None
    granularity: Literal["chunk", "sentence"] | None = None
    return_spans: bool | None = None
    context_tokens: int | None = None
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False

    def sentence_stage(self, default: bool) -> bool:
        """Whether MCF's sentence stage runs (`default`: the server's rule): granularity
        says, else return_spans true asks for it. return_spans with granularity "chunk" is
        refused (400): spans come from the sentence stage."""
        if self.return_spans and self.granularity == "chunk":
            raise APIError(400, "return_spans needs the sentence stage, and granularity "
                           "\"chunk\" turns it off: send granularity \"sentence\" or leave "
                           "it out", param="return_spans")
        if self.granularity is not None:
            return self.granularity == "sentence"
        return default or bool(self.return_spans)

    def wants_spans(self) -> bool:
        """Whether results carry their sentence spans (where the sentence stage runs)."""
        return self.return_spans is not False

    def windows_per_doc(self, default: int) -> int:
        """The most windows the filter reads of a long document (`default`: the server's)."""
        return default if self.max_windows_per_doc is None else self.max_windows_per_doc


@dataclass(frozen=True)
class Ranking:
    """The filter's ranking of a request's documents (`results`, in no order), their texts as
    the request sent them, the served model that ranked them and the prompt and completion
    tokens the filter used."""

    model: str
    results: list[RerankResult]
    texts: list[str]
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def best(self, top_n: int | None) -> list[RerankResult]:
        """The results best first (ties in request order), the first `top_n` (0 or None:
        all)."""
        return best_first(self.results)[:top_n or None]
