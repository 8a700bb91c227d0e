"""GET /v1/models: the served base model and its adapters, as OpenAI's model list (`root` the
base model, `parent` the base for an adapter), with the context length each serves."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from sieverag.serving.api.bodies import to_json
from sieverag.serving.api.context import ServingContext


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sieverag"
    root: str
    parent: str | None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ModelListing:
    """The model list of the context's served model."""

    def __init__(self, context: ServingContext) -> None:
        self.context = context

    def list(self) -> ModelList:
        served, created = self.context.served, self.context.created
        return ModelList(data=[
            ModelCard(id=name, created=created, root=served.name,
                      parent=None if name == served.name else served.name,
                      max_model_len=served.max_model_len)
            for name in served.names])


router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    listing: ModelListing = request.app.state.models
    return Response(to_json(listing.list()), media_type="application/json")
