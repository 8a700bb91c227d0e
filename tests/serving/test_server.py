"""The embedded server on a tiny random model: endpoints, adapters, errors, auth, batching."""

from __future__ import annotations

import json
import logging
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from tiny_server import ServeProcess, fail_next_decode_step

from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig
from sieverag.serving import local_server
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine import scheduling
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.scheduling import PREFILL_TOKEN_BUDGET
from sieverag.serving.engine.sequence_types import EngineClosedError, SequenceRequest
from sieverag.serving.engine.served_model import load_served_model
from sieverag.serving.listen import listening_socket
from sieverag.serving.local_server import LocalServer

# The tiny model's server and its clients (`server`, `client`, `http`): tests/tiny_server.py.
pytest_plugins = ["tiny_server"]

CONVERSATION = [{"role": "user", "content": "Which city is the capital of France?"}]
REPLY = " Paris is the capital. ✓"


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rank-4 LoRA on q_proj/v_proj whose B weights are non-zero, so it changes outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8,
                                                  target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    out = tmp_path_factory.mktemp("tiny-lora")
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tiny_adapter_dir: Path) -> Iterator[LocalServer]:
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"lora={tiny_adapter_dir}",),
                               port=0, access_log=False)
    with LocalServer(config) as running:
        yield running


def base_name(server: LocalServer) -> str:
    return server.engine.served.name


# ----- endpoints, parsed by the official client -----

def test_health_and_models_list_base_and_adapter(server: LocalServer, client: openai.OpenAI
                                                 ) -> None:
    # Started on port 0, the server reports the port the system gave it.
    assert server.port > 0 and server.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list()] == [base_name(server), "lora"]
    # An adapter without a filter card (and the base model) shows none.
    listed = httpx.get(f"{server.base_url}/models").json()["data"]
    assert all("filter_card" not in entry for entry in listed)


def test_completion_with_echo_and_logprobs(server: LocalServer, client: openai.OpenAI) -> None:
    prompt = "Hello world, héllo ✓ again"
    reply = client.completions.create(model=base_name(server), prompt=prompt, max_tokens=3,
                                      logprobs=2, echo=True, temperature=0)
    choice = reply.choices[0]
    prompt_tokens = len(server.engine.served.tokenizer(prompt)["input_ids"])
    assert reply.usage.prompt_tokens == prompt_tokens and reply.usage.completion_tokens == 3
    assert choice.text.startswith(prompt) and choice.finish_reason == "length"
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == prompt_tokens + 3
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    # Offsets index the returned text; the first generated token starts right after the prompt.
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[prompt_tokens] == len(prompt)
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    for top, token, value in zip(logprobs.top_logprobs[1:], logprobs.tokens[1:],
                                 logprobs.token_logprobs[1:], strict=True):
        assert top[token] == value and 2 <= len(top) <= 3  # the 2 best plus the chosen one
    # Greedy: each generated token is the best of its top-k.
    for top, value in zip(logprobs.top_logprobs[-3:], logprobs.token_logprobs[-3:], strict=True):
        assert value == max(top.values())


def test_echo_of_a_long_prompt_matches_a_direct_forward(server: LocalServer,
                                                        client: openai.OpenAI) -> None:
    """Prompt log-probs of a prompt longer than one slice (512 positions) are the model's."""
    prompt = " ".join(f"word{i}" for i in range(180))
    reply = client.completions.create(model="lora", prompt=prompt, max_tokens=0, echo=True,
                                      logprobs=0)
    served = server.engine.served
    ids = served.tokenizer(prompt)["input_ids"]
    assert len(ids) > 600
    with torch.inference_mode(), served.activated("lora"):
        logits = served.model(input_ids=torch.tensor([ids])).logits[0, :-1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids[1:])[:, None])
    assert reply.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        expected.squeeze(1).tolist(), abs=1e-4)


