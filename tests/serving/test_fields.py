"""The field policy of the embedded server (serving/api/field_policy.py), against requests as the
real clients send them: fields that change nothing are accepted silently, fields that cannot
be honoured get a 400 naming them, unknown ones are accepted and named in a header; and the
documentation lists exactly the fields the request models declare."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from repo_paths import REPO
from tiny_server import model

from sieverag.serving.api.chat.protocol import ChatCompletionRequest
from sieverag.serving.api.completions.protocol import CompletionRequest
from sieverag.serving.api.field_policy import (
    IGNORED_HEADER,
    MAX_HEADER_NAMES,
    markdown_table,
)
from sieverag.serving.api.rerank.detection import RerankRequest
from sieverag.serving.api.rerank.dialects.cohere import RerankV2Request
from sieverag.serving.api.score.protocol import ScoreRequest
from sieverag.serving.local_server import LocalServer

# The tiny model's server and its clients (`server`, `client`, `http`): tests/tiny_server.py.
pytest_plugins = ["tiny_server"]

DOCS = REPO / "docs" / "server-api.md"
MESSAGES = [{"role": "user", "content": "Name a river."}]


def test_harmless_chat_fields_from_the_openai_sdk_change_nothing(server: LocalServer,
                                                                  client: openai.OpenAI) -> None:
    plain = client.chat.completions.with_raw_response.create(
        model=model(server), messages=MESSAGES, max_tokens=4, temperature=0)
    assert IGNORED_HEADER not in plain.headers
    loaded = client.chat.completions.with_raw_response.create(
        model=model(server), messages=MESSAGES, max_tokens=4, temperature=0, n=1,
        logit_bias={}, parallel_tool_calls=True, store=False, metadata={"run": "7"},
        user="user-1", service_tier="auto", presence_penalty=0, frequency_penalty=0,
        tools=[], tool_choice="none", response_format={"type": "text"},
        prompt_cache_key="k", safety_identifier="s", seed=3,
        extra_body={"truncate_prompt_tokens": 50, "top_k": 1})
    # Only the fields no request model declares are named: the rest change nothing.
    assert loaded.headers[IGNORED_HEADER] == "truncate_prompt_tokens, top_k"
    assert (loaded.parse().choices[0].message.content
            == plain.parse().choices[0].message.content)


def test_harmless_completion_fields_change_nothing(server: LocalServer,
                                                   client: openai.OpenAI) -> None:
    plain = client.completions.create(model=model(server), prompt="Rivers:", max_tokens=4,
                                      temperature=0)
    loaded = client.completions.with_raw_response.create(
        model=model(server), prompt="Rivers:", max_tokens=4, temperature=0, best_of=1, n=1,
        logit_bias={}, user="user-1", suffix="", extra_body={"min_tokens": 1})
    assert loaded.headers[IGNORED_HEADER] == "min_tokens"
    assert loaded.parse().choices[0].text == plain.choices[0].text


def test_an_sdk_reply_goes_back_into_the_history(server: LocalServer,
                                                 client: openai.OpenAI) -> None:
    """`message.model_dump()` of a reply carries refusal, annotations, audio, function_call
    and tool_calls as nulls: the next request takes them without a word."""
    reply = client.chat.completions.create(model=model(server), messages=MESSAGES,
                                           max_tokens=3, temperature=0)
    history = [*MESSAGES, reply.choices[0].message.model_dump(),
               {"role": "user", "content": [{"type": "text", "text": "Another."}],
                "name": "ada"}]
    again = client.chat.completions.with_raw_response.create(
        model=model(server), messages=history, max_tokens=3)
    assert IGNORED_HEADER not in again.headers and again.parse().choices[0].message.content


@pytest.mark.parametrize(("path", "extra", "param", "named"), [
    ("/chat/completions", {"n": 2}, "n", "n"),
    ("/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools", "tools"),
    ("/chat/completions", {"tool_choice": "required"}, "tool_choice", "tool_choice"),
    ("/chat/completions", {"response_format": {"type": "json_object"}}, "response_format",
     "response_format"),
    ("/chat/completions", {"logit_bias": {"42": 5}}, "logit_bias", "logit_bias"),
    ("/chat/completions", {"presence_penalty": 0.5}, "presence_penalty", "presence_penalty"),
    ("/chat/completions", {"modalities": ["text", "audio"]}, "modalities", "modalities"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}}]}]},
     "messages", "messages[0].content[1].type"),
    ("/chat/completions", {"messages": [{"role": "tool", "content": "42",
                                         "tool_call_id": "call_1"}]},
     "messages", "messages[0].role"),
    ("/chat/completions", {"messages": [{"role": "assistant", "content": "",
                                         "tool_calls": [{"id": "call_1"}]}]},
     "messages", "messages[0].tool_calls"),
    ("/completions", {"best_of": 3}, "best_of", "best_of"),
    ("/completions", {"suffix": " the end."}, "suffix", "suffix"),
    ("/completions", {"n": 4}, "n", "n"),
])
def test_fields_that_cannot_be_honoured_are_refused_naming_them(
    server: LocalServer, http: httpx.Client, path: str, extra: dict, param: str, named: str
) -> None:
    body = ({"model": model(server), "messages": MESSAGES} if path == "/chat/completions"
            else {"model": model(server), "prompt": "Rivers:"})
    response = http.post(path, json={**body, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"{named} cannot be honoured here: ")
    assert "(accepted: " in error["message"]


def test_the_openai_sdk_raises_the_refusal(server: LocalServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="n cannot be honoured here"):
        client.chat.completions.create(model=model(server), messages=MESSAGES, n=3)


def test_the_header_spells_every_name_in_ascii_and_stays_short(server: LocalServer,
                                                               http: httpx.Client) -> None:
    odd = {"naïve": 1, "line\nbreak": 2, "quote\"": 3}
    many = {f"field_{i:02d}": i for i in range(MAX_HEADER_NAMES + 5)}
    body = {"model": model(server), "prompt": "Rivers:", "max_tokens": 1, **odd, **many}
    response = http.post("/completions", content=json.dumps(body),
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    header = response.headers[IGNORED_HEADER]
    assert header.isascii() and "\n" not in header
    names = header.split(", ")
    assert names[:3] == ["na\\u00efve", "line\\nbreak", "quote\\\""]
    assert len(names) == MAX_HEADER_NAMES + 1 and names[-1] == "... (8 more)"


# ----- the documentation -----

@pytest.mark.parametrize("request_model", [ChatCompletionRequest, CompletionRequest,
                                           RerankRequest, RerankV2Request, ScoreRequest])
def test_the_documentation_shows_each_requests_fields_by_kind(request_model: type) -> None:
    table = markdown_table(request_model)
    assert table in DOCS.read_text(), f"docs/server-api.md lacks this table:\n{table}"
