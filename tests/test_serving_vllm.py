"""The vLLM launcher without a GPU: the command line it builds, and start → ready → stop
against a stand-in `vllm` executable that records its argv and serves /v1/models."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME
from sieverag.inference.llm.models import DEFAULT_MODEL
from sieverag.inference.settings import parse_settings
from sieverag.serving import vllm_launcher
from sieverag.serving.adapters import Adapter, resolve_adapters
from sieverag.serving.cli import ServeCommand, engine_config
from sieverag.serving.config import VLLMLaunchConfig
from sieverag.serving.errors import AdapterError, ServerStartError
from sieverag.serving.vllm_launcher import (
    INSTALL_HINT,
    VLLMServer,
    build_vllm_command,
    vllm_lora_rank,
)

STAND_IN = """#!{python}
import json, os, signal, socket, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

record = os.environ["FAKE_VLLM_RECORD"]
with open(record, "w") as f:
    json.dump({{"argv": sys.argv[1:], "api_key": os.environ.get("VLLM_API_KEY")}}, f)
mode = os.environ.get("FAKE_VLLM_MODE", "ready")
if mode == "exit":
    sys.exit(3)

def on_signal(signum, frame):
    with open(record + ".signals", "a") as f:
        f.write(f"{{signum}}\\n")
    sys.exit(0)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
if mode == "never":
    while True:
        time.sleep(0.1)

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        key = os.environ.get("VLLM_API_KEY")
        if key and self.headers.get("Authorization") != f"Bearer {{key}}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({{"object": "list", "data": [{{"id": sys.argv[2]}}]}}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class SharedPortServer(HTTPServer):
    # The test holds the port bound (not listening) with SO_REUSEPORT; only this shares it.
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

port = int(sys.argv[sys.argv.index("--port") + 1])
SharedPortServer(("127.0.0.1", port), Handler).serve_forever()
"""


def write_adapter(folder: Path, r: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + folder.name.encode())
    return folder


@pytest.fixture()
def port() -> Iterator[int]:
    """A port no other program can take during the test, for the stand-in to serve on.

    vLLM binds the port it is given (it cannot bind 0 and report one), so the launcher needs a
    port number. Instead of picking a free one and hoping it stays free, the test holds it
    bound, not listening, with SO_REUSEPORT: only the stand-in (same user, same option) can
    bind it too, and connections go to the one socket that listens.
    """
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture()
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `vllm` first on PATH; returns the file where it records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable = bin_dir / "vllm"
    executable.write_text(STAND_IN.format(python=sys.executable))
    executable.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    return record


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "base-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


# ----- the command line (pure) -----

@pytest.mark.parametrize(("rank", "expected"), [
    (1, 8), (8, 8), (9, 16), (64, 64), (200, 256), (300, 320), (321, 512), (512, 512)])
def test_lora_rank_is_rounded_up_to_a_rank_vllm_accepts(rank: int, expected: int) -> None:
    assert vllm_lora_rank(rank) == expected


def test_rank_above_vllm_limit_is_refused() -> None:
    with pytest.raises(AdapterError, match="above the largest rank vLLM serves"):
        vllm_lora_rank(513)


def test_build_vllm_command() -> None:
    config = VLLMLaunchConfig(model="org/base", port=8123, tensor_parallel_size=2,
                              gpu_memory_utilization=0.5, max_model_len=4096, max_logprobs=5)
    adapters = [Adapter("chunk", Path("/a/chunk"), 12), Adapter("sent", Path("/a/sent"), 4)]
    command = build_vllm_command(config, adapters, executable="/env/bin/vllm",
                                 model="/models/base", served_model_name="org/base")
    assert command == [
        "/env/bin/vllm", "serve", "/models/base", "--host", "127.0.0.1", "--port", "8123",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5", "--max-logprobs", "5",
        "--served-model-name", "org/base", "--max-model-len", "4096", "--enable-prefix-caching",
        "--enable-lora", "--lora-modules", "chunk=/a/chunk", "sent=/a/sent",
        "--max-lora-rank", "16", "--max-loras", "2",
    ]
    bare = build_vllm_command(VLLMLaunchConfig(model="m"), [], executable="vllm", model="m")
    assert "--enable-lora" not in bare and "--served-model-name" not in bare


def test_extra_args_pass_through_and_prefix_caching_can_be_turned_off() -> None:
    config = VLLMLaunchConfig(model="m", prefix_caching=False, extra_args=(
        "--enforce-eager --max-num-seqs 64 --override-generation-config "
        "'{\"temperature\": 0, \"top_p\": 1}'"))
    command = build_vllm_command(config, [], executable="vllm", model="m")
    assert "--enable-prefix-caching" not in command
    assert command[-6:] == ["--no-enable-prefix-caching", "--enforce-eager", "--max-num-seqs",
                            "64", "--override-generation-config",
                            '{"temperature": 0, "top_p": 1}']


@pytest.mark.parametrize(("extra", "option"), [
    ("--port 9000", "--port"), ("--max_model_len=4096", "--vllm.max-model-len"),
    ("--enforce-eager --lora-modules x=/a", "--adapters"),
    ("--no-enable-prefix-caching", "--no-vllm.prefix-caching"),
    ("--api-key sk-1", "--api-key-env")])
def test_extra_args_the_launcher_sets_are_refused_naming_the_option(extra: str,
                                                                     option: str) -> None:
    with pytest.raises(ConfigError, match=f"which the launcher sets from {option}"):
        VLLMLaunchConfig(model="m", extra_args=extra)


def test_extra_args_that_cannot_be_split_are_refused() -> None:
    with pytest.raises(ConfigError, match="--vllm.extra-args .* cannot be split"):
        VLLMLaunchConfig(model="m", extra_args="--chat-template '{{ unclosed")


def test_serve_reads_extra_args_from_its_flags() -> None:
    """`--vllm.extra-args` on `sieverag serve`'s command line, the value itself flags."""
    command = parse_settings(ServeCommand, [
        "--engine", "vllm", "--model", "m", "--vllm.extra-args=--enforce-eager",
        "--no-vllm.prefix-caching"], "sieverag serve")
    config = engine_config(command)
    assert config.extra_argv == ["--enforce-eager"] and not config.prefix_caching