def test_long_prompts_of_different_lengths_prefill_slice_by_slice(
        server: LocalServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two echo prompts over one slice (512 positions), left-padded in one prefill pass run
    slice by slice (a step budget that takes both and slices of PROMPT_SLICE, as on a GPU):
    each one's prompt log-probs and greedy continuation are the model's own on that prompt
    alone."""
    monkeypatch.setattr(server.engine, "max_batch_tokens", PREFILL_TOKEN_BUDGET)
    monkeypatch.setattr(scheduling, "CPU_PROMPT_SLICE", scheduling.PROMPT_SLICE)
    prompts = [" ".join(f"word{i}" for i in range(count)) for count in (190, 160)]
    served = server.engine.served
    widths: list[int] = []  # positions per forward pass of the model (decode steps run apart)
    hook = served.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True)
    try:
        reply = client.completions.create(model="lora", prompt=prompts, max_tokens=2,
                                          echo=True, logprobs=0, temperature=0)
    finally:
        hook.remove()
    assert max(widths) == 512 and len(widths) == 2  # two slices of the prompts
    for prompt, choice in zip(prompts, reply.choices, strict=True):
        ids = served.tokenizer(prompt)["input_ids"]
        assert len(ids) > 512
        with torch.inference_mode(), served.activated("lora"):
            logits = served.model(input_ids=torch.tensor([ids])).logits[0]
            logprobs = torch.log_softmax(logits.float(), -1)
            first = int(logprobs[-1].argmax())
            second = int(served.model(input_ids=torch.tensor([[*ids, first]])).logits[0, -1]
                         .argmax())
        expected = logprobs[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
        scored = choice.logprobs.token_logprobs
        assert len(scored) == len(ids) + 2
        assert scored[1:len(ids)] == pytest.approx(expected.tolist(), abs=1e-4)
        assert choice.text == prompt + served.tokenizer.decode([first, second])


def test_prompt_list_and_max_tokens_zero_and_one(server: LocalServer, client: openai.OpenAI
                                                 ) -> None:
    reply = client.completions.create(model=base_name(server), prompt=["One", "Two three"],
                                      max_tokens=1, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == 2
    assert all(c.text and c.logprobs is None for c in reply.choices)
    zero = client.completions.create(model=base_name(server), prompt="Just score me",
                                     max_tokens=0, echo=True, logprobs=0)
    assert zero.choices[0].text == "Just score me" and zero.usage.completion_tokens == 0
    assert len(zero.choices[0].logprobs.tokens) == zero.usage.prompt_tokens
    token_ids = server.engine.served.tokenizer("Just score me")["input_ids"]
    by_ids = client.completions.create(model=base_name(server), prompt=token_ids, max_tokens=0,
                                       echo=True, logprobs=0)
    assert by_ids.choices[0].text == "Just score me"
    assert by_ids.choices[0].logprobs.token_logprobs == zero.choices[0].logprobs.token_logprobs


def test_chat_with_logprobs_matches_hf_greedy_generation(
    server: LocalServer, client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    reply = client.chat.completions.create(model=base_name(server), messages=CONVERSATION,
                                           max_tokens=6, temperature=0, logprobs=True,
                                           top_logprobs=3)
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy picks the best
        assert bytes(entry.bytes).decode() == entry.token
    hf = HFBackend(HFBackendConfig(model=str(tiny_model_dir)))
    assert choice.message.content == hf.generate([CONVERSATION],
                                                 GenerationSettings(max_new_tokens=6))[0]


def test_stop_strings_and_seeded_sampling(server: LocalServer, client: openai.OpenAI) -> None:
    model = base_name(server)
    free = client.completions.create(model=model, prompt="Count:", max_tokens=8, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = client.completions.create(model=model, prompt="Count:", max_tokens=8, temperature=0,
                                    stop=[stop])
    assert cut.choices[0].text == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model=model, prompt="Count:", max_tokens=8,
                                         temperature=1.5, seed=7).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1] != text


# ----- adapters -----

def test_adapter_selection_changes_logprobs_and_matches_hf(
    server: LocalServer, tiny_model_dir: Path, tiny_adapter_dir: Path
) -> None:
    """Echo log-probs through the openai backend equal the hf backend's, for base and adapter."""
    scores = {}
    for name, adapter in ((base_name(server), None), ("lora", str(tiny_adapter_dir))):
        config = OpenAIBackendConfig(base_url=server.base_url, model=name,
                                     chat_template_model=str(tiny_model_dir))
        with OpenAIBackend(config) as remote:
            served = remote.continuation_logprob([CONVERSATION] * 2, [REPLY, " No."])
        local = HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=adapter))
        expected = local.continuation_logprob([CONVERSATION] * 2, [REPLY, " No."])
        assert served == pytest.approx(expected, abs=1e-4)
        scores[name] = served
    assert abs(scores["lora"][0] - scores[base_name(server)][0]) > 0.1


# ----- refusals -----

