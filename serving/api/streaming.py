"""Streamed replies (`"stream": true`): running sequences' tokens as OpenAI's server-sent events.

A chat stream opens with `{"delta": {"role": "assistant", "content": ""}}`, then sends each
piece of text as it becomes final, its tokens' log-probs beside it when asked for, then a last
chunk with the rest of the text and its `finish_reason`, then, with
`stream_options.include_usage`, a chunk of usage alone (`choices` empty), then `data: [DONE]`.
A completions stream is the same in the `text_completion` format, one choice index per
prompt, `echo` sending the prompt (and its log-probs) first. The deltas of a stream
concatenate to the text the same request gets unstreamed, and its log-prob entries to that
reply's entries (`StreamedText`). A failure once the stream is under way, when its status can
no longer change, ends it with an event `data: {"error": {...}}`, which OpenAI's clients raise.

The sequences are submitted only when the stream starts, and cancelled when it ends for any
reason, a client that goes away mid-stream included (`disconnect` cancels the task that runs
the stream), so no sequence outlives its stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from typing import Any

from transformers import PreTrainedTokenizerBase

from sieverag.serving.api.chat.protocol import ChatChunkChoice, ChatCompletionChunk, ChatDelta
from sieverag.serving.api.completions.protocol import Completion, CompletionChoice
from sieverag.serving.api.generation_protocol import FinishReason
from sieverag.serving.api.openai_format import (
    chat_id,
    chat_logprobs,
    completion_id,
    legacy_logprobs,
    usage,
)
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.sequence_types import (
    SequenceRequest,
    SequenceResult,
    TokenEvent,
    TokenListener,
    TokenLogprob,
)
from sieverag.serving.engine.tokens import EncodedPrompt
from sieverag.serving.refusals import error_body

logger = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"

# A token's log-prob entry and its text's offset in the sequence's text.
Placed = tuple[TokenLogprob, int]


def event(data: str) -> bytes:
    """One server-sent event carrying `data` (JSON: one line)."""
    return f"data: {data}\n\n".encode()


def error_event(body: dict[str, Any]) -> bytes:
    """The event that ends a stream which failed once under way."""
    return event(json.dumps(body))


class TokenFeed:
    """The tokens of one request's sequences, handed from the engine's worker thread to the
    event loop, in the order they were chosen; each sequence ends with `None`."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, TokenEvent | None]] = asyncio.Queue()

    def listener(self, index: int) -> TokenListener:
        """The listener of sequence `index` (runs on the worker thread)."""
        return lambda token: self._put((index, token))

    def watch(self, index: int, future: Future[SequenceResult]) -> None:
        """End sequence `index` once `future` is done (after its last token)."""
        future.add_done_callback(lambda _: self._put((index, None)))

    async def next(self) -> tuple[int, TokenEvent | None]:
        return await self._queue.get()

    def _put(self, item: tuple[int, TokenEvent | None]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class StreamedText:
    """One sequence's text as its tokens arrive, released as it becomes final, each token's
    log-prob entry released with the text it starts in; everything released concatenates to
    the final text and entries, as the engine returns them (special tokens skipped, cut at a
    stop string).

    Text is held back where it may yet change: an incomplete UTF-8 character, the last
    (longest stop string − 1) characters, which a stop string completed by a later token would
    cut, and, for a tokenizer that cleans up spaces on decoding (" ." → "."), everything after
    the last space. A token's text is decoded within a window of the tokens since the last
    fully decoded character (as vLLM decodes incrementally), so each token costs the same
    whatever the length; a tokenizer that cleans up spaces rewrites text across tokens, and is
    decoded whole instead.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._whole = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._ids: list[int] = []
        self._window = 0  # the first token of the decoding window
        self._decoded = 0  # tokens whose text is complete
        self._complete = ""  # the text of the first `_decoded` tokens
        self._text = ""  # all the text so far, incomplete characters left out
        self._pending: list[Placed] = []
        self.sent = ""

    def add(self, token: TokenEvent) -> tuple[str, list[Placed]]:
        """The text and the entries this token releases. The token that ends the sequence
        releases nothing: what is left comes from the final text (`finish`)."""
        self._pending.append((token.token, len(self._text)))
        self._ids.append(token.token.token_id)
        if token.last:
            return "", []
        self._decode()
        released = self._text[:len(self._text) - self._hold]
        if self._whole:
            released = released[:max(released.rfind(" "), 0)]
        if len(released) <= len(self.sent) or not released.startswith(self.sent):
            return "", []
        delta, self.sent = released[len(self.sent):], released
        return delta, self._release(lambda offset: offset < len(released))

    def finish(self, final_text: str) -> tuple[str, list[Placed]]:
        """The rest of the text and of the entries, once the sequence has its `final_text`;
        an entry past a cut text points at its end."""
        if not final_text.startswith(self.sent):
            logger.error("a streamed reply's text diverged from its final text; the stream's "
                         "text is %r, the reply's %r", self.sent, final_text)
        delta, self.sent = final_text[len(self.sent):], final_text
        return delta, [(entry, min(offset, len(final_text)))
                       for entry, offset in self._release(lambda offset: True)]

    def _release(self, done: Callable[[int], bool]) -> list[Placed]:
        released = [placed for placed in self._pending if done(placed[1])]
        self._pending = [placed for placed in self._pending if not done(placed[1])]
        return released

    def _decode(self) -> None:
        decode = self._tokenizer.decode
        if self._whole:
            self._text = decode(self._ids, skip_special_tokens=True).rstrip("\ufffd")
            return
        before = decode(self._ids[self._window:self._decoded], skip_special_tokens=True)
        after = decode(self._ids[self._window:], skip_special_tokens=True)
        tail = after[len(before):]
        if tail and not tail.endswith("\ufffd"):
            self._complete += tail
            self._window, self._decoded = self._decoded, len(self._ids)
            tail = ""
        self._text = self._complete + tail.rstrip("\ufffd")


def chat_stream(engine: BatchingEngine, request: SequenceRequest, prompt: EncodedPrompt,
                *, model: str, logprobs: bool, include_usage: bool,
                tokenizer: PreTrainedTokenizerBase) -> AsyncIterator[bytes]:
    """The events of a streamed /v1/chat/completions reply to `request`."""
    reply_id, created = chat_id(), int(time.time())

    def chunk(delta: ChatDelta, placed: list[Placed] | None = None,
              finish: FinishReason | None = None) -> bytes:
        entries = (chat_logprobs(tokenizer, [entry for entry, _ in placed or []]) if logprobs
                   else None)
        choice = ChatChunkChoice(delta=delta, logprobs=entries, finish_reason=finish)
        return event(ChatCompletionChunk(id=reply_id, created=created, model=model,
                                         choices=[choice]).model_dump_json())

    async def events(feed: TokenFeed, futures: list[Future[SequenceResult]]
                     ) -> AsyncIterator[bytes]:
        text = StreamedText(tokenizer, request.stop)
        yield chunk(ChatDelta(role="assistant", content=""))
        while (item := await feed.next())[1] is not None:
            delta, placed = text.add(item[1])
            if delta or (logprobs and placed):
                yield chunk(ChatDelta(content=delta), placed)
        result = futures[0].result()
        delta, placed = text.finish(result.text)
        yield chunk(ChatDelta(content=delta), placed, result.finish_reason)
        if include_usage:
            yield event(ChatCompletionChunk(id=reply_id, created=created, model=model,
                                            choices=[], usage=usage([prompt], [result])
                                            ).model_dump_json())

    return _stream(engine, [request], events)


def completion_stream(
    engine: BatchingEngine, requests: Sequence[SequenceRequest],
    prompts: Sequence[EncodedPrompt], *, model: str, echo: bool, logprobs: int | None,
    include_usage: bool, tokenizer: PreTrainedTokenizerBase,
) -> AsyncIterator[bytes]:
    """The events of a streamed /v1/completions reply: one choice index per prompt."""
    reply_id, created = completion_id(), int(time.time())

    def chunk(index: int, text: str, placed: list[Placed] | None = None,
              finish: FinishReason | None = None, *,
              prompt_logprobs: Sequence[TokenLogprob | None] | None = None) -> bytes:
        table = None
        if logprobs is not None:
            start = len(prompts[index].text) if echo else 0
            table = legacy_logprobs(
                tokenizer, prompts[index] if prompt_logprobs is not None else None,
                prompt_logprobs, [entry for entry, _ in placed or []],
                [start + offset for _, offset in placed or []])
        choice = CompletionChoice(index=index, text=text, logprobs=table, finish_reason=finish)
        return event(Completion(id=reply_id, created=created, model=model,
                                choices=[choice]).model_dump_json())

    def echoed(index: int, prompt_logprobs: Sequence[TokenLogprob | None] | None) -> bytes:
        return chunk(index, prompts[index].text, prompt_logprobs=prompt_logprobs)

    async def events(feed: TokenFeed, futures: list[Future[SequenceResult]]
                     ) -> AsyncIterator[bytes]:
        texts = [StreamedText(tokenizer, request.stop) for request in requests]
        results: list[SequenceResult | None] = [None] * len(requests)
        started = [False] * len(requests)
        while any(result is None for result in results):
            index, token = await feed.next()
            if token is None:
                result = results[index] = futures[index].result()
                if echo and not started[index]:
                    yield echoed(index, result.prompt_logprobs)
                delta, placed = texts[index].finish(result.text)
                yield chunk(index, delta, placed, result.finish_reason)
                continue
            if echo and not started[index]:
                yield echoed(index, token.prompt_logprobs)
            started[index] = True
            delta, placed = texts[index].add(token)
            if delta or (logprobs is not None and placed):
                yield chunk(index, delta, placed)
        if include_usage:
            yield event(Completion(id=reply_id, created=created, model=model, choices=[],
                                   usage=usage(prompts, [r for r in results if r is not None])
                                   ).model_dump_json())

    return _stream(engine, requests, events)


Events = Callable[[TokenFeed, list[Future[SequenceResult]]], AsyncIterator[bytes]]


async def _stream(engine: BatchingEngine, requests: Sequence[SequenceRequest],
                  events: Events) -> AsyncIterator[bytes]:
    """Submit `requests` (sequence i feeding index i), send what `events` makes of their
    tokens, then [DONE]; a failure ends the stream with an error event instead. The sequences
    are cancelled however the stream ends (a no-op for those finished)."""
    feed = TokenFeed()
    futures: list[Future[SequenceResult]] = []
    owner = object()  # the request's sequences take their turns as one
    try:
        for index, request in enumerate(requests):
            futures.append(engine.submit(request, feed.listener(index), owner=owner))
            feed.watch(index, futures[-1])
        async for item in events(feed, futures):
            yield item
        yield DONE
    except Exception as exc:
        yield _failed(exc)
    finally:
        engine.cancel(futures)


def _failed(exc: Exception) -> bytes:
    logger.error("a streamed reply failed once under way", exc_info=exc)
    return error_event(error_body(f"the stream failed: {type(exc).__name__}: {exc}",
                                  "server_error"))
