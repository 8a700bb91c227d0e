"""POST /v1/chat/completions as the filtering proxy (`--proxy-to`), handed to the app's
`ChatProxy`; the app serves this router in place of `api.chat`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sieverag.serving.proxy.chat_proxy import ChatProxy

router = APIRouter()


@router.post("/v1/chat/completions")
async def proxy_chat_completion(request: Request) -> Response:
    chat_proxy: ChatProxy = request.app.state.chat_proxy
    return await chat_proxy.handle(request)