@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/completions", '{"model": "nope", "prompt": "hi"}', 404, "model"),
    ("/completions", '{"model": "/some/adapter/path", "prompt": "hi"}', 404, "model"),
    ("/completions", '{"model": "lora", "prompt": "hi",', 400, None),
    ("/completions", '["not", "an", "object"]', 400, None),
    ("/completions", '{"model": "lora", "prompt": "hi", "max_tokens": -1}', 400, "max_tokens"),
    ("/completions", '{"model": "lora", "prompt": "hi", "logprobs": 21}', 400, "logprobs"),
    ("/completions", '{"model": "lora", "prompt": "hi", "best_of": 2}', 400, "best_of"),
    ("/completions", '{"model": "lora", "prompt": []}', 400, "prompt"),
    ("/completions", '{"model": "lora", "prompt": [99999999]}', 400, "prompt"),
    ("/completions", '{"model": "lora", "prompt": "lone \\ud800 surrogate"}', 400, "prompt"),
    ("/completions", json.dumps({"model": "lora", "prompt": "word " * 2000}), 400, "prompt"),
    ("/completions", json.dumps({"model": "lora", "prompt": "hi", "max_tokens": 1024}), 400,
     "max_tokens"),
    ("/chat/completions", '{"model": "lora", "messages": []}', 400, "messages"),
    ("/chat/completions", '{"model": "lora", "messages": [{"role": "user", "content": "hi"}], '
     '"logprobs": true, "top_logprobs": 21}', 400, "top_logprobs"),
    ("/chat/completions", '{"model": "lora", "messages": [{"role": "user", "content": "hi"}], '
     '"top_logprobs": 2}', 400, None),
    ("/chat/completions", '{"model": "lora", "messages": [{"role": "user", "content": "hi"}], '
     '"n": 2}', 400, "n"),
    ("/nowhere", "{}", 404, None),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    http: httpx.Client, path: str, body: str, status: int, param: str | None
) -> None:
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    ok = http.post("/completions", json={"model": "lora", "prompt": "still there?",
                                         "max_tokens": 1})
    assert ok.status_code == 200


def test_client_raises_on_refusals(server: LocalServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="lora", prompt="word " * 2000)


# ----- batching -----

def test_concurrent_requests_are_batched_and_unchanged_by_batching(
    server: LocalServer, http: httpx.Client
) -> None:
    prompts = [f"Request {i}: " + "tell me more " * (i + 1) for i in range(8)]

    def complete(prompt: str) -> dict:
        response = http.post("/completions", json={
            "model": "lora" if len(prompt) % 2 else base_name(server), "prompt": prompt,
            "max_tokens": 6, "temperature": 0, "logprobs": 0})
        response.raise_for_status()
        return response.json()["choices"][0]

    stats = server.engine.stats.decode_batch_sizes
    before = stats.copy()
    alone = [complete(p) for p in prompts]
    assert max(stats - before) == 1
    before = stats.copy()
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(complete, prompts))
    assert max(stats - before) > 1
    for one, batched in zip(alone, together, strict=True):
        assert batched["text"] == one["text"]
        assert batched["logprobs"]["token_logprobs"] == pytest.approx(
            one["logprobs"]["token_logprobs"], abs=1e-4)


def test_a_request_joins_a_running_batch(tiny_model_dir: Path) -> None:
    """A late, shorter sequence merges into the running batch (caches re-padded) and both
    compute what they compute alone."""
    served = load_served_model(str(tiny_model_dir), ())
    engine = BatchingEngine(served, max_batch_size=8, batch_window_s=0.0)
    engine.start()
    try:
        tokenizer = served.tokenizer
        long = SequenceRequest(model=served.name, max_tokens=40, top_logprobs=1,
                               prompt_ids=tuple(tokenizer("a long prompt " * 20)["input_ids"]))
        short = SequenceRequest(model=served.name, max_tokens=5, top_logprobs=1,
                                prompt_ids=tuple(tokenizer("short")["input_ids"]))
        alone = [engine.submit(r).result(timeout=60) for r in (long, short)]
        steps = sum(engine.stats.decode_batch_sizes.values())
        first = engine.submit(long)
        deadline = time.monotonic() + 30
        while sum(engine.stats.decode_batch_sizes.values()) < steps + 3:
            assert time.monotonic() < deadline and not first.done()
            time.sleep(0.001)
        second = engine.submit(short)
        together = [first.result(timeout=60), second.result(timeout=60)]
    finally:
        engine.close()
    assert engine.stats.decode_batch_sizes[2] > 0
    for one, joined in zip(alone, together, strict=True):
        assert joined.token_ids == one.token_ids
        assert [t.logprob for t in joined.logprobs] == pytest.approx(
            [t.logprob for t in one.logprobs], abs=1e-4)


