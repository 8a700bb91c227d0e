"""Many questions in flight (`--concurrency`): the thread pool's order, failure and resume
behaviour, the in-process batcher's merged calls, and the same answers at N = 1 and N = 4."""

from __future__ import annotations

import json
import threading

import pytest
from fake_backend import ScriptedBackend, serve_every_role
from repo_paths import REPO

from sieverag.inference.agents.roles import ModelRoles
from sieverag.inference.composition.config import RunConfig, TrustConfig
from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.in_flight import (
    QuestionFailedError,
    default_concurrency,
    run_in_flight,
)
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.llm.backend_protocol import GenerationSettings, question_usage
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.llm.call_batching import CallBatcher
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

# ----- the thread pool -----


def test_every_item_is_handed_back_once_and_n_run_at_once():
    barrier = threading.Barrier(4, timeout=30)  # passes only when 4 items run together
    running, most = [0], [0]
    lock = threading.Lock()

    def work(item: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if item < 4:
            barrier.wait()
        with lock:
            running[0] -= 1
        return item * item

    handed: list[tuple[int, int]] = []
    caller = threading.current_thread()

    def keep(item: int, result: int) -> None:
        assert threading.current_thread() is caller  # appended in the calling thread
        handed.append((item, result))

    run_in_flight(list(range(12)), work, keep, concurrency=4, name=str)
    assert sorted(handed) == [(i, i * i) for i in range(12)]
    assert most[0] == 4


def test_a_failure_stops_new_items_keeps_finished_ones_and_names_the_item():
    started: list[int] = []
    release = threading.Event()

    def work(item: int) -> int:
        started.append(item)
        if item == 1:
            raise ValueError("no such passage")
        release.wait(30) if item == 0 else None
        return item

    handed: list[int] = []

    def keep(item: int, result: int) -> None:
        handed.append(item)

    def failing_then_release(item: int) -> int:
        try:
            return work(item)
        finally:
            if item == 1:
                release.set()  # item 0, still in flight, finishes after the failure

    with pytest.raises(QuestionFailedError, match=r"question q1 failed: ValueError: no such "
                                                  r"passage \(the other 1 question"):
        run_in_flight(list(range(50)), failing_then_release, keep, concurrency=2,
                      name=lambda i: f"q{i}")
    assert 0 in handed  # in flight when item 1 failed: finished and kept
    assert len(started) < 50  # no new item started after the failure


def test_concurrency_must_be_positive_and_defaults_by_where_models_run():
    with pytest.raises(SieveragError, match="--concurrency must be >= 1, got 0"):
        default_concurrency(0, all_served=True)
    assert default_concurrency(None, all_served=True) == 16
    assert default_concurrency(None, all_served=False) == 1
    assert default_concurrency(3, all_served=False) == 3


# ----- the runner, on a scripted backend -----


def scripted() -> ScriptedBackend:
    """Answers from the first document; judge scores from the prompt's length."""
    return ScriptedBackend(reply=lambda text: text.split()[-1],
                           labels=lambda text: {"Yes": -len(text) % 7 / 3, "No": -1.0})


def run(tmp_path, name: str, concurrency: int, pipelines=("vanilla", "main-rag"), limit=8):
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    out = tmp_path / name
    runner.run_evaluation(RunConfig(dataset=str(dataset), pipelines=pipelines, limit=limit,
                                    trust=TrustConfig(enabled=False)),
                          out, progress=False, concurrency=concurrency)
    return out


def records(out, pipeline: str) -> list[dict]:
    return [json.loads(line) for line in (out / "results" / f"{pipeline}.jsonl").open()]


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "seconds"} | {
        "usage": {agent: {k: v for k, v in u.items() if k != "seconds"}
                  for agent, u in record["usage"].items()}}


