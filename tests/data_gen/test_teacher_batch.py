"""The teacher through Batch JSONL against the fake OpenAI server's Batch API: upload, create,
poll, download; labels equal the synchronous path's; failed lines alone sent again, a line
failing in every batch stops the run naming it; a run stopped while its batch is in flight
resumes by polling that batch; batch-file mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai_server import FakeBatchAPI, FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.data_gen.batch import STATE_FILE
from sieverag.data_gen.labelling import LABELS_FILE, LabelRunConfig, run_labelling
from sieverag.data_gen.teacher import TeacherConfig
from sieverag.inference.core.errors import BackendUnavailableError

QUESTIONS, CHUNKS = 4, 3


def write_dataset(path: Path) -> Path:
    """Chunk 1 of question 2 makes the teacher break the format once (a correction round)."""
    with path.open("w") as handle:
        for q in range(QUESTIONS):
            ctxs = [{"title": f"T{q}-{c}",
                     "text": f"Fact {c} about topic {q}. More text here."
                             + (" BROKEN" if (q, c) == (2, 1) else "")}
                    for c in range(CHUNKS)]
            handle.write(json.dumps({"id": f"q{q}", "question": f"What about topic {q}?",
                                     "answers": [f"topic {q}"], "ctxs": ctxs}) + "\n")
    return path


def verdict(request: RecordedRequest) -> Reply:
    """Relevant when the chunk is its question's first; a BROKEN chunk's first reply is not
    JSON (its correction, four messages long, is answered properly)."""
    messages = request.json["messages"]
    prompt = messages[1]["content"]
    if "BROKEN" in prompt and len(messages) == 2:
        return Reply(body=chat_reply("I think it is relevant", prompt_tokens=50,
                                     completion_tokens=5))
    relevant = "Fact 0" in prompt
    return Reply(body=chat_reply(json.dumps({"relevant": relevant,
                                             "key_sentences": [1] if relevant else []}),
                                 prompt_tokens=50, completion_tokens=9))


def config(dataset: Path, out: Path, endpoint: str, **teacher: object) -> LabelRunConfig:
    return LabelRunConfig(dataset=str(dataset), out=str(out), scorer=None, teacher=TeacherConfig(
        endpoint=endpoint, model="teacher-x", max_retries=0, **teacher))


def labels(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LABELS_FILE).read_text().splitlines()]


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data.jsonl")


@pytest.fixture()
def sync_run(dataset: Path, tmp_path: Path) -> tuple[list[dict], list[RecordedRequest]]:
    """The synchronous path's labels and the chat requests it sent."""
    with FakeOpenAIServer(verdict) as server:
        run_labelling(config(dataset, tmp_path / "sync", server.base_url), progress=False)
    return labels(tmp_path / "sync"), server.requests


def uploaded_lines(api: FakeBatchAPI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in api.files[file_id]["content"].decode().splitlines()]


def test_the_batch_api_round_trip_gives_the_synchronous_labels(dataset: Path, tmp_path: Path,
                                                               sync_run: tuple) -> None:
    expected, sync_requests = sync_run
    api = FakeBatchAPI(verdict, polls=2)
    with FakeOpenAIServer(api) as server:
        summary = run_labelling(config(dataset, tmp_path / "batch", server.base_url,
                                       mode="batch", batch_poll_s=0.01), progress=False)
    assert labels(tmp_path / "batch") == expected
    # Two batches: every chunk, then the one correction; polled until done, both files read.
    assert [(r.method, r.path) for r in server.requests][:4] == [
        ("POST", "/v1/files"), ("POST", "/v1/batches"), ("GET", "/v1/batches/batch_1"),
        ("GET", "/v1/batches/batch_1")]
    assert [p for p in server.paths() if "chat/completions" in p] == []  # nothing synchronous
    upload = server.requests[0]
    assert b'name="purpose"' in upload.raw and b"batch" in upload.raw
    created = server.requests[1].json
    assert (created["endpoint"], created["completion_window"]) == ("/v1/chat/completions", "24h")
    first, second = (uploaded_lines(api, b["input_file_id"]) for b in api.batches.values())
    assert len(first) == QUESTIONS * CHUNKS and [line["custom_id"] for line in second] == \
        ["q2/1/correction"]
    assert first[0]["custom_id"] == "q0/0/label"
    assert {(line["method"], line["url"]) for line in first + second} == \
        {("POST", "/v1/chat/completions")}
    # Each body is the very request the synchronous path sent.
    assert sorted(json.dumps(line["body"], sort_keys=True) for line in first + second) == \
        sorted(json.dumps(r.json, sort_keys=True) for r in sync_requests)
    assert summary.teacher["asked"] == QUESTIONS * CHUNKS
    assert summary.teacher["corrections"] == 1
    assert summary.teacher["prompt_tokens"] == 50 * (QUESTIONS * CHUNKS + 1)