def test_a_failing_batch_fails_its_requests_only(tiny_model_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    served = load_served_model(str(tiny_model_dir), ())
    engine = BatchingEngine(served)
    request = SequenceRequest(model=served.name, prompt_ids=(5, 6, 7), max_tokens=4)
    fail_next_decode_step(monkeypatch, engine)
    engine.start()
    try:
        with pytest.raises(RuntimeError, match="injected fault"):
            engine.submit(request).result(timeout=30)
        assert len(engine.submit(request).result(timeout=30).token_ids) == 4
    finally:
        engine.close()
    with pytest.raises(EngineClosedError):  # closed: new work is refused at once
        engine.submit(request)


def test_closing_fails_requests_still_waiting(tiny_model_dir: Path) -> None:
    served = load_served_model(str(tiny_model_dir), ())
    engine = BatchingEngine(served)  # never started: nothing will run the request
    future = engine.submit(SequenceRequest(model=served.name, prompt_ids=(5,), max_tokens=1))
    engine.close()
    with pytest.raises(EngineClosedError):
        future.result(timeout=5)


# ----- API key -----

def test_api_key_is_required_and_never_logged(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-3f9a1c"
    monkeypatch.setenv("SIEVERAG_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    config = LocalServerConfig(model=str(tiny_model_dir), port=0, api_key_env="SIEVERAG_TEST_KEY")
    with LocalServer(config) as server:
        url = server.base_url
        body = {"model": base_name(server), "prompt": "hi", "max_tokens": 1}
        missing = httpx.post(f"{url}/completions", json=body)
        wrong = httpx.post(f"{url}/completions", json=body,
                           headers={"Authorization": "Bearer sk-wrong"})
        malformed = httpx.post(f"{url}/completions", content="{oops")
        assert [missing.status_code, wrong.status_code, malformed.status_code] == [401] * 3
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
        with openai.OpenAI(base_url=url, api_key=secret, max_retries=0) as good:
            assert good.completions.create(**body).usage.completion_tokens == 1
        with openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
    assert secret not in caplog.text


def test_missing_key_variable_is_a_clear_error(tiny_model_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sieverag.inference.core.errors import ConfigError

    monkeypatch.delenv("SIEVERAG_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match="SIEVERAG_UNSET_KEY"):
        LocalServer(LocalServerConfig(model=str(tiny_model_dir), api_key_env="SIEVERAG_UNSET_KEY"))


# ----- the command line -----

def test_a_bound_socket_accepts_connections_before_uvicorn_serves() -> None:
    """The port announced by `run()` takes connections at once (they wait for uvicorn)."""
    with listening_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert port > 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_cli_serves_model_with_adapter_on_the_port_it_reports_and_stops_on_sigint(
    tiny_model_dir: Path, tiny_adapter_dir: Path
) -> None:
    served = ServeProcess(["--engine", "local", "--model", str(tiny_model_dir), "--adapters",
                           f"filter={tiny_adapter_dir}", "--port", "0"])
    try:
        announced = served.announced(timeout_s=60)
        url = announced["url"]
        assert int(announced["port"]) > 0
        models = httpx.get(f"{url}/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == [str(tiny_model_dir), "filter"]
        assert announced["names"] == f"{tiny_model_dir}, filter"
        served.process.send_signal(signal.SIGINT)
        served.process.wait(timeout=30)
    finally:
        served.kill()
    assert served.process.returncode == 0, served.log
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/models", timeout=1)


def test_cli_refuses_options_of_the_other_engine_without_starting_a_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sieverag.cli import main

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(local_server, "LocalServer", no_server)
    assert main(["serve", "--engine", "local", "--vllm.tensor-parallel-size", "2"]) == 2
    assert "--vllm.* options only apply to --engine vllm" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--local.dtype", "float32"]) == 2
    assert "--local.* options only apply to --engine local" in capsys.readouterr().err


def test_serve_settings_build_each_engine_config(tmp_path: Path) -> None:
    from sieverag.inference.core.settings import parse_settings
    from sieverag.serving.cli import ServeCommand, engine_config
    from sieverag.serving.config import VLLMLaunchConfig

    config_file = tmp_path / "serve.yaml"
    config_file.write_text("engine: vllm\nport: 8123\nvllm:\n  max_model_len: 4096\n")
    command = parse_settings(ServeCommand, ["--config", str(config_file), "--adapters",
                                            "a=/x,/y", "--vllm.tensor-parallel-size", "2"],
                             "sieverag serve")
    assert engine_config(command) == VLLMLaunchConfig(
        port=8123, adapters=("a=/x", "/y"), max_model_len=4096, tensor_parallel_size=2)
    local = parse_settings(ServeCommand, ["--local.max-batch-size", "4"], "sieverag serve")
    assert engine_config(local) == LocalServerConfig(max_batch_size=4)
