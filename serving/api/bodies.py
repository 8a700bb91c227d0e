"""How a response body is sent (`to_json`): JSON, nulls included as OpenAI sends them, except
for a `SparseBody` (the rerank and score bodies) and a bare list (TEI's rerank answer), sent
without their None fields, for a client such as LiteLLM refuses `"document": null` where it
asked for no document."""

from __future__ import annotations

from pydantic import BaseModel, RootModel


class SparseBody(BaseModel):
    """A response body sent without its None fields."""


def to_json(response: BaseModel) -> bytes:
    """A response body as sent (a log-prob that is not finite is sent as null: JSON has no
    spelling for it)."""
    sparse = isinstance(response, SparseBody | RootModel)
    return response.model_dump_json(exclude_none=sparse).encode()
