"""vLLM for real: its CPU build (`make vllm`, .venv-vllm) started by `sieverag serve --engine
vllm` with the shipped filter, and the filter, the judge, amber, the filtering proxy and
teacher labelling giving through it what they give in-process.

One vLLM at float32 serves the module's comparisons (SmolLM2-135M-Instruct and the shipped
filter's LoRA adapter), started through the CLI as a user starts it and stopped at the end by
SIGTERM, with no process left behind. A second, at bfloat16, is compared against in-process
float32 at the GPU check's tolerances (tests/gpu/gpu_check.py). Two starts that must fail
(vLLM exits; vLLM not ready in time) end with one clear error and no process left.

Nothing here is a stand-in: each start costs vLLM's ~40 s, so the module starts it three times
(about 3 minutes with the comparisons).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import psutil
import pytest
from repo_paths import TEST_DATA, TESTS
from served_runs import comparison_config, records
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.cli import main
from sieverag.inference.composition.config import ModelRoles, RunConfig
from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.types import Document
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.data.loading import load_examples
from sieverag.inference.eval import runner
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, find_adapter
from sieverag.inference.filters.filter_format import CHUNK_LABELS, chunk_prompt
from sieverag.inference.filters.judge import MainRagJudge
from sieverag.inference.filters.mcf import MultiGranularFilter
from sieverag.inference.llm.backend_protocol import LABEL_MARK
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig
from sieverag.serving.config import LocalServerConfig, VLLMLaunchConfig
from sieverag.serving.errors import ServerStartError
from sieverag.serving.local_server import LocalServer
from sieverag.serving.proxy.marked_documents import Passage, documents_block
from sieverag.serving.vllm.launcher import VLLMServer, find_vllm_python, vllm_environment

sys.path.insert(0, str(TESTS / "gpu"))
from gpu_check import compare_filter, compare_judge  # noqa: E402

# `make test` builds vLLM's environment first and sets this: there, a missing vLLM fails the
# run. A bare `pytest` without `make vllm` skips this module, saying how to run it.
REQUIRED = os.environ.get("SIEVERAG_REQUIRE_VLLM") == "1"
try:
    find_vllm_python(None)
except ServerStartError as missing:
    if REQUIRED:
        raise RuntimeError(f"SIEVERAG_REQUIRE_VLLM=1 but {missing}") from None
    pytest.skip("no vLLM environment here: run `make vllm` (make test runs it first) to "
                "test against the real vLLM", allow_module_level=True)

pytestmark = pytest.mark.integration

FILTER = "filter"  # the shipped filter's served name
FLOAT32_TOLERANCE = 1e-3
HELD_OUT = TEST_DATA / "hotpotqa_heldout_sample.jsonl"
STARTUP_S = 300.0
# CPU settings for every start here: both cores, no torch.compile (it would add minutes), the
# worker inside the engine's process (one process start less, ~15 s of imports), 1 GiB of KV
# cache (its allocation is part of every start).
EXTRA_ARGS = "--enforce-eager --distributed-executor-backend uni"
CPU_OPTIONS = {"cpu_cores": "all", "max_model_len": 4096, "extra_args": EXTRA_ARGS,
               "cpu_kvcache_gib": 1}


def free_port() -> int:
    """A port free now (vLLM binds the number it is given; it cannot report one it chose)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ServeProcess:
    """`sieverag serve --engine vllm` running in a subprocess, its output collected."""

    process: subprocess.Popen[str]
    base_url: str
    lines: list[str] = field(default_factory=list)
    family: list[psutil.Process] = field(default_factory=list)  # vLLM and its engine processes

    @property
    def output(self) -> str:
        return "".join(self.lines)


def read_lines(process: subprocess.Popen[str]) -> queue.SimpleQueue[str]:
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    assert process.stdout is not None
    stream = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


