"""vLLM's score API: `text_1` and `text_2` (or `queries` and `documents`), each a string or a
list. One query against a list of documents scores each; two lists of one length score them
pair by pair. The answer: `data[{index, object: "score", score}]` in pair order, with the
filter's verdict `kept` beside each score.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.field_policy import Ignored
from sieverag.serving.api.generation_protocol import TokenUsage
from sieverag.serving.api.request_fields import LENIENT, Text
from sieverag.serving.api.rerank.protocol import PromptTokenLimit
from sieverag.serving.refusals import APIError

TextOrTexts = Text | list[Text]


class ScoreRequest(BaseModel):
    """POST /v1/score."""

    model_config = LENIENT

    model: Text | None = Field(None, description="served model name: the base model or an "
                               "adapter name; null: the one adapter served")
    text_1: TextOrTexts | None = Field(None, description="the query, or one query per pair")
    text_2: TextOrTexts | None = Field(None, description="the document, or the documents")
    queries: TextOrTexts | None = Field(None, description="newer spelling of text_1")
    documents: TextOrTexts | None = Field(None, description="newer spelling of text_2")
    truncate_prompt_tokens: PromptTokenLimit | None = Field(
        None, description="cut each document until each of its filter prompts holds "
                                 "at most this many tokens; -1: to the filter's window")
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the scores are the same")] = None
    encoding_format: Annotated[Any, Ignored("scores are sent as JSON numbers")] = None

    def pairs(self) -> list[tuple[str, str]]:
        """(query, document) pairs in request order; refused (400) when the two sides are
        missing, spelt twice, or of lengths that do not pair."""
        sent = self.model_fields_set
        for old, new in (("text_1", "queries"), ("text_2", "documents")):
            if old in sent and new in sent:
                raise APIError(400, f"the request sends both {old} and {new}, two spellings "
                               "of one field: send one", param=new)
        queries = self.text_1 if self.text_1 is not None else self.queries
        documents = self.text_2 if self.text_2 is not None else self.documents
        query_field = self.query_field()
        document_field = self.document_field()
        if queries is None or documents is None:
            raise APIError(400, "send the query as text_1 (or queries) and the documents as "
                           "text_2 (or documents)", param=query_field if queries is None
                           else document_field)
        queries = [queries] if isinstance(queries, str) else queries
        documents = [documents] if isinstance(documents, str) else documents
        if any(not query.strip() for query in queries):
            raise APIError(400, f"{query_field} holds an empty query: send the question each "
                           "document is judged against", param=query_field)
        if len(queries) == 1:
            queries = queries * len(documents)
        if len(queries) != len(documents):
            raise APIError(400, f"{query_field} holds {len(queries)} texts and "
                           f"{document_field} {len(documents)}: send one query, or one per "
                           "document", param=query_field)
        return list(zip(queries, documents, strict=True))

    def query_field(self) -> str:
        """The field that holds the queries, as errors name it."""
        return "queries" if "queries" in self.model_fields_set else "text_1"

    def document_field(self) -> str:
        """The field that holds the documents, as errors name it."""
        return "documents" if "documents" in self.model_fields_set else "text_2"


class ScoreData(SparseBody):
    index: int
    object: Literal["score"] = "score"
    score: float
    kept: bool | None = None


class ScoreResponse(SparseBody):
    """POST /v1/score's answer, as vLLM's."""

    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: TokenUsage
