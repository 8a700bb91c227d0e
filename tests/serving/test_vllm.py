"""The vLLM launcher's pure parts: the command line it builds, where it finds vLLM's
environment, the CPU settings it passes, and the adapters it refuses before vLLM starts.
Starting, serving and stopping the real vLLM: tests/inference/llm/test_vllm_real.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from repo_paths import REPO

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.serving.adapters import Adapter, resolve_adapters
from sieverag.serving.cli import ServeCommand, engine_config
from sieverag.serving.config import (
    VLLM_PYTHON_ENV,
    VLLM_VENV,
    VLLMLaunchConfig,
    client_base_url,
)
from sieverag.serving.errors import AdapterError, ServerStartError
from sieverag.serving.vllm import launcher as vllm_launcher
from sieverag.serving.vllm.launcher import (
    INSTALL_HINT,
    VLLM_SERVER_MODULE,
    VLLM_SITE,
    VLLMServer,
    build_vllm_command,
    find_vllm_python,
    vllm_environment,
    vllm_lora_rank,
)


def write_adapter(folder: Path, r: int, **settings: object) -> Path:
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": r, **settings}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + folder.name.encode())
    return folder


@pytest.fixture()
def vllm_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable standing for vLLM's Python, given by $SIEVERAG_VLLM_PYTHON (the launcher
    only checks that it exists here: nothing is started)."""
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(python))
    return python


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "base-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


# ----- the command line (pure) -----

@pytest.mark.parametrize(("host", "port", "expected"), [
    ("127.0.0.1", 8000, "http://127.0.0.1:8000/v1"),
    ("0.0.0.0", 9001, "http://127.0.0.1:9001/v1"),
    ("", 8000, "http://127.0.0.1:8000/v1"),
    ("::1", 8000, "http://[::1]:8000/v1"),
    ("gpu-box", 80, "http://gpu-box:80/v1"),
])
def test_the_base_url_a_client_uses_reaches_the_bound_host(host: str, port: int,
                                                           expected: str) -> None:
    """Both engines' `base_url` (the embedded server's and vLLM's launcher's)."""
    assert client_base_url(host, port) == expected
    assert VLLMServer(VLLMLaunchConfig(host=host, port=port)).base_url == expected


@pytest.mark.parametrize(("rank", "expected"), [
    (1, 8), (8, 8), (9, 16), (64, 64), (200, 256), (300, 320), (321, 512), (512, 512)])
def test_lora_rank_is_rounded_up_to_a_rank_vllm_accepts(rank: int, expected: int) -> None:
    assert vllm_lora_rank(rank) == expected


def test_rank_above_vllm_limit_is_refused() -> None:
    with pytest.raises(AdapterError, match="above the largest rank vLLM serves"):
        vllm_lora_rank(513)


def test_build_vllm_command() -> None:
    config = VLLMLaunchConfig(model="org/base", port=8123, tensor_parallel_size=2,
                              gpu_memory_utilization=0.5, max_model_len=4096, max_logprobs=5,
                              dtype="float32")
    adapters = [Adapter("chunk", Path("/a/chunk"), 12), Adapter("sent", Path("/a/sent"), 4)]
    command = build_vllm_command(config, adapters, python="/env/bin/python",
                                 model="/models/base", served_model_name="org/base")
    assert command == [
        "/env/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
        "/models/base", "--host", "127.0.0.1", "--port", "8123", "--dtype", "float32",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5", "--max-logprobs", "5",
        "--served-model-name", "org/base", "--max-model-len", "4096", "--enable-prefix-caching",
        "--enable-lora", "--lora-modules", "chunk=/a/chunk", "sent=/a/sent",
        "--max-lora-rank", "16", "--max-loras", "2",
    ]
    bare = build_vllm_command(VLLMLaunchConfig(model="m"), [], python="python", model="m")
    assert "--enable-lora" not in bare and "--served-model-name" not in bare


def test_extra_args_pass_through_and_prefix_caching_can_be_turned_off() -> None:
    config = VLLMLaunchConfig(model="m", prefix_caching=False, extra_args=(
        "--enforce-eager --max-num-seqs 64 --override-generation-config "
        "'{\"temperature\": 0, \"top_p\": 1}'"))
    command = build_vllm_command(config, [], python="python", model="m")
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


def test_the_docs_show_the_command_the_launcher_builds_for_the_shipped_filter() -> None:
    """The vLLM docs page quotes the command line for its example: it must stay the one the
    launcher builds (folders shown as placeholders)."""
    readme = (REPO / "docs" / "serving" / "vllm.md").read_text(
        encoding="utf-8")
    shown = readme.split("The launcher runs this command", 1)[1].split("```")[1].split()
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=(f"filter={DEFAULT_FILTER_NAME}",),
                              port=8000, max_model_len=4096)
    adapters = resolve_adapters(config.adapters, base_name=config.model)
    built = build_vllm_command(config, adapters, python="<vllm env>/bin/python",
                               model="<model folder>", served_model_name=config.model)
    package = str(Path(vllm_launcher.__file__).resolve().parents[2])
    assert shown == " ".join(built).replace(package, "<sieverag>").split()


