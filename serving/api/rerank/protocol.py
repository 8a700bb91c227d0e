"""What every rerank dialect's request and answer share; each dialect's own fields, its
mapping to the filter's query and its answer are in `dialects/`, and `detection` tells which
dialect a /v1/rerank request speaks.

* `RerankBody` — the fields of both rerank schemas (/v1/rerank's and Cohere's /v2/rerank):
  `model`, `query`, `documents` (strings or `{text}`), `top_n`, `max_tokens_per_doc`,
  `granularity`, `return_spans`, and sieverag's context budget `context_tokens` (every
  dialect takes it); `ranking_query` turns them into the filter's query
  (`query.RankingQuery`), refusing (400) a blank query or no documents.
* `RerankV1Body` — the fields every /v1/rerank dialect reads: `return_documents`,
  `max_tokens_per_query`, `max_chunks_per_doc` (a document longer than the filter's window is
  read window by window, at most this many, default the server's `max_windows_per_doc`, and
  scored by its best), `rank_fields`, `instruction`.
* `RawScores` — TEI's and Infinity's `raw_scores`.
* `FilterFields` — the filter's own fields of a result, in every dialect's answer: `kept`
  and, at sentence granularity (`granularity: "sentence"` or `return_spans: true`),
  `key_sentences`, `pruned_text` and `spans`, and `bar_rule` and `calibrated` (whether
  the score is a calibrated P(relevant) on this round). A field left out is left out
  (never sent as null: a rerank answer is a `SparseBody`).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    Tag,
    model_serializer,
)

from sieverag.inference.core.types import RerankResult, SentenceSpan
from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.field_policy import Ignored, OnlyAt
from sieverag.serving.api.request_fields import LENIENT, Text, text_or_object
from sieverag.serving.api.rerank.query import RankingQuery
from sieverag.serving.refusals import APIError
from sieverag.serving.request_limits import DocumentRefusal, Truncation


def _prompt_token_limit(limit: int) -> int:
    if limit == 0 or limit < -1:
        raise ValueError("must be -1 (the model's context) or at least 1")
    return limit


# vLLM's truncate_prompt_tokens: -1 (the context) or a number of tokens.
PromptTokenLimit = Annotated[StrictInt, AfterValidator(_prompt_token_limit)]


def prompt_token_cut(limit: int, side: Literal["right", "left"] = "right") -> Truncation:
    """vLLM's `truncate_prompt_tokens` (-1: to the filter's window) and `truncation_side` (right
    cuts the document's end) as the filter's cut rule; its rerank and score APIs share them."""
    return Truncation(None if limit == -1 else limit, "end" if side == "left" else "start")


class RerankDocument(BaseModel):
    """A document given as an object (Jina, Cohere): its text."""

    model_config = LENIENT

    text: Text = Field(description="the document's text")


Documents = list[Annotated[Annotated[Text, Tag("value:text")]
                           | Annotated[RerankDocument, Tag("value:object")],
                           Discriminator(text_or_object)]]


class RerankBody(BaseModel):
    """What both rerank schemas share."""

    model_config = LENIENT

    model: Text | None = Field(None, description="served model name: the base model or an "
                               "adapter name; null (TEI sends none): the one adapter served")
    query: Text = Field(description="the question the documents are judged against")
    documents: Documents | None = Field(None, description="strings or {text} objects")
    top_n: StrictInt | None = Field(None, ge=0, description="results returned, best first; "
                                    "0 or null: every document")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1, description="each document cut to its first this many tokens (the served "
                                "model's tokenizer) before it is judged; null: not cut")
    granularity: Literal["chunk", "sentence"] | None = Field(
        None, description="sentence: also each document's key sentences, pruned text and "
                          "sentence spans (MCF's sentence stage); null: the server's default "
                          "(--local.rerank.sentence-stage)")
    return_spans: StrictBool | None = Field(
        None, description="true: each result's sentences as character spans with their "
                          "score and kept flag, and its pruned_text (runs the sentence stage); "
                          "false: no spans; null: spans wherever the sentence stage runs")
    context_tokens: StrictInt | None = Field(
        None, ge=1, description="sieverag: the context budget: only the best context that fits "
                                "this many tokens of the filter's tokenizer is returned (the "
                                "kept documents whole, best first, while they fit, then the "
                                "next one's kept sentences, never a cut one; each result's "
                                "pruned_text its text there); null: every result")
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the results are the same")] = None

    def ranking_query(self, documents: Documents | None, refusal: DocumentRefusal, *,
                      missing: str = "send the documents to rerank") -> RankingQuery:
        """The filter's query these fields say, over `documents` (the field the dialect sends
        them in, as `refusal` names it); refused (400) when the query is empty or only white
        space (nothing to judge by) or no documents were sent (`missing`: what to send)."""
        if not self.query.strip():
            raise APIError(400, "query is empty: send the question the documents are judged "
                           "against", param="query")
        if documents is None:
            raise APIError(400, f"documents is missing: {missing}", param="documents")
        return RankingQuery(
            query=self.query, texts=tuple(d if isinstance(d, str) else d.text for d in documents),
            refusal=refusal, max_tokens_per_doc=self.max_tokens_per_doc,
            granularity=self.granularity, return_spans=self.return_spans,
            context_tokens=self.context_tokens, top_n=self.top_n)


class RerankV1Body(RerankBody):
    """The fields every /v1/rerank dialect reads: Cohere v1's and Jina's body, which the other
    dialects extend with fields of their own."""

    return_documents: bool | None = Field(None, description="return each document's text "
                                          "(Cohere, Jina: {text}; Voyage: the string); "
                                          "null: not returned")
    max_tokens_per_query: StrictInt | None = Field(
        None, ge=1, description="vLLM: the query cut to its first this many tokens")
    max_chunks_per_doc: StrictInt | None = Field(
        None, ge=1, description="Cohere v1: the most windows the filter reads of a document "
                                "longer than its window; null: the server's "
                                "(--local.rerank.max-windows-per-doc)")
    rank_fields: Annotated[Any, OnlyAt(
        'null or ["text"]', "documents are ranked by their text only",
        lambda fields: fields is None or fields == ["text"])] = None
    instruction: Annotated[Any, OnlyAt(
        "null", "the filter's prompt is fixed by its card", lambda text: text is None)] = None

    def ranking_query(self, documents: Documents | None, refusal: DocumentRefusal, *,
                      missing: str = "send the documents to rerank (documents, or texts as "
                                     "TEI does)") -> RankingQuery:
        query = super().ranking_query(documents, refusal, missing=missing)
        return replace(query, max_tokens_per_query=self.max_tokens_per_query,
                       max_windows_per_doc=self.max_chunks_per_doc,
                       return_documents=bool(self.return_documents))


class RawScores(BaseModel):
    """TEI's and Infinity's score scale."""

    raw_scores: bool = Field(False, description="TEI, Infinity: each score as the filter's "
                             "combined logit, before the sigmoid that makes it P(relevant)")


class FilterFields(SparseBody):
    """The filter's own fields of one result, beside each dialect's index, score and document
    (`RerankResult` holds the same for Cohere's answer): sent after the dialect's fields, as
    its client documents them first."""

    kept: bool | None = None
    key_sentences: tuple[str, ...] | None = None
    pruned_text: str | None = None
    spans: tuple[SentenceSpan, ...] | None = None
    bar_rule: str | None = None
    calibrated: bool | None = None

    @staticmethod
    def of(result: RerankResult) -> dict[str, Any]:
        """The filter's fields of `result`, by name."""
        return {name: getattr(result, name) for name in FilterFields.model_fields}

    @model_serializer(mode="wrap")
    def _dialect_fields_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        sent = handler(self)
        return dict(sorted(sent.items(), key=lambda item: item[0] in FilterFields.model_fields))


class RerankUsage(BaseModel):
    total_tokens: int


def rerank_id() -> str:
    return f"rerank-{uuid.uuid4().hex}"
