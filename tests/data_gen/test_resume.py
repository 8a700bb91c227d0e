"""A labelling run killed with SIGKILL resumes without asking the teacher anything it finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply
from repo_paths import REPO

from sieverag.data_gen.labelling import (
    LABELS_FILE,
    TEACHER_CACHE_FILE,
    LabelRunConfig,
    run_labelling,
)
from sieverag.data_gen.teacher import TeacherConfig, cache_key

QUESTIONS, CHUNKS = 6, 3

RUN = """
import json, sys
from sieverag.data_gen.labelling import LabelRunConfig, run_labelling
from sieverag.data_gen.teacher import TeacherConfig
teacher = TeacherConfig(**json.loads(sys.argv[2]))
run_labelling(LabelRunConfig(**json.loads(sys.argv[1]), teacher=teacher), progress=False)
"""


def write_dataset(path: Path) -> None:
    with path.open("w") as handle:
        for q in range(QUESTIONS):
            ctxs = [{"title": f"T{q}-{c}", "text": f"Fact {c} about topic {q}. More text here."}
                    for c in range(CHUNKS)]
            handle.write(json.dumps({"id": f"q{q}", "question": f"What about topic {q}?",
                                     "answers": [f"topic {q}"], "ctxs": ctxs}) + "\n")


def slow_verdict(request: RecordedRequest) -> Reply:
    return Reply(delay_s=0.3, body=chat_reply('{"relevant": true, "key_sentences": [1]}'))


def request_key(request: RecordedRequest) -> str:
    return cache_key(request.json["model"], request.json["messages"])


def cached_keys(path: Path) -> set[str]:
    return {json.loads(line)["key"] for line in path.read_text().splitlines()
            if line.strip().endswith("}")}


def settled_request_count(server: FakeOpenAIServer, quiet_s: float = 0.5) -> int:
    count, since = len(server.requests), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        if len(server.requests) != count:
            count, since = len(server.requests), time.monotonic()
    return count


def test_resume_after_kill_asks_nothing_finished_again(tmp_path: Path) -> None:
    dataset, out = tmp_path / "data.jsonl", tmp_path / "labels"
    write_dataset(dataset)
    settings = {"dataset": str(dataset), "out": str(out), "scorer": None,
                "questions_per_step": 2}
    with FakeOpenAIServer(slow_verdict) as server:
        teacher = {"endpoint": server.base_url, "model": "teacher-x", "max_concurrency": 2,
                   "backoff_s": 0.01}
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen([sys.executable, "-c", RUN, json.dumps(settings),
                                    json.dumps(teacher)], cwd=REPO, env=env)
        cache = out / TEACHER_CACHE_FILE
        # Generous: the process's start (its imports) alone can take minutes on a busy machine.
        deadline = time.monotonic() + 600
        while not (cache.is_file() and len(cached_keys(cache)) >= 5):
            assert process.poll() is None, "the labelling run ended before it was killed"
            assert time.monotonic() < deadline, "no teacher replies were cached in 600 s"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        finished = cached_keys(cache)
        assert len(finished) < QUESTIONS * CHUNKS
        # A request the killed run sent just before dying may reach the server's log a little
        # later; count the resumed run's requests only once that log has settled.
        asked_before = settled_request_count(server)

        summary = run_labelling(LabelRunConfig(**settings, teacher=TeacherConfig(**teacher)),
                                progress=False)

        asked_again = [request_key(r) for r in server.requests[asked_before:]]
    assert not set(asked_again) & finished
    assert len(asked_again) == QUESTIONS * CHUNKS - len(finished)
    # each finished request was read from the cache or belonged to a question already written
    assert summary.teacher["cached"] + CHUNKS * summary.questions_done_before >= len(finished)
    assert summary.teacher["asked"] == len(asked_again)
    labels = [json.loads(line) for line in (out / LABELS_FILE).read_text().splitlines()]
    assert sorted(r["question_id"] for r in labels) == [f"q{q}" for q in range(QUESTIONS)]
    assert all(c["teacher"]["status"] == "valid" for r in labels for c in r["chunks"])