def test_failed_lines_alone_are_sent_again(dataset: Path, tmp_path: Path,
                                           sync_run: tuple) -> None:
    api = FakeBatchAPI(verdict, failures={"q1/0/label": 1, "q3/2/label": 1})
    with FakeOpenAIServer(api) as server:
        run_labelling(config(dataset, tmp_path / "batch", server.base_url, mode="batch",
                             batch_poll_s=0.01), progress=False)
    assert labels(tmp_path / "batch") == sync_run[0]
    sent = [[line["custom_id"] for line in uploaded_lines(api, b["input_file_id"])]
            for b in api.batches.values()]
    assert len(sent[0]) == QUESTIONS * CHUNKS
    assert sorted(sent[1]) == ["q1/0/label", "q2/1/correction", "q3/2/label"]
    assert len(sent) == 2
    assert sorted(api.answered) == sorted(set(api.answered))  # no reply paid twice


def test_a_line_failing_in_every_batch_stops_the_run_naming_it(dataset: Path, tmp_path: Path,
                                                                 sync_run: tuple) -> None:
    api = FakeBatchAPI(verdict, failures={"q0/0/label": 3})
    out = tmp_path / "batch"
    with FakeOpenAIServer(api) as server:
        settings = config(dataset, out, server.base_url, mode="batch", batch_poll_s=0.01)
        with pytest.raises(BackendUnavailableError, match=r"q0/0/label failed in 3 batches"):
            run_labelling(settings, progress=False)
        assert len(api.batches) == 3
        assert not (out / LABELS_FILE).exists() or not labels(out)
        run_labelling(settings, progress=False)  # the server answers it now
    assert labels(out) == sync_run[0]
    assert sorted(api.answered) == sorted(set(api.answered))


def test_a_run_stopped_by_an_outage_resumes_by_polling_its_batch(
        dataset: Path, tmp_path: Path, sync_run: tuple) -> None:
    """The server goes down while the batch is in flight: the run stops with one line, and the
    rerun polls the batch kept in teacher_batches.json instead of sending it again."""
    out = tmp_path / "batch"
    api = FakeBatchAPI(verdict)
    api.outage.set()
    with FakeOpenAIServer(api) as server:
        settings = config(dataset, out, server.base_url, mode="batch", batch_poll_s=0.01)
        with pytest.raises(BackendUnavailableError, match="HTTP 503; rerun to resume"):
            run_labelling(settings, progress=False)
        assert json.loads((out / STATE_FILE).read_text())["batches"][0]["id"] == "batch_1"
        api.outage.clear()
        run_labelling(settings, progress=False)
    assert labels(out) == sync_run[0]
    assert list(api.batches) == ["batch_1", "batch_2"]  # the labels, then the correction
    assert sorted(api.answered) == sorted(set(api.answered))


def run_batch_file(lines_path: Path, out_path: Path) -> None:
    """What `vllm run_batch` does with a Batch JSONL: each line's body answered, one output
    line per request, keyed by custom_id (here by the fake teacher)."""
    with out_path.open("w") as handle:
        for text in lines_path.read_text().splitlines():
            line = json.loads(text)
            reply = verdict(RecordedRequest(line["url"], {}, line["body"]))
            handle.write(json.dumps({"id": "x", "custom_id": line["custom_id"], "error": None,
                                     "response": {"status_code": 200, "request_id": "r",
                                                  "body": reply.body}}) + "\n")


def test_batch_file_mode_writes_the_requests_and_reads_the_output_back(
        dataset: Path, tmp_path: Path, sync_run: tuple,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sieverag.cli import main

    out = tmp_path / "file"
    # No server at all: the endpoint is never called in batch-file mode.
    command = ["label", "--dataset", str(dataset), "--out", str(out), "--scorer", "none",
               "--quiet", "--teacher.endpoint", "http://127.0.0.1:9/v1", "--teacher.model",
               "teacher-x", "--teacher.max-retries", "0", "--teacher.mode", "batch-file"]
    assert main(command) == 0
    written = out / "teacher_batch_label.jsonl"
    assert f"teacher requests written to {written}" in capsys.readouterr().out
    assert not (out / LABELS_FILE).exists()
    run_batch_file(written, tmp_path / "out1.jsonl")
    assert main([*command, "--teacher.batch-output", str(tmp_path / "out1.jsonl")]) == 0
    correction = out / "teacher_batch_correction.jsonl"
    assert [json.loads(line)["custom_id"] for line in correction.read_text().splitlines()] == \
        ["q2/1/correction"]
    run_batch_file(correction, tmp_path / "out2.jsonl")
    assert main([*command, "--teacher.batch-output", str(tmp_path / "out2.jsonl")]) == 0
    assert labels(out) == sync_run[0]
