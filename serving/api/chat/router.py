"""POST /v1/chat/completions' route, handed to the app's `Chat` (a server with `--proxy-to`
serves `proxy.router` at this path instead)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sieverag.serving.api.chat.protocol import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await request.app.state.chat.create(body)