def test_the_same_records_at_one_and_four_questions_in_flight(tmp_path, monkeypatch):
    serve_every_role(monkeypatch, scripted())
    one, four = run(tmp_path, "one", 1), run(tmp_path, "four", 4)
    for pipeline in ("vanilla", "main-rag"):
        by_id = {r["id"]: comparable(r) for r in records(one, pipeline)}
        assert {r["id"]: comparable(r) for r in records(four, pipeline)} == by_id
    assert (json.loads((one / "summary.json").read_text())["pipelines"]["vanilla"]["em"]
            == json.loads((four / "summary.json").read_text())["pipelines"]["vanilla"]["em"])


def test_a_failing_question_keeps_the_others_and_a_rerun_resumes(tmp_path, monkeypatch):
    backend = scripted()
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    ids = [json.loads(line)["id"] for line in dataset.open()][:8]
    bad = ids[5]
    question = {json.loads(line)["id"]: json.loads(line)["question"]
                for line in dataset.open()}[bad]

    def reply(text: str) -> str:
        if question in text and failing[0]:
            raise RuntimeError("the server went away")
        return text.split()[-1]

    failing = [True]
    backend.reply = reply
    serve_every_role(monkeypatch, backend)
    with pytest.raises(QuestionFailedError, match=f"question {bad!r} failed: RuntimeError"):
        run(tmp_path, "run", 4, pipelines=("vanilla",))
    kept = [r["id"] for r in records(tmp_path / "run", "vanilla")]
    assert bad not in kept and kept  # the others that finished are saved
    failing[0] = False
    backend.calls.clear()
    run(tmp_path, "run", 4, pipelines=("vanilla",))
    assert len(backend.calls) == 8 - len(kept)  # only what was missing runs again
    report = (tmp_path / "run" / "results" / "vanilla.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in report) == sorted(ids)


# ----- the in-process batcher -----


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> HFBackend:
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=16))


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Question {i}: " + "which river is long? " * (i % 3)}]


def in_threads(count: int, work) -> list:
    results: list = [None] * count
    barrier = threading.Barrier(count, timeout=60)

    def one(i: int) -> None:
        barrier.wait()
        with question_usage() as usage:
            results[i] = (work(i), dict(usage))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_merged_calls_give_each_question_its_own_answers_and_usage(tiny):
    settings = GenerationSettings(max_new_tokens=6)

    def alone(i: int):
        with question_usage() as usage:
            reply = tiny.generate([conversation(i)], settings)
            scores = tiny.label_logprobs([conversation(i)], ["Yes", "No"], agent="judge")
            tail = tiny.continuation_logprob([conversation(i)], [" the Nile"])
        return (reply, scores, tail), dict(usage)

    expected = [alone(i) for i in range(6)]
    with CallBatcher() as batcher:
        shared = batcher.wrap(tiny)
        got = in_threads(6, lambda i: (
            shared.generate([conversation(i)], settings),
            shared.label_logprobs([conversation(i)], ["Yes", "No"], agent="judge"),
            shared.continuation_logprob([conversation(i)], [" the Nile"])))
        assert max(batcher.merged_sizes) > 1  # questions' calls did run together
    for ((reply, scores, tail), usage), ((want_reply, want_scores, want_tail), want) in zip(
            got, expected, strict=True):
        assert reply == want_reply
        for label in ("Yes", "No"):
            assert scores[0][label] == pytest.approx(want_scores[0][label], abs=1e-4)
        assert tail[0] == pytest.approx(want_tail[0], abs=1e-4)
        for agent in ("generator", "judge", "scorer"):  # counts exact, seconds its own wait
            assert (usage[agent].calls, usage[agent].prompt_tokens,
                    usage[agent].completion_tokens) == (
                want[agent].calls, want[agent].prompt_tokens, want[agent].completion_tokens)
            assert usage[agent].seconds > 0


