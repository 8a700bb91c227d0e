"""The rerank endpoints' request and response bodies, in every common reranker dialect.

POST /v1/rerank (and /rerank) reads one body that holds each dialect's fields, and answers
in the shape of the dialect the request speaks (`RerankRequest.dialect`):

* `cohere` — Cohere v1, Jina, Infinity, vLLM: `documents`, `top_n`, `return_documents`,
  `max_tokens_per_doc`, vLLM's `truncate_prompt_tokens`, `truncation_side`,
  `max_tokens_per_query`; answers `{id, model, usage, results[{index, relevance_score,
  document?: {text}}]}`.
* `infinity` — the Cohere body with `raw_scores` (Infinity's client sends it): the Cohere
  answer, each document the string.
* `tei` — Hugging Face's text-embeddings-inference, told by `texts`: `truncate`,
  `truncation_direction`, `raw_scores`, `return_text` (and `top_n`, which LiteLLM sends
  it); answers a bare array `[{index, score, text?}]`.
* `voyage` — told by `top_k` or `truncation`: `top_k`, `truncation`, `return_documents`;
  answers `{object: "list", data[{index, relevance_score, document?: str}], model, usage}`.

POST /v2/rerank reads Cohere's v2 body and answers in its schema. Every result also carries
the filter's own fields, `kept` and, at sentence granularity (`granularity: "sentence"` or
`return_spans: true`), `key_sentences`, `pruned_text` and `spans`; a document is
returned only when asked for, and then a field left out is left out (never sent as null: a
rerank body is a `SparseBody`). The count of documents and their sizes are checked by
`limits`, before any work. A document longer than the filter's window is read window by
window (at most `max_chunks_per_doc`, default the server's `max_windows_per_doc`) and scored
by its best; the truncation fields cut it to one window instead. An empty query is refused.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    RootModel,
    StrictBool,
    StrictInt,
    Tag,
)

from sieverag.inference.types import RerankResult, SentenceSpan
from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.errors import APIError
from sieverag.serving.api.field_policy import Ignored, OnlyAt
from sieverag.serving.api.request_fields import LENIENT, Text, text_or_object
from sieverag.serving.filtering import Truncation

Dialect = Literal["cohere", "infinity", "tei", "voyage"]

# The fields only one dialect sends: TEI's (its documents are `texts`), Voyage's, vLLM's.
TEI_FIELDS = ("truncate", "truncation_direction", "return_text")
VOYAGE_FIELDS = ("top_k", "truncation")
VLLM_FIELDS = ("truncate_prompt_tokens", "truncation_side")
# Two dialects' spellings of one field, and the fields that each set a truncation rule: a
# request sends one of each.
SYNONYMS = (("top_n", "top_k"), ("return_documents", "return_text"),
            ("truncation_direction", "truncation_side"))
TRUNCATION_RULES = ("truncate", "truncation", "truncate_prompt_tokens")


def _prompt_token_limit(limit: int) -> int:
    if limit == 0 or limit < -1:
        raise ValueError("must be -1 (the model's context) or at least 1")
    return limit


# vLLM's truncate_prompt_tokens: -1 (the context) or a number of tokens.
PromptTokenLimit = Annotated[StrictInt, AfterValidator(_prompt_token_limit)]


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
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the results are the same")] = None

    def dialect(self) -> Dialect:
        return "cohere"

    def check_query(self) -> None:
        """Refuse (400) a query that is empty or only white space: nothing to judge by."""
        if not self.query.strip():
            raise APIError(400, "query is empty: send the question the documents are judged "
                           "against", param="query")

    def windows_per_doc(self, default: int) -> int:
        """The most windows the filter reads of a long document (`default`: the server's)."""
        return default

    def texts_sent(self) -> list[str]:
        """The documents' texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents or []]

    def documents_field(self) -> str:
        """The field that holds the documents, as errors name it."""
        return "documents"

    def cut_rule(self) -> Truncation | None:
        """How documents too long are cut; None: they are refused."""
        return None

    def check_documents_given(self) -> None:
        if self.documents is None:
            raise APIError(400, "documents is missing: send the documents to rerank",
                           param="documents")

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


class RerankRequest(RerankBody):
    """POST /v1/rerank (and /rerank): the Cohere v1, Jina, Infinity, vLLM, TEI and Voyage
    bodies, plus `granularity`."""

    texts: Documents | None = Field(None, description="TEI: the documents (instead of "
                                    "`documents`); the answer is TEI's bare array")
    top_k: StrictInt | None = Field(None, ge=0, description="Voyage: results returned, best "
                                    "first; null: every document")
    return_documents: bool | None = Field(None, description="return each document's text "
                                          "(Cohere, Jina: {text}; Voyage: the string); "
                                          "null: not returned")
    return_text: bool = Field(False, description="TEI: return each document's text")
    raw_scores: bool = Field(False, description="TEI, Infinity: each score as the filter's "
                             "combined logit, before the sigmoid that makes it P(relevant)")
    truncate: bool = Field(False, description="TEI: cut a document longer than the "
                           "filter's window to its first (or, truncation_direction Left, last) "
                           "window, instead of reading it window by window")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="TEI, with truncate: Right cuts the document's end, Left its "
                             "start")
    truncation: bool | None = Field(None, description="Voyage: cut a document longer than "
                                    "the filter's window to its first window (null: true, as "
                                    "Voyage does); false: read it window by window")
    truncate_prompt_tokens: PromptTokenLimit | None = Field(
        None, description="vLLM: cut each document until each of its filter prompts "
                                 "holds at most this many tokens; -1: to the filter's window")
    truncation_side: Literal["right", "left"] = Field(
        "right", description="vLLM, with truncate_prompt_tokens: right cuts the document's "
                             "end, left its start")
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

    def dialect(self) -> Dialect:
        """The dialect the request speaks, told by its fields: `texts` is TEI's, `top_k` or
        `truncation` Voyage's. A request that sends the documents twice, two spellings of one
        field, two truncation rules or fields of two dialects is refused (400)."""
        sent = self.model_fields_set
        if "texts" in sent and "documents" in sent:
            raise APIError(400, "the request sends both texts (TEI) and documents: send the "
                           "documents once, in one of them", param="texts")
        for pair in (*SYNONYMS, *itertools.combinations(TRUNCATION_RULES, 2)):
            if all(name in sent for name in pair):
                raise APIError(400, f"the request sends both {pair[0]} and {pair[1]}, two "
                               "dialects' spellings of one setting: send one", param=pair[1])
        voyage = [name for name in VOYAGE_FIELDS if name in sent]
        vllm = [name for name in VLLM_FIELDS if name in sent]
        if "texts" in sent:
            if voyage or vllm:
                raise APIError(400, f"{(voyage + vllm)[0]} is not a TEI field, and texts is "
                               "TEI's: send one dialect's fields", param=(voyage + vllm)[0])
            return "tei"
        tei = [name for name in TEI_FIELDS if name in sent]
        if tei:
            raise APIError(400, f"{tei[0]} is a TEI field, and TEI sends its documents as "
                           "texts: send texts, or this dialect's field instead",
                           param=tei[0])
        if voyage and vllm:
            raise APIError(400, f"the request mixes Voyage's {voyage[0]} and vLLM's {vllm[0]}: "
                           "send one dialect's fields", param=vllm[0])
        if voyage:
            return "voyage"
        return "infinity" if "raw_scores" in sent else "cohere"

    def windows_per_doc(self, default: int) -> int:
        return default if self.max_chunks_per_doc is None else self.max_chunks_per_doc

    def texts_sent(self) -> list[str]:
        documents = self.texts if self.texts is not None else self.documents
        return [d if isinstance(d, str) else d.text for d in documents or []]

    def documents_field(self) -> str:
        return "texts" if self.texts is not None else "documents"

    def check_documents_given(self) -> None:
        if self.texts is None and self.documents is None:
            raise APIError(400, "documents is missing: send the documents to rerank "
                           "(documents, or texts as TEI does)", param="documents")

    def result_count(self) -> int | None:
        """How many results to return (top_n or top_k; 0 or None: all)."""
        return self.top_k if self.top_k is not None else self.top_n

    def wants_documents(self) -> bool:
        return bool(self.return_text or self.return_documents)

    def cut_rule(self) -> Truncation | None:
        dialect = self.dialect()
        if dialect == "tei":
            keep = "end" if self.truncation_direction.lower() == "left" else "start"
            return Truncation(None, keep) if self.truncate else None
        if dialect == "voyage":
            return None if self.truncation is False else Truncation()
        if self.truncate_prompt_tokens is not None:
            limit = None if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
            return Truncation(limit, "end" if self.truncation_side == "left" else "start")
        return None

    def oversize_remedy(self) -> str:
        """What a client of this dialect sends to have a document too long cut instead."""
        return {"tei": "send truncate: true to cut it",
                "voyage": "send truncation: true to cut it",
                "infinity": "send max_tokens_per_doc to cut it",
                "cohere": "send max_tokens_per_doc, or truncate_prompt_tokens: -1, to cut "
                          "it"}[self.dialect()]


class RerankV2Request(RerankBody):
    """POST /v2/rerank: Cohere's v2 schema, plus `granularity`."""

    relevant_spans: Annotated[Any, OnlyAt(
        'null or {"mode": "disabled"}', 'Cohere\'s relevant spans are not implemented: '
        'return_spans: true gives each document\'s sentences as spans, with the text the '
        'filter keeps (pruned_text)',
        lambda spans: spans is None or (isinstance(spans, dict)
                                        and spans.get("mode") == "disabled"))] = None

    def oversize_remedy(self) -> str:
        return "send max_tokens_per_doc to cut it"


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(SparseBody):
    """POST /v1/rerank: the Cohere v1/Jina/vLLM schema."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class InfinityResult(SparseBody):
    """One result of Infinity's answer: its document, when asked for, is the string."""

    index: int
    relevance_score: float
    document: str | None = None
    kept: bool | None = None
    key_sentences: tuple[str, ...] | None = None
    pruned_text: str | None = None
    spans: tuple[SentenceSpan, ...] | None = None
    bar_rule: str | None = None


class InfinityRerankResponse(SparseBody):
    """POST /v1/rerank in Infinity's dialect."""

    id: str
    object: Literal["rerank"] = "rerank"
    model: str
    usage: RerankUsage
    results: list[InfinityResult]


class VoyageResult(SparseBody):
    """One result of Voyage's answer: its document, when asked for, is the string."""

    index: int
    relevance_score: float
    document: str | None = None
    kept: bool | None = None
    key_sentences: tuple[str, ...] | None = None
    pruned_text: str | None = None
    spans: tuple[SentenceSpan, ...] | None = None
    bar_rule: str | None = None


class VoyageRerankResponse(SparseBody):
    """POST /v1/rerank in Voyage's dialect."""

    object: Literal["list"] = "list"
    data: list[VoyageResult]
    model: str
    usage: RerankUsage


class TEIResult(SparseBody):
    """One entry of TEI's answer: `score` (P(relevant), or with raw_scores its logit) and,
    with return_text, the document's `text`."""

    index: int
    score: float
    text: str | None = None
    kept: bool | None = None
    key_sentences: tuple[str, ...] | None = None
    pruned_text: str | None = None
    spans: tuple[SentenceSpan, ...] | None = None
    bar_rule: str | None = None


class TEIRerankResponse(RootModel[list[TEIResult]]):
    """POST /v1/rerank (or /rerank) in TEI's dialect: a bare array, best first."""


class ApiVersion(BaseModel):
    version: Literal["2"] = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class MetaTokens(BaseModel):
    input_tokens: int
    output_tokens: int


class RerankMeta(BaseModel):
    """Cohere's `meta`: the API version, billed units (one search) and the tokens used."""

    api_version: ApiVersion = Field(default_factory=ApiVersion)
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: MetaTokens


class RerankV2Response(SparseBody):
    """POST /v2/rerank: Cohere's v2 schema (results carry no document)."""

    id: str
    results: list[RerankResult]
    meta: RerankMeta
