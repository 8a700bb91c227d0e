"""The vLLM launcher (`sieverag serve --engine vllm`): `vllm serve` as a managed subprocess.

vLLM lives in its own environment (it pins its own torch and transformers), so it is run as
an executable, found on PATH or given as `vllm_bin`. The launcher builds the command line
(`build_vllm_command`, a pure function: sieverag's options, prefix caching on unless turned
off, then the user's `extra_args` verbatim), starts it, waits until `/v1/models` answers,
forwards SIGINT/SIGTERM to it and stops it cleanly (SIGTERM, then SIGKILL for its whole
process group after `stop_timeout_s`). An API key is passed in the child's environment
(VLLM_API_KEY), never on its command line, where other users could read it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from sieverag.inference.llm.models import EMBEDDED_MODELS, resolve_model
from sieverag.serving.adapters import Adapter, resolve_adapters
from sieverag.serving.auth import read_api_key
from sieverag.serving.config import VLLMLaunchConfig
from sieverag.serving.errors import AdapterError, ServerStartError

logger = logging.getLogger(__name__)

# The LoRA ranks vLLM accepts for --max-lora-rank.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# vLLM needs nothing of sieverag (the launcher runs its executable), and sieverag's pins
# (transformers>=5) may clash with a vLLM release's own: its environment holds vLLM alone.
INSTALL_HINT = ("install vLLM in its own environment: python -m venv ~/.venvs/vllm && "
                "~/.venvs/vllm/bin/pip install vllm")


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise AdapterError(f"LoRA rank {rank} is above the largest rank vLLM serves "
                       f"({VLLM_LORA_RANKS[-1]}); train the adapter with a smaller r")


def build_vllm_command(
    config: VLLMLaunchConfig, adapters: Sequence[Adapter], *, executable: str,
    model: str, served_model_name: str | None = None,
) -> list[str]:
    """The `vllm serve` argv: `model` as vLLM should load it, adapters already resolved."""
    command = [executable, "serve", model, "--host", config.host, "--port", str(config.port),
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
    return command + config.extra_argv


def find_vllm(vllm_bin: str | None) -> str:
    """The vllm executable: `vllm_bin` if given, else `vllm` on PATH."""
    if vllm_bin is not None:
        path = Path(vllm_bin).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.resolve())
        raise ServerStartError(f"--vllm.vllm-bin {vllm_bin} is not an executable file; "
                               f"{INSTALL_HINT}, then give its bin/vllm")
    found = shutil.which("vllm")
    if found is None:
        raise ServerStartError(f"no `vllm` executable on PATH; {INSTALL_HINT}, then put its "
                               "bin folder on PATH or give --vllm.vllm-bin")
    return found


class VLLMServer:
    """One `vllm serve` subprocess: start, wait until ready, stop (or `run` in the foreground).

    The constructor checks everything it can before a GPU is touched: the executable, the
    adapters (names, ranks) and the API key variable.
    """

    def __init__(self, config: VLLMLaunchConfig) -> None:
        self.config = config
        executable = find_vllm(config.vllm_bin)
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
        self.command = build_vllm_command(config, self.adapters, executable=executable,
                                          model=model, served_model_name=served_name)
        self.model_names = [served_name or model, *(a.name for a in self.adapters)]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.config.port}/v1"

    def start(self) -> VLLMServer:
        """Start the subprocess (in its own session, so a terminal's Ctrl-C reaches it only
        through the launcher)."""
        env = dict(os.environ)
        if self._api_key is not None:
            env["VLLM_API_KEY"] = self._api_key
        logger.info("starting: %s", " ".join(self.command))
        self._process = subprocess.Popen(self.command, env=env, start_new_session=True)
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
                    raise ServerStartError(f"vLLM exited with code {code} before it was ready;"
                                           " see its output above")
                try:
                    if client.get(f"{self.base_url}/models").status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"vLLM did not answer {self.base_url}/models within "
                        f"{self.config.startup_timeout_s:g} s (--startup-timeout); see its "
                        "output above, or allow longer for large models")
                time.sleep(0.25)
        return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to its process group after `stop_timeout_s`."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        self._wait_or_kill(process)

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
            raise ServerStartError(f"vLLM exited with code {process.returncode}; see its output "
                                   "above")
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

    def _wait_or_kill(self, process: subprocess.Popen[bytes]) -> None:
        try:
            process.wait(self.config.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("vLLM did not stop within %g s; killing it", self.config.stop_timeout_s)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