def test_the_readme_shows_the_command_the_launcher_builds_for_the_shipped_filter() -> None:
    """README "vLLM (GPU)" quotes the `vllm serve` line for its example: it must stay the one
    the launcher builds (folders shown as placeholders)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    shown = readme.split("The launcher runs this command", 1)[1].split("```")[1].split()
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=(f"filter={DEFAULT_FILTER_NAME}",),
                              port=8000, max_model_len=4096)
    adapters = resolve_adapters(config.adapters, base_name=config.model)
    built = build_vllm_command(config, adapters, executable="vllm", model="<model folder>",
                               served_model_name=config.model)
    package = str(Path(vllm_launcher.__file__).resolve().parents[1])
    assert shown == " ".join(built).replace(package, "<sieverag>").split()


def test_embedded_model_is_served_from_its_folder_under_its_name(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_launcher, "resolve_model", lambda name: Path("/cache/models") / name)
    server = VLLMServer(VLLMLaunchConfig(model="smollm2-135m-instruct"))
    assert server.command[1:3] == ["serve", "/cache/models/smollm2-135m-instruct"]
    served = server.command.index("--served-model-name")
    assert server.command[served + 1] == "smollm2-135m-instruct"


def test_missing_vllm_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerStartError, match="no `vllm` executable on PATH") as error:
        VLLMServer(VLLMLaunchConfig(model="m"))
    assert INSTALL_HINT in str(error.value)
    with pytest.raises(ServerStartError, match="not an executable file"):
        VLLMServer(VLLMLaunchConfig(model="m", vllm_bin=str(tmp_path / "nope")))


# ----- the subprocess, against the stand-in -----

def test_start_ready_stop(stand_in: Path, tmp_path: Path, model_dir: Path, port: int,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIEVERAG_TEST_VLLM_KEY", "sk-vllm-secret")
    named = write_adapter(tmp_path / "chunk-filter", r=24)
    bare = write_adapter(tmp_path / "sentence-filter", r=8)
    config = VLLMLaunchConfig(model=str(model_dir), adapters=(f"chunk={named}", str(bare)),
                              port=port, api_key_env="SIEVERAG_TEST_VLLM_KEY",
                              startup_timeout_s=30)
    server = VLLMServer(config)
    bare_name = server.adapters[1].name
    assert bare_name.startswith("sentence-filter-") and len(bare_name) == 16 + 8
    with server:
        answer = httpx.get(f"http://127.0.0.1:{port}/v1/models",
                           headers={"Authorization": "Bearer sk-vllm-secret"})
        assert answer.status_code == 200
    recorded = json.loads(stand_in.read_text())
    argv = recorded["argv"]
    assert argv[:2] == ["serve", str(model_dir.resolve())]
    assert argv[argv.index("--port") + 1] == str(port)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    lora = argv.index("--lora-modules")
    assert argv[lora + 1:lora + 3] == [f"chunk={named.resolve()}", f"{bare_name}={bare.resolve()}"]
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "32"
    # The key travels in the environment, never on the command line.
    assert recorded["api_key"] == "sk-vllm-secret" and "sk-vllm-secret" not in " ".join(argv)
    assert Path(f"{stand_in}.signals").read_text().split() == [str(int(signal.SIGTERM))]
    assert server._process is not None and server._process.poll() is not None


class FakeClock:
    """`time` for the launcher: `sleep` advances `monotonic` at once, so a timeout is a count
    of polls, not seconds of waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_not_ready_in_time_is_an_error_and_stops_vllm(
    stand_in: Path, model_dir: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "never")
    clock = FakeClock()
    monkeypatch.setattr(vllm_launcher, "time", clock)
    server = VLLMServer(VLLMLaunchConfig(model=str(model_dir), port=port, startup_timeout_s=1.0))
    with pytest.raises(ServerStartError, match=r"did not answer .* within 1 s"):
        with server:
            pass
    # It gave up at the first poll past the timeout (polls every 0.25 s), and stopped vLLM.
    assert 1.0 < clock.now <= 1.25
    assert server._process is not None and server._process.poll() is not None


def test_vllm_exiting_during_startup_is_an_error(
    stand_in: Path, model_dir: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit")
    with pytest.raises(ServerStartError, match="exited with code 3 before it was ready"):
        with VLLMServer(VLLMLaunchConfig(model=str(model_dir), port=port)):
            pass


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_cli_forwards_signals_and_exits_cleanly(
    stand_in: Path, tmp_path: Path, model_dir: Path, port: int, sent: signal.Signals
) -> None:
    adapter = write_adapter(tmp_path / "filter", r=16)
    process = subprocess.Popen(
        [sys.executable, "-m", "sieverag", "serve", "--engine", "vllm", "--model",
         str(model_dir), "--adapters", f"filter={adapter}", "--port", str(port),
         "--vllm.startup-timeout-s", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout],
                              daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("vLLM serves" in line for line in seen):
            assert process.poll() is None and time.monotonic() < deadline, "".join(seen)
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        process.send_signal(sent)
        process.wait(timeout=30)
    finally:
        process.kill()
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    assert process.returncode == 0, output
    assert f"vLLM serves {model_dir}, filter at http://127.0.0.1:{port}/v1" in output
    assert Path(f"{stand_in}.signals").read_text().split() == [str(int(sent))]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