def test_labels_scored_as_whole_replies_keep_each_questions_usage(tiny):
    """A label of several tokens is scored as a reply (k rows a prompt): each question still
    gets exactly its own calls and tokens, not the merged call's."""
    labels = ["Yes indeed", "No"]

    def alone(i: int):
        with question_usage() as usage:
            tiny.label_logprobs([conversation(i)], labels, agent="judge")
        return dict(usage)

    expected = [alone(i) for i in range(4)]
    with CallBatcher() as batcher:
        shared = batcher.wrap(tiny)
        got = in_threads(4, lambda i: shared.label_logprobs([conversation(i)], labels,
                                                            agent="judge"))
        assert max(batcher.merged_sizes) > 1
    for (_, usage), want in zip(got, expected, strict=True):
        assert (usage["judge"].calls, usage["judge"].prompt_tokens) == (
            want["judge"].calls, want["judge"].prompt_tokens)


def test_a_merged_call_that_fails_fails_only_the_question_whose_prompt_fails():
    def reply(text: str) -> str:
        if "poison" in text:
            raise ValueError("cannot read this prompt")
        return "fine"

    backend = ScriptedBackend(reply=reply)
    with CallBatcher(window_s=0.05) as batcher:
        shared = batcher.wrap(backend)

        def work(i: int):
            try:
                return shared.generate([[{"role": "user", "content": f"q{i} "
                                          + ("poison" if i == 2 else "")}]])
            except ValueError as error:
                return str(error)

        got = [result for result, _ in in_threads(4, work)]
        assert max(batcher.merged_sizes) > 1  # the poisoned call was merged with others
    assert got == [["fine"], ["fine"], "cannot read this prompt", ["fine"]]


def test_served_roles_run_sixteen_questions_by_default():
    served = BackendSpec(endpoint="http://127.0.0.1:9/v1", model="m")
    plan = runner.plan_run(RunConfig(dataset="x.jsonl", pipelines=("vanilla",),
                                     models=ModelRoles(generator=served),
                                     trust=TrustConfig(enabled=False)))
    assert plan.all_served
    local = runner.plan_run(RunConfig(dataset="x.jsonl", pipelines=("vanilla",),
                                      trust=TrustConfig(enabled=False)))
    assert not local.all_served


def test_a_judge_sweep_gives_the_same_records_at_four_in_flight(tmp_path, monkeypatch):
    from sieverag.inference.eval.judge_sweep import sweep_judge_bar

    serve_every_role(monkeypatch, scripted())
    out = run(tmp_path, "run", 1, pipelines=("main-rag",))
    one = sweep_judge_bar(out, [0.0, 1.0], out=tmp_path / "one", progress=False, concurrency=1)
    four = sweep_judge_bar(out, [0.0, 1.0], out=tmp_path / "four", progress=False,
                           concurrency=4)
    for label, summary in one["bars"].items():
        assert {k: summary[k] for k in ("examples", "em", "f1", "accuracy")} == {
            k: four["bars"][label][k] for k in ("examples", "em", "f1", "accuracy")}
    for label in ("n=0", "n=1"):
        assert ({r["id"]: comparable(r) for r in records(tmp_path / "one", label)}
                == {r["id"]: comparable(r) for r in records(tmp_path / "four", label)})