def test_embedded_model_is_served_from_its_folder_under_its_name(
    vllm_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_launcher, "resolve_model", lambda name: Path("/cache/models") / name)
    server = VLLMServer(VLLMLaunchConfig(model="smollm2-135m-instruct"))
    assert server.command[:5] == [str(vllm_python), "-m", VLLM_SERVER_MODULE, "--model",
                                  "/cache/models/smollm2-135m-instruct"]
    served = server.command.index("--served-model-name")
    assert server.command[served + 1] == "smollm2-135m-instruct"


# ----- finding vLLM's environment -----

def test_vllm_python_comes_from_the_option_then_the_variable(
    vllm_python: Path, tmp_path: Path
) -> None:
    assert find_vllm_python(None) == str(vllm_python)
    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert find_vllm_python(str(other)) == str(other)
    with pytest.raises(ServerStartError, match="--vllm.python .*nope is not an executable file"):
        find_vllm_python(str(tmp_path / "nope"))


def test_vllm_python_is_found_in_the_working_folder_venv_then_from_vllm_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    # Not beside this checkout: the test must not depend on whether `make vllm` ran here.
    monkeypatch.setattr(vllm_launcher, "__file__", str(tmp_path / "pkg" / "serving" / "x.py"))
    work = tmp_path / "work"
    venv_python = work / VLLM_VENV / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    venv_python.chmod(0o755)
    monkeypatch.chdir(work)
    assert find_vllm_python(None) == str(venv_python)
    # No venv in the working folder: the interpreter on the first line of `vllm` on PATH.
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!{venv_python}\nfrom vllm.entrypoints.cli.main import main\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert find_vllm_python(None) == str(venv_python)


def test_no_vllm_environment_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_launcher, "__file__", str(tmp_path / "pkg" / "serving" / "x.py"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerStartError, match="no vLLM environment found") as error:
        VLLMServer(VLLMLaunchConfig(model="m"))
    assert INSTALL_HINT in str(error.value) and "make vllm" in str(error.value)


# ----- vLLM's CPU settings -----

def test_cpu_settings_reach_vllm_in_its_environment() -> None:
    env = vllm_environment(VLLMLaunchConfig(model="m", cpu_kvcache_gib=3),
                           {"PATH": "/bin", "PYTHONPATH": "/mine"})
    assert env == {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "3",
                   "VLLM_CPU_OMP_THREADS_BIND": "auto",
                   "PYTHONPATH": f"{VLLM_SITE}{os.pathsep}/mine"}
    assert (VLLM_SITE / "sitecustomize.py").is_file()
    listed = vllm_environment(VLLMLaunchConfig(model="m", cpu_cores="0-3,6"), {})
    assert listed["VLLM_CPU_OMP_THREADS_BIND"] == "0-3,6"
    assert listed["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    every = vllm_environment(VLLMLaunchConfig(model="m", cpu_cores="all"), {})
    assert every["VLLM_CPU_OMP_THREADS_BIND"].split(",") == [
        str(core) for core in sorted(os.sched_getaffinity(0))]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu_cores", "first two", "cpu_cores must be auto, all or a list"),
    ("cpu_cores", "0-", "cpu_cores must be auto, all or a list"),
    ("cpu_kvcache_gib", 0, "cpu_kvcache_gib must be >= 1"),
    ("python", "", "python must be the path")])
def test_bad_cpu_settings_are_refused_naming_the_field(field: str, value: object,
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        VLLMLaunchConfig(model="m", **{field: value})


# ----- adapters vLLM would refuse, refused first -----

@pytest.mark.parametrize(("settings", "reason"), [
    ({"use_dora": True}, "use_dora=True: vLLM does not support DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save=\\['lm_head'\\]: vLLM loads no"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights='pissa'"),
    ({"bias": "all"}, "bias='all': vLLM does not support adapter bias")])
def test_an_adapter_vllm_refuses_is_named_with_the_reason_before_vllm_starts(
    vllm_python: Path, tmp_path: Path, model_dir: Path, settings: dict, reason: str
) -> None:
    adapter = write_adapter(tmp_path / "odd-adapter", r=8, **settings)
    with pytest.raises(AdapterError, match=f"adapter odd .*odd-adapter.* cannot be served by "
                                           f"vLLM: {reason}"):
        VLLMServer(VLLMLaunchConfig(model=str(model_dir), adapters=(f"odd={adapter}",)))


def test_an_adapter_above_vllms_largest_rank_is_named(
    vllm_python: Path, tmp_path: Path, model_dir: Path
) -> None:
    adapter = write_adapter(tmp_path / "wide", r=8, rank_pattern={"q_proj": 1024})
    with pytest.raises(AdapterError, match="adapter wide .*LoRA rank 1024 is above the largest"):
        VLLMServer(VLLMLaunchConfig(model=str(model_dir), adapters=(f"wide={adapter}",)))


def test_a_plain_lora_adapter_passes_and_is_served_with_a_rank_vllm_accepts(
    vllm_python: Path, tmp_path: Path, model_dir: Path
) -> None:
    adapter = write_adapter(tmp_path / "plain", r=24, use_dora=False, bias="none",
                            modules_to_save=None, init_lora_weights=True)
    server = VLLMServer(VLLMLaunchConfig(model=str(model_dir), adapters=(f"plain={adapter}",)))
    assert server.command[server.command.index("--max-lora-rank") + 1] == "32"
    assert f"plain={adapter.resolve()}" in server.command
