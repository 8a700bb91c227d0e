"""What every endpoint class is built on: `Endpoint`, which holds the `ServingContext` — the
engine and its served model, the server's request limits and rules, each adapter's filter card
and the combination it holds, and the steps every endpoint shares: the `model` check (and, for
the filter's endpoints, `model_of`: the model a request names, or the one adapter served),
running sequences on the engine (cancelled together), and sending a typed body built off the
event loop with the header naming ignored fields.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from sieverag.inference.filters.card.combination import Combination, card_combination
from sieverag.serving.api.bodies import to_json
from sieverag.serving.api.field_policy import ignored_header, unknown_fields
from sieverag.serving.api.streaming import MEDIA_TYPE as STREAM_MEDIA_TYPE
from sieverag.serving.config import LocalOptions
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.sequence_types import SequenceRequest, SequenceResult
from sieverag.serving.engine.tokens import max_token_chars
from sieverag.serving.observability.metrics import ServerMetrics
from sieverag.serving.refusals import APIError
from sieverag.serving.request_limits import PromptLimits


@dataclass
class ServingContext:
    """The engine (which the caller starts and closes) and the rules its endpoints serve by.
    `cards`: each served adapter's filter card (`sieverag_adapter.json`), by served name (an
    adapter without one: absent); `combinations` (derived): the combination each card holds
    (`card_combination`), which the rerank and score endpoints and the proxy rank with;
    `metrics`: the app's metrics, in which the endpoints count what their work did."""

    engine: BatchingEngine
    options: LocalOptions
    cards: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics = field(default_factory=ServerMetrics)

    def __post_init__(self) -> None:
        self.combinations: dict[str, Combination] = {
            name: card_combination(card, f"the card of adapter {name!r}")
            for name, card in self.cards.items()}
        served = self.engine.served
        self.served = served
        self.tokenizer = served.tokenizer
        self.limits = PromptLimits(
            max_model_len=served.max_model_len, vocabulary_size=len(self.tokenizer),
            max_token_chars=max_token_chars(self.tokenizer),
            max_prompts_per_request=self.options.max_prompts_per_request,
            default_chat_max_tokens=self.options.default_chat_max_tokens,
            max_rerank_documents=self.options.max_rerank_documents,
            max_request_tokens=self.options.max_request_tokens)

    def check_model(self, name: str) -> None:
        """Refuse (404) a `model` this server does not serve."""
        if name not in self.served.names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(self.served.names)}", param="model",
                           code="model_not_found")

    def model_of(self, name: str | None) -> str:
        """The served model a request names (404 where this server does not serve it);
        without one (TEI names none), the one adapter served (400 where there are none or
        several)."""
        if name is not None:
            self.check_model(name)
            return name
        adapters = self.served.names[1:]
        if len(adapters) != 1:
            raise APIError(400, "model is missing and this server serves "
                           f"{len(adapters)} adapters: name the filter to rank with, one of "
                           f"{', '.join(self.served.names)}", param="model")
        return adapters[0]

    async def run_all(self, requests: list[SequenceRequest]) -> list[SequenceResult]:
        """Every sequence's result, queued as one owner's (the engine takes them in turn with
        other requests'); all are cancelled if one fails or the client goes away."""
        owner = object()
        futures = [self.engine.submit(request, owner=owner) for request in requests]
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except BaseException:
            self.engine.cancel(futures)
            raise

    async def respond(self, body: BaseModel, build: Callable[[], BaseModel]) -> Response:
        """The response to request `body`, built and serialised off the event loop (tokenising
        and log-prob tables take CPU time the event loop must not wait for), with the header
        naming the fields of `body` that were ignored."""
        content = await asyncio.to_thread(lambda: to_json(build()))
        return Response(content, media_type="application/json",
                        headers=ignored_header(unknown_fields(body)))

    def stream(self, body: BaseModel, events: AsyncIterator[bytes]) -> StreamingResponse:
        """The streamed response to request `body` (see `streaming`)."""
        return StreamingResponse(events, media_type=STREAM_MEDIA_TYPE,
                                 headers=ignored_header(unknown_fields(body)))



class Endpoint:
    """An endpoint class (`Chat`, `Completions`, `Scorer`, `RerankServing`, `ModelListing`): its
    requests' work, done on the server's `ServingContext`."""

    def __init__(self, context: ServingContext) -> None:
        self.context = context
