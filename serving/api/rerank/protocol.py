"""The rerank endpoints' request and response bodies: POST /v1/rerank (and /rerank) in the
Cohere v1/Jina schema vLLM serves, POST /v2/rerank in Cohere's v2 schema.

Each result is `RerankResult` (inference/types.py), which the in-process filter and the
endpoint's clients share; a rerank body is sent without its None fields. The count of
documents and their sizes are checked by `limits`, before any work.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag

from sieverag.inference.types import RerankResult
from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.field_policy import Ignored, OnlyAt
from sieverag.serving.api.request_fields import LENIENT, Text, text_or_object


class RerankDocument(BaseModel):
    """A document given as an object (Jina, Cohere): its text."""

    model_config = LENIENT

    text: Text = Field(description="the document's text")


class RerankBody(BaseModel):
    """What both rerank schemas share."""

    model_config = LENIENT

    model: Text = Field(description="served model name: the base model or an adapter name")
    query: Text = Field(description="the question the documents are judged against")
    documents: list[Annotated[Annotated[Text, Tag("value:text")]
                              | Annotated[RerankDocument, Tag("value:object")],
                              Discriminator(text_or_object)]] = Field(
        description="strings or {text} objects")
    top_n: StrictInt | None = Field(None, ge=0, description="results returned, best first; "
                                    "0 or null: every document")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1, description="each document cut to its first this many tokens (the served "
                                "model's tokenizer) before it is judged; null: not cut")
    granularity: Literal["chunk", "sentence"] | None = Field(
        None, description="sentence: also the kept documents' key sentences; null: the "
                          "server's default (--local.rerank.sentence-stage)")
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the results are the same")] = None

    def texts(self) -> list[str]:
        """The documents' texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankRequest(RerankBody):
    """POST /v1/rerank (and /rerank): the Cohere v1/Jina schema vLLM serves, plus
    `granularity` and `max_tokens_per_doc`."""

    return_documents: bool = Field(True, description="return each document's text")


class RerankV2Request(RerankBody):
    """POST /v2/rerank: Cohere's v2 schema, plus `granularity`."""

    relevant_spans: Annotated[Any, OnlyAt(
        'null or {"mode": "disabled"}', 'relevant spans are not implemented (granularity '
        '"sentence" gives the kept documents\' key sentences)',
        lambda spans: spans is None or (isinstance(spans, dict)
                                        and spans.get("mode") == "disabled"))] = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(SparseBody):
    """POST /v1/rerank: the Cohere v1/Jina/vLLM schema."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


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