def test_a_tiny_model_answers_the_same_with_four_questions_in_flight(tmp_path, tiny_model_dir):
    """Every pipeline kind on real (tiny, random) weights: greedy predictions and documents
    read identical at N = 1 and N = 4, scores equal to 1e-4, usage counts per question."""
    from dataclasses import replace

    from tiny_adapter import make_lora_adapter

    from sieverag.inference.pipelines.amber.config import AmberConfig
    from sieverag.inference.pipelines.amber.memory import MemoryConfig

    adapter = make_lora_adapter(tiny_model_dir, tmp_path / "lora")
    spec = BackendSpec(model=str(tiny_model_dir), batch_size=16)
    roles = ModelRoles(generator=spec, filter=replace(spec, adapter=str(adapter)))
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    amber = AmberConfig(max_iterations=2, k=5, memory=MemoryConfig(
        review_max_new_tokens=8, refine_max_new_tokens=8))
    pipelines = ("vanilla", "main-rag", "amber-mcf")
    outs = {}
    for n in (1, 4):
        outs[n] = tmp_path / f"n{n}"
        runner.run_evaluation(RunConfig(dataset=str(dataset), pipelines=pipelines, limit=4,
                                        models=roles, amber=amber,
                                        trust=TrustConfig(enabled=False)),
                              outs[n], progress=False, concurrency=n)
    for pipeline in pipelines:
        one, four = records(outs[1], pipeline), records(outs[4], pipeline)
        assert [r["id"] for r in one] != [] and {r["id"] for r in one} == {r["id"] for r in four}
        four_by_id = {r["id"]: r for r in four}
        for record in one:
            other = four_by_id[record["id"]]
            assert other["prediction"] == record["prediction"]
            assert other["documents_read"] == record["documents_read"]
            assert {a: (u["calls"], u["prompt_tokens"], u["completion_tokens"])
                    for a, u in other["usage"].items()} == {
                a: (u["calls"], u["prompt_tokens"], u["completion_tokens"])
                for a, u in record["usage"].items()}
            if record.get("filter"):
                for mine, theirs in zip(record["filter"]["scores"], other["filter"]["scores"],
                                        strict=True):
                    assert theirs["score"] == pytest.approx(mine["score"], abs=1e-4)


KILLED_RUN = """
import sys
from sieverag.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_served_run_killed_mid_flight_keeps_what_finished_and_resumes(tmp_path):
    """`sieverag eval` against a server (16 questions in flight by default), killed with
    SIGKILL: every question it wrote is whole, and the rerun asks only for the others."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fake_openai_server import FakeOpenAIServer, Reply, chat_reply

    repo = REPO
    dataset = tmp_path / "data.jsonl"
    with dataset.open("w") as handle:
        for q in range(24):
            handle.write(json.dumps({"id": f"q{q}", "question": f"Who founded town {q}?",
                                     "answers": [f"Founder {q}"], "ctxs": [
                                         {"title": f"Town {q}", "text": f"Founder {q} did."}]})
                         + "\n")

    def reply(request) -> Reply:
        question = request.json["messages"][-1]["content"].split("town ")[-1].split("?")[0]
        return Reply(delay_s=0.4, body=chat_reply(f"Founder {question}"))

    out = tmp_path / "run"
    args = ["eval", "--dataset", str(dataset), "--pipelines", "vanilla", "--out", str(out),
            "--no-trust.enabled", "--quiet", "--models.generator.model", "m",
            "--models.generator.max-concurrency", "16"]
    results = out / "results" / "vanilla.jsonl"
    with FakeOpenAIServer(reply) as server:
        args += ["--models.generator.endpoint", server.base_url]
        env = {**os.environ, "PYTHONPATH": str(repo)}
        process = subprocess.Popen([sys.executable, "-c", KILLED_RUN, *args], cwd=repo, env=env)
        deadline = time.monotonic() + 120
        while not (results.is_file() and len(results.read_text().splitlines()) >= 3):
            assert process.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "no record was written in 120 s"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        kept = [json.loads(line)["id"] for line in results.read_text().splitlines()]
        assert 3 <= len(kept) < 24
        time.sleep(0.6)  # requests the killed run had in flight reach the log
        asked_before = len(server.requests)
        from sieverag.cli import main

        assert main(args) == 0
        asked_again = server.requests[asked_before:]
    assert len(asked_again) == 24 - len(kept)  # nothing finished is asked again
    done = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in done) == sorted(f"q{q}" for q in range(24))
    assert all(r["metrics"]["accuracy"] == 1.0 for r in done)
    report = (out / "report.md").read_text()
    assert "| vanilla |" in report
