"""GET /v1/models: the served base model and its adapters, as OpenAI's model list (`root` the
base model, `parent` the base for an adapter), with the context length each serves and, for
an adapter that has one, its filter card (`filter_card`: its `sieverag_adapter.json`, whole),
so a client ranks with the served filter's own combination (`inference.filters.card.filter_card`).
An adapter without a card, and the base model, have no `filter_card` key."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from sieverag.serving.api.bodies import to_json
from sieverag.serving.api.endpoint_base import Endpoint


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sieverag"
    root: str
    parent: str | None
    max_model_len: int
    filter_card: dict[str, Any] | None = Field(None, exclude_if=lambda card: card is None)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ModelListing(Endpoint):
    """The model list of the context's served model."""

    def list(self) -> ModelList:
        served, created = self.context.served, self.context.created
        return ModelList(data=[
            ModelCard(id=name, created=created, root=served.name,
                      parent=None if name == served.name else served.name,
                      max_model_len=served.max_model_len,
                      filter_card=self.context.cards.get(name))
            for name in served.names])


router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    listing: ModelListing = request.app.state.models
    return Response(to_json(listing.list()), media_type="application/json")
