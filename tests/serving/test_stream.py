"""Streamed replies from the embedded server (tiny random model), read by the `openai` SDK:
the deltas concatenate to the unstreamed reply at temperature 0, log-probs and usage
included; the events are OpenAI's; a failure under way ends the stream with an error event.
The incremental text (`StreamedText`) on the real tokenizer: multi-byte characters, stop
strings, a tokenizer that cleans up spaces. A client leaving mid-stream is in
serving/test_cancel.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
from tiny_server import fail_next_decode_step, model
from transformers import AutoTokenizer

from sieverag.inference.llm.backend_protocol import first_stop
from sieverag.serving.api.streaming import StreamedText
from sieverag.serving.engine.sequence_types import TokenEvent, TokenLogprob
from sieverag.serving.engine.tokens import prefix_offsets
from sieverag.serving.local_server import LocalServer

# The tiny model's server and its clients (`server`, `client`, `http`): tests/tiny_server.py.
pytest_plugins = ["tiny_server"]

MESSAGES = [{"role": "user", "content": "Tell me about rivers ✓ 日本"}]


# ----- chat -----

def test_a_chat_stream_is_the_unstreamed_reply(server: LocalServer,
                                               client: openai.OpenAI) -> None:
    settings = {"model": model(server), "messages": MESSAGES, "max_tokens": 24,
                "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(**settings)
    chunks = list(client.chat.completions.create(
        **settings, stream=True, stream_options={"include_usage": True}))
    first, *middle, last, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(c.choices[0].finish_reason is None for c in middle)
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    streamed = [entry for c in chunks[:-1] if c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]
    assert streamed == whole.choices[0].logprobs.content
    assert len(middle) > 5  # the text came in pieces, not in one chunk at the end


def test_a_stop_string_across_tokens_cuts_the_stream_where_it_cuts_the_reply(
    server: LocalServer, client: openai.OpenAI
) -> None:
    settings = {"model": model(server), "messages": MESSAGES, "max_tokens": 24,
                "temperature": 0}
    free = client.chat.completions.create(**settings).choices[0].message.content
    tokenizer = server.engine.served.tokenizer
    # A stop string made of the end of one token and the start of the next.
    ids = tokenizer(free, add_special_tokens=False)["input_ids"]
    boundary = len(tokenizer.decode(ids[:6]))
    stop = free[boundary - 2:boundary + 3]
    cut = client.chat.completions.create(**settings, stop=[stop])
    chunks = list(client.chat.completions.create(**settings, stop=[stop], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == cut.choices[0].message.content == free[:free.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_streams_each_equal_their_reply(server: LocalServer) -> None:
    """Batched together, four streams from the async client each get what they get alone."""
    questions = [f"Question {i}: which river is longest?" for i in range(4)]

    async def run() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused",
                                      max_retries=0) as client:
            def settings(question: str) -> dict:
                return {"model": model(server), "max_tokens": 16, "temperature": 0,
                        "messages": [{"role": "user", "content": question}]}

            alone = [(await client.chat.completions.create(**settings(q)))
                     .choices[0].message.content for q in questions]

            async def streamed(question: str) -> str:
                stream = await client.chat.completions.create(**settings(question), stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            together = await asyncio.gather(*(streamed(q) for q in questions))
            return alone, list(together)

    decoded_together = server.engine.stats.decode_batch_sizes[4]
    alone, together = asyncio.run(run())
    assert together == alone
    assert server.engine.stats.decode_batch_sizes[4] > decoded_together


# ----- completions -----

def test_a_completions_stream_of_two_prompts_with_echo_and_logprobs(
    server: LocalServer, client: openai.OpenAI
) -> None:
    settings = {"model": model(server), "prompt": ["Rivers of Europe:", "Count ✓:"],
                "max_tokens": 12, "temperature": 0, "logprobs": 2, "echo": True}
    whole = client.completions.create(**settings)
    chunks = list(client.completions.create(**settings, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == choice.index]
        assert mine[0].text.startswith(settings["prompt"][choice.index])  # the echo first
        assert "".join(c.text for c in mine) == choice.text
        assert mine[-1].finish_reason == choice.finish_reason
        tables = [c.logprobs for c in mine if c.logprobs]
        for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for t in tables for x in getattr(t, field)] == getattr(choice.logprobs,
                                                                               field), field


def test_an_echo_stream_without_new_tokens(server: LocalServer, client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=model(server), prompt="Score me",
                                            max_tokens=0, echo=True, stream=True))
    assert [c.choices[0].text for c in chunks] == ["Score me", ""]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_events_are_openais(server: LocalServer) -> None:
    body = {"model": model(server), "prompt": "Hi", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert reply.headers["x-sieverag-ignored"] == "stream_options.continuous_usage_stats"
        raw = reply.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert {p["object"] for p in payloads} == {"text_completion"}
    assert payloads[-1]["usage"]["completion_tokens"] == 3


def test_a_failure_under_way_ends_the_stream_with_an_error_the_sdk_raises(
    server: LocalServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.engine
    fail_next_decode_step(monkeypatch, engine)
    stream = client.chat.completions.create(model=model(server), messages=MESSAGES,
                                            max_tokens=8, stream=True)
    with pytest.raises(openai.APIError, match="the stream failed: RuntimeError: injected"):
        list(stream)
    assert engine.in_flight == 0
    again = client.chat.completions.create(model=model(server), messages=MESSAGES,
                                           max_tokens=2, stream=True)
    assert list(again)[-1].choices[0].finish_reason == "length"


def test_a_refused_stream_is_an_ordinary_error(server: LocalServer,
                                               client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model(server), prompt="word " * 2000, stream=True)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES, stream=True)


# ----- the incremental text -----

@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> AutoTokenizer:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def stream_of(tokenizer: AutoTokenizer, ids: list[int], stop: tuple[str, ...] = ()
              ) -> tuple[list[str], str, list[int]]:
    """Feed `ids` one by one as the engine would (finishing at the first stop string); the
    deltas, the final text and the offsets released."""
    text = StreamedText(tokenizer, stop)
    deltas, offsets = [], []
    for count, token in enumerate(ids, start=1):
        decoded = tokenizer.decode(ids[:count], skip_special_tokens=True)
        at = first_stop(decoded, stop)
        last = at is not None or count == len(ids)
        delta, placed = text.add(TokenEvent(TokenLogprob(token, -1.0), last, None))
        deltas.append(delta)
        offsets += [offset for _, offset in placed]
        if last:
            final = decoded if at is None else decoded[:at]
            delta, placed = text.finish(final)
            deltas.append(delta)
            offsets += [offset for _, offset in placed]
            return deltas, final, offsets
    raise AssertionError("no token ended the sequence")


def test_multi_byte_characters_are_released_whole(tokenizer: AutoTokenizer) -> None:
    text = "Fjörður 日本語 🙂 ✓✓ naïve"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # Some characters span several tokens: a prefix of the tokens decodes to half of one.
    assert any(tokenizer.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids)))
    deltas, final, offsets = stream_of(tokenizer, ids)
    assert "".join(deltas) == final == text
    assert all("\ufffd" not in delta for delta in deltas)
    assert offsets == prefix_offsets(tokenizer, ids, skip_special_tokens=True)


def test_no_text_past_a_stop_string_is_ever_released(tokenizer: AutoTokenizer) -> None:
    text = "The Rhine flows north. The Danube flows east."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for stop in ("Danube", "e D", ". ", "east."):
        deltas, final, offsets = stream_of(tokenizer, ids, (stop, "unused longer stop"))
        assert final == text[:text.find(stop)]
        assert "".join(deltas) == final
        assert all(offset <= len(final) for offset in offsets)


def test_a_tokenizer_that_cleans_up_spaces_is_streamed_as_it_decodes(
    tokenizer: AutoTokenizer
) -> None:
    """(transformers cleans up a BPE tokenizer's spaces only when forced to.)"""
    ids = tokenizer("Hello , world . Is it ? Yes !", add_special_tokens=False)["input_ids"]
    forced = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    tokenizer.clean_up_tokenization_spaces = True
    setattr(tokenizer, forced, True)
    try:
        deltas, final, _ = stream_of(tokenizer, ids)
        assert final == "Hello, world. Is it? Yes!"
        assert "".join(deltas) == final and sum(bool(d) for d in deltas) > 2
    finally:
        tokenizer.clean_up_tokenization_spaces = False
        setattr(tokenizer, forced, False)