@pytest.fixture(scope="module")
def served(embedded_model_dir: Path) -> Iterator[ServeProcess]:
    """vLLM at float32 serving SmolLM2 and the shipped filter, started as a user starts it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sieverag", "serve", "--engine", "vllm", "--model", DEFAULT_MODEL,
         "--adapters", f"{FILTER}={DEFAULT_FILTER_NAME}", "--port", str(port),
         "--vllm.dtype", "float32", "--vllm.cpu-cores", "all", "--vllm.max-model-len", "4096",
         f"--vllm.extra-args={EXTRA_ARGS}", "--vllm.cpu-kvcache-gib", "1",
         "--vllm.startup-timeout-s", str(STARTUP_S)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    running = ServeProcess(process, f"http://127.0.0.1:{port}/v1")
    lines = read_lines(process)
    try:
        deadline = time.monotonic() + STARTUP_S + 30
        while "vLLM serves" not in running.output:
            assert process.poll() is None and time.monotonic() < deadline, running.output[-3000:]
            try:
                running.lines.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        launcher = psutil.Process(process.pid)
        running.family = launcher.children(recursive=True)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        for member in running.family:
            if member.is_running():
                member.kill()


@pytest.fixture(scope="module")
def shipped_filter() -> Path:
    return find_adapter(DEFAULT_FILTER_NAME).path


@pytest.fixture(scope="module")
def in_process_filter(embedded_model_dir: Path, shipped_filter: Path) -> HFBackend:
    return HFBackend(HFBackendConfig(model=DEFAULT_MODEL, adapter=str(shipped_filter),
                                     dtype="float32"))


@pytest.fixture(scope="module")
def in_process_base(embedded_model_dir: Path) -> HFBackend:
    return HFBackend(HFBackendConfig(model=DEFAULT_MODEL, dtype="float32"))


def through(server_url: str, model: str, embedded_model_dir: Path,
            **options: object) -> OpenAIBackend:
    return OpenAIBackend(OpenAIBackendConfig(base_url=server_url, model=model,
                                             chat_template_model=str(embedded_model_dir),
                                             timeout_s=300, **options))


@pytest.fixture(scope="module")
def held_out() -> list:
    """Two held-out HotpotQA questions with their 10 passages each (20 chunks)."""
    return load_examples(HELD_OUT, "hotpotqa", limit=2)


def filter_log_odds(backend: object, examples: list) -> dict[str, list[float]]:
    mcf = MultiGranularFilter(backend)  # type: ignore[arg-type]
    return {e.id: [s["score"] for s in mcf.chunk_scores(e.question, e.documents)]
            for e in examples}


# ----- the start, as a user starts it -----

def test_serve_starts_vllm_with_the_shipped_filter(served: ServeProcess,
                                                   shipped_filter: Path) -> None:
    models = httpx.get(f"{served.base_url}/models", timeout=30).json()
    assert sorted(m["id"] for m in models["data"]) == sorted([DEFAULT_MODEL, FILTER])
    assert f"--lora-modules {FILTER}={shipped_filter}" in served.output
    assert "-m vllm.entrypoints.openai.api_server" in served.output
    # vLLM's own log, passed through: its threads on every core this process may use.
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    assert f"VLLM_CPU_OMP_THREADS_BIND='{cores}'" in served.output
    assert {p.name() for p in served.family} >= {"VLLM::EngineCore"}


# ----- scores through vLLM against in-process, float32 -----

def test_filter_p_yes_through_vllm_equals_in_process(served: ServeProcess, held_out: list,
                                                     in_process_filter: HFBackend,
                                                     embedded_model_dir: Path) -> None:
    one = held_out[:1]  # 10 chunks: the tolerance is per chunk
    with through(served.base_url, FILTER, embedded_model_dir) as remote:
        served_scores = filter_log_odds(remote, one)
    local_scores = filter_log_odds(in_process_filter, one)
    report = compare_filter(local_scores, served_scores, tolerance=FLOAT32_TOLERANCE)
    assert report["passed"], report
    spread = [s for row in local_scores.values() for s in row]
    assert max(spread) - min(spread) > 2.0  # the scores differ: equal scores would prove little


def test_judge_r_through_vllm_equals_in_process(served: ServeProcess, held_out: list,
                                                in_process_base: HFBackend,
                                                embedded_model_dir: Path) -> None:
    example = replace(held_out[0], documents=held_out[0].documents[:5])  # an answer each
    with through(served.base_url, DEFAULT_MODEL, embedded_model_dir) as remote:
        served_result = MainRagJudge(remote).select(example.question, example.documents)
    local_result = MainRagJudge(in_process_base).select(example.question, example.documents)
    assert [s.details["predicted_answer"] for s in served_result.scored] == [
        s.details["predicted_answer"] for s in local_result.scored]
    assert [s.score for s in served_result.scored] == pytest.approx(
        [s.score for s in local_result.scored], abs=FLOAT32_TOLERANCE)
    assert [s.document.id for s in served_result.kept] == [
        s.document.id for s in local_result.kept]


def test_a_label_outside_the_top_20_is_scored_exactly(served: ServeProcess, held_out: list,
                                                      in_process_filter: HFBackend,
                                                      embedded_model_dir: Path) -> None:
    example = held_out[0]
    prompts = [chunk_prompt(example.question, d.text, d.title) for d in example.documents[:3]]
    labels = [*CHUNK_LABELS, "Banana"]
    top = httpx.post(f"{served.base_url}/chat/completions", timeout=60, json={
        "model": FILTER, "messages": prompts[0], "max_tokens": 1, "temperature": 0,
        "logprobs": True, "top_logprobs": 20}).json()
    listed = [e["token"] for e in top["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]
    assert "Banana" not in [token.strip() for token in listed]
    with through(served.base_url, FILTER, embedded_model_dir) as remote:
        served_scores = remote.label_logprobs(prompts, labels)
    local_scores = in_process_filter.label_logprobs(prompts, labels)
    for got, want in zip(served_scores, local_scores, strict=True):
        assert got == pytest.approx(want, abs=FLOAT32_TOLERANCE)
        assert got["Banana"] < min(got[label] for label in CHUNK_LABELS) - 5


def test_marked_label_logprobs_through_vllm_equal_in_process(served: ServeProcess,
                                                             held_out: list,
                                                             in_process_filter: HFBackend,
                                                             embedded_model_dir: Path) -> None:
    """A verdict after every sentence and one for the reply, from one token-id prompt whose
    echoed top-k vLLM returns (labels outside it scored exactly), as in-process."""
    example = held_out[0]
    prompts = [chunk_prompt(example.question, re.sub(r"(?<=\.) ", f"{LABEL_MARK} ", d.text),
                            d.title) for d in example.documents[:2]]
    marks = [sum(m["content"].count(LABEL_MARK) for m in prompt) for prompt in prompts]
    assert min(marks) >= 1, marks
    with through(served.base_url, FILTER, embedded_model_dir) as remote:
        served_reads = remote.marked_label_logprobs(prompts, CHUNK_LABELS)
    local_reads = in_process_filter.marked_label_logprobs(prompts, CHUNK_LABELS)
    assert [len(reads) for reads in served_reads] == [m + 1 for m in marks]
    for got, want in zip(served_reads, local_reads, strict=True):
        for read, expected in zip(got, want, strict=True):
            assert read == pytest.approx(expected, abs=FLOAT32_TOLERANCE)
    # The filter's verdict for the reply is in vLLM's top 20: read from it alone, the same.
    with through(served.base_url, FILTER, embedded_model_dir,
                 missing_label_logprob="topk_min") as remote:
        from_top_k = remote.marked_label_logprobs(prompts, CHUNK_LABELS)
    for got, want in zip(from_top_k, local_reads, strict=True):
        assert got[-1] == pytest.approx(want[-1], abs=FLOAT32_TOLERANCE)


def test_a_server_that_refuses_the_log_probs_asked_for_is_one_clear_error(
    served: ServeProcess, held_out: list, embedded_model_dir: Path
) -> None:
    """vLLM serves at most --max-logprobs (20 here) per token; asking for more is refused."""
    example = held_out[0]
    prompts = [chunk_prompt(example.question, example.documents[0].text)]
    with through(served.base_url, FILTER, embedded_model_dir, top_logprobs=21) as remote:
        with pytest.raises(SieveragError) as error:
            remote.label_logprobs(prompts, CHUNK_LABELS)
    message = str(error.value)
    assert "\n" not in message and "HTTP 400" in message
    assert "max allowed: 20" in message and "--vllm.max-logprobs" in message


# ----- pipelines with every role served by vLLM -----

def run_config(dataset: Path, models: ModelRoles) -> RunConfig:
    # The filter is served as FILTER, a name no installed filter has and vLLM shows no card
    # for, so the served role names its card (`models.filter_card`, `filter_card.filter_card`).
    return comparison_config(dataset, models, ("main-rag", "amber-mcf"), limit=1,
                             max_new_tokens=16)


def test_main_rag_and_amber_through_vllm_keep_what_in_process_keeps(
    served: ServeProcess, embedded_model_dir: Path, tmp_path: Path
) -> None:
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    local = BackendSpec(model=DEFAULT_MODEL, dtype="float32")
    in_process = ModelRoles(generator=local, judge=local,
                            filter=BackendSpec(model=DEFAULT_MODEL, adapter=DEFAULT_FILTER_NAME,
                                               dtype="float32"))
    runner.run_evaluation(run_config(dataset, in_process), tmp_path / "in-process",
                          progress=False)
    base = BackendSpec(endpoint=served.base_url, model=DEFAULT_MODEL,
                       chat_template_model=str(embedded_model_dir))
    filter_ = BackendSpec(endpoint=served.base_url, model=FILTER,
                          chat_template_model=str(embedded_model_dir))
    try:
        runner.run_evaluation(run_config(dataset, ModelRoles(
                                  generator=base, judge=base, filter=filter_,
                                  filter_card=DEFAULT_FILTER_NAME)),
                              tmp_path / "vllm", progress=False)
    finally:
        for spec in (base, filter_):
            build_backend(spec).close()
    for pipeline in ("main-rag", "amber-mcf"):
        [mine] = records(tmp_path / "in-process", pipeline)
        [theirs] = records(tmp_path / "vllm", pipeline)
        assert theirs["documents_read"] == mine["documents_read"], pipeline
        scored = [(s["id"], s["kept"]) for s in mine["filter"]["scores"]]
        assert [(s["id"], s["kept"]) for s in theirs["filter"]["scores"]] == scored, pipeline
        assert 0 < sum(kept for _, kept in scored) < len(scored), pipeline
        assert [s["score"] for s in theirs["filter"]["scores"]] == pytest.approx(
            [s["score"] for s in mine["filter"]["scores"]], abs=FLOAT32_TOLERANCE)
        assert theirs["prediction"] == mine["prediction"], pipeline


# ----- the filtering proxy in front of vLLM -----

def test_the_proxy_filters_in_front_of_vllm(served: ServeProcess, held_out: list,
                                            in_process_filter: HFBackend) -> None:
    example = held_out[0]
    documents = [{"text": d.text, "title": d.title} for d in example.documents[:5]]
    request = {"model": DEFAULT_MODEL, "temperature": 0, "max_tokens": 16,
               "messages": [{"role": "user", "content": example.question}]}
    config = LocalServerConfig(model=DEFAULT_MODEL, adapters=(f"{FILTER}={DEFAULT_FILTER_NAME}",),
                               port=0, access_log=False, log_level="warning",
                               proxy_to=served.base_url, dtype="float32")
    with LocalServer(config) as proxy:
        reply = httpx.post(f"{proxy.base_url}/chat/completions", timeout=300,
                           json={**request, "documents": documents})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    kept = MultiGranularFilter(in_process_filter).select(
        example.question, [Document(str(i), d.text, title=d.title)
                           for i, d in enumerate(example.documents[:5])]).kept
    assert body["sieverag"]["kept"] == [int(s.document.id) for s in kept]
    assert body["sieverag"]["prompt_tokens_saved"] > 0
    # vLLM answered, and what it answered is its answer to the rewritten prompt.
    rewritten = documents_block([Passage(str(int(s.document.id) + 1), s.document) for s in kept])
    direct = httpx.post(f"{served.base_url}/chat/completions", timeout=300, json={
        **request, "messages": [{"role": "user",
                                 "content": f"{rewritten}\n\n{example.question}"}]}).json()
    assert body["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


# ----- teacher labels from vLLM -----

def teacher_labels(endpoint: str, dataset: Path, out: Path) -> tuple[list[dict], dict]:
    """`sieverag label` with SmolLM2 as the teacher at `endpoint`: every chunk's verdict, and
    the run's teacher summary."""
    assert main(["label", "--dataset", str(dataset), "--out", str(out), "--scorer", "none",
                 "--limit", "1", "--max-documents", "3", "--quiet",
                 "--teacher.endpoint", endpoint, "--teacher.model", DEFAULT_MODEL,
                 "--teacher.max-tokens", "48", "--teacher.timeout-s", "300"]) == 0
    labelled = [json.loads(line) for line in
                (out / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return [chunk["teacher"] for record in labelled for chunk in record["chunks"]], summary


def test_teacher_labels_through_vllm_equal_the_embedded_servers(
    served: ServeProcess, embedded_model_dir: Path, tmp_path: Path
) -> None:
    """The teacher client's whole path (prompt, greedy reply, parsing, the correction round
    when a reply breaks the format) against vLLM, and against the embedded server at float32:
    the same verdicts and replies."""
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    verdicts, summary = teacher_labels(served.base_url, dataset, tmp_path / "vllm")
    assert len(verdicts) == 3 and all(v["reply"] for v in verdicts), verdicts
    assert summary["teacher"]["asked"] == 3 and summary["teacher"]["prompt_tokens"] > 0
    config = LocalServerConfig(model=DEFAULT_MODEL, port=0, access_log=False,
                               log_level="warning", dtype="float32")
    with LocalServer(config) as embedded:
        expected, _ = teacher_labels(embedded.base_url, dataset, tmp_path / "embedded")
    assert verdicts == expected


# ----- teacher labels asked one at a time, CXMI through vLLM's prompt log-probs -----

def run_batch(batch_input: Path, output: Path, model_dir: Path) -> None:
    """`vllm run_batch` on a Batch JSONL, SmolLM2 at float32 under the teacher's name (by its
    module: the CPU build's `vllm` script cannot read its own version)."""
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, port=free_port(), dtype="float32",
                              **CPU_OPTIONS)
    subprocess.run([find_vllm_python(None), "-m", "vllm.entrypoints.openai.run_batch",
                    "-i", str(batch_input), "-o", str(output), "--model", str(model_dir),
                    "--served-model-name", DEFAULT_MODEL, "--dtype", "float32",
                    "--max-model-len", "4096", *EXTRA_ARGS.split()],
                   env=vllm_environment(config, dict(os.environ)), check=True,
                   timeout=STARTUP_S + 300)


LABEL_COMMAND = ["label", "--dataset", str(TEST_DATA / "hotpotqa_sample.jsonl"), "--scorer",
                 "none", "--limit", "1", "--max-documents", "3", "--quiet", "--teacher.model",
                 DEFAULT_MODEL, "--teacher.max-tokens", "48", "--teacher.timeout-s", "300"]


def chunk_verdicts(out: Path) -> list[dict]:
    lines = (out / "labels.jsonl").read_text(encoding="utf-8").splitlines()
    return [chunk["teacher"] for line in lines for chunk in json.loads(line)["chunks"]]


@pytest.fixture(scope="module")
def synchronous_verdicts(served: ServeProcess, tmp_path_factory: pytest.TempPathFactory
                         ) -> list[dict]:
    """The sample's first question's verdicts (3 chunks) from the teacher asked one request
    at a time, vLLM serving."""
    out = tmp_path_factory.mktemp("sync")
    assert main([*LABEL_COMMAND, "--teacher.endpoint", served.base_url, "--out", str(out)]) == 0
    return chunk_verdicts(out)


def test_teacher_labels_every_chunk_through_vllm(synchronous_verdicts: list[dict]) -> None:
    """Asked here, while vLLM serves; the same verdicts through `vllm run_batch` are checked
    after the server has stopped (two vLLM engines at once halve each other on 2 cores)."""
    assert len(synchronous_verdicts) == 3 and all(v["reply"] for v in synchronous_verdicts)


def test_cxmi_through_vllm_equals_in_process(served: ServeProcess, embedded_model_dir: Path,
                                             tmp_path: Path) -> None:
    """`label --scorer-endpoint` (two replicas: the same vLLM twice) scores CXMI through
    vLLM's prompt log-probs; every score and log-prob equals the in-process scorer's within
    1e-3."""
    from sieverag.data_gen.labelling import LabelRunConfig, run_labelling

    common = {"dataset": str(TEST_DATA / "hotpotqa_sample.jsonl"), "limit": 1,
              "max_documents": 2, "scorer": DEFAULT_MODEL, "device": "cpu"}
    values = {}
    for run, endpoints in (("local", ()), ("served", (served.base_url, served.base_url))):
        run_labelling(LabelRunConfig(out=str(tmp_path / run), scorer_endpoint=endpoints,
                                     **common), progress=False)
        record = json.loads((tmp_path / run / "labels.jsonl").read_text().splitlines()[0])
        values[run] = [value for chunk in record["chunks"]
                       for entry in [chunk["cxmi"], *chunk["sentence_cxmi"]]
                       for value in (entry["score"], entry["logprob_with"],
                                     entry["logprob_without"])]
    assert len(values["local"]) == len(values["served"]) > 10
    assert max(abs(a - b) for a, b in zip(values["local"], values["served"], strict=True)) \
        < FLOAT32_TOLERANCE


# ----- starts that fail: one clear error, no process left -----

def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_vllm_exiting_at_start_is_an_error_quoting_its_last_lines(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    server = VLLMServer(VLLMLaunchConfig(model=str(broken), port=free_port(),
                                         startup_timeout_s=STARTUP_S, **CPU_OPTIONS))
    with pytest.raises(ServerStartError, match="exited with code") as error:
        with server:
            pass
    message = str(error.value)
    assert "its last lines:" in message and "no-such-architecture" in message, message
    assert server.pid is not None and group_gone(server.pid)


def test_vllm_not_ready_in_time_is_stopped_with_its_engine(embedded_model_dir: Path) -> None:
    server = VLLMServer(VLLMLaunchConfig(model=DEFAULT_MODEL, port=free_port(),
                                         startup_timeout_s=3, **CPU_OPTIONS))
    with pytest.raises(ServerStartError, match=r"did not answer .* within 3 s"):
        with server:
            pass
    assert server.pid is not None and group_gone(server.pid)


# ----- the stop: SIGTERM to `sieverag serve` -----

def test_sigterm_stops_vllm_and_leaves_no_process(served: ServeProcess) -> None:
    served.process.send_signal(signal.SIGTERM)
    served.process.wait(timeout=60)
    assert served.process.returncode == 0, served.output[-3000:]
    psutil.wait_procs(served.family, timeout=10)
    assert not [p for p in served.family if p.is_running()]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{served.base_url}/models", timeout=2)


# ----- after the stop: `vllm run_batch`, then vLLM at bfloat16 (one vLLM engine at a time) -----

def test_teacher_labels_through_vllm_run_batch_equal_the_synchronous_paths(
    synchronous_verdicts: list[dict], embedded_model_dir: Path, tmp_path: Path
) -> None:
    """The same requests as Batch JSONL through `vllm run_batch` (`--teacher.mode
    batch-file`, a correction round where a reply breaks the format) give the verdicts the
    synchronous path got from vLLM serving the same model."""
    batch = [*LABEL_COMMAND, "--teacher.endpoint", "http://127.0.0.1:9/v1", "--out",
             str(tmp_path / "batch"), "--teacher.mode", "batch-file"]
    assert main(batch) == 0
    for round_number in range(2):  # the labelling round, then perhaps one of corrections
        written = sorted((tmp_path / "batch").glob("teacher_batch_*.jsonl"),
                         key=lambda path: path.stat().st_mtime)[-1]
        output = tmp_path / f"output-{round_number}.jsonl"
        run_batch(written, output, embedded_model_dir)
        assert main([*batch, "--teacher.batch-output", str(output)]) == 0
        if (tmp_path / "batch" / "labels.jsonl").exists():
            break
    assert chunk_verdicts(tmp_path / "batch") == synchronous_verdicts


# ----- bfloat16: vLLM against in-process float32, at the GPU check's tolerances -----

@pytest.fixture()
def served_bf16(embedded_model_dir: Path) -> Iterator[VLLMServer]:
    config = VLLMLaunchConfig(model=DEFAULT_MODEL, adapters=(f"{FILTER}={DEFAULT_FILTER_NAME}",),
                              port=free_port(), dtype="bfloat16", startup_timeout_s=STARTUP_S,
                              **CPU_OPTIONS)
    with VLLMServer(config) as server:
        yield server


def test_bf16_scores_through_vllm_are_within_the_gpu_checks_tolerances(
    served_bf16: VLLMServer, held_out: list, in_process_filter: HFBackend,
    in_process_base: HFBackend, embedded_model_dir: Path
) -> None:
    # 3 chunks and 3 documents of one question: the tolerances are per item.
    examples = [replace(held_out[0], documents=held_out[0].documents[:3])]
    with through(served_bf16.base_url, FILTER, embedded_model_dir) as remote:
        served_scores = filter_log_odds(remote, examples)
    filter_report = compare_filter(filter_log_odds(in_process_filter, examples), served_scores)
    assert filter_report["passed"], filter_report
    # The judge's r on the in-process answers (greedy answers may part at bf16 near-ties).
    judge = MainRagJudge(in_process_base)
    answers = {e.id: judge.predict_answers(e.question, e.documents) for e in examples}
    local = {e.id: judge.judge_scores(e.question, e.documents, answers[e.id]) for e in examples}
    with through(served_bf16.base_url, DEFAULT_MODEL, embedded_model_dir) as remote:
        remote_judge = MainRagJudge(remote)
        measured = {e.id: remote_judge.judge_scores(e.question, e.documents, answers[e.id])
                    for e in examples}
    judge_report = compare_judge(local, measured)
    assert judge_report["passed"], judge_report
    # bf16 moved something: the comparison ran at bf16, not at float32 again.
    assert filter_report["max_abs_delta_p_yes"] > FLOAT32_TOLERANCE / 10
