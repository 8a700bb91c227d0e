"""The teacher's requests as Batch JSONL: through a server's Batch API, or a file for
`vllm run_batch`.

`sieverag label --teacher.mode batch|batch-file` asks the teacher every chunk of the questions
still to label before labelling them; the labelling itself then reads every verdict from the
teacher cache (`data_gen.teacher`). Each reply folded in is kept as the synchronous path
keeps one (`TeacherClient.take_reply`: the reply cache with its usage, the ledger), and a
verdict made from it as that path makes it (`first_verdict`, `corrected_verdict`, `keep`:
one implementation), so a reply is never paid for twice whichever way it came.

A Batch JSONL line is one request: `{"custom_id": "<question id>/<chunk>/<round>", "method":
"POST", "url": "/v1/chat/completions", "body": <the chat request the synchronous path
sends>}`. Round `label` asks for the verdict; a reply that breaks the format gets its
correction in round `correction` (the same conversation the synchronous path sends), so a
run with broken replies takes two batches. Chunks whose prompt is the same (same cache key)
are asked once.

* `batch`: the lines are uploaded (POST /v1/files, purpose "batch"), a batch created (POST
  /v1/batches, endpoint /v1/chat/completions, a 24 h window) and polled (GET
  /v1/batches/{id}) until it ends; its output and error files are downloaded (GET
  /v1/files/{id}/content) and folded in. Lines that failed (in the error file, a reply other
  than 200, or missing) go out again in a new batch, only they; a line that fails in
  `BATCH_ATTEMPTS` batches stops the run naming it. The batch ids are kept in the run folder
  (`teacher_batches.json`, written atomically as each batch is created): a run stopped while
  a batch is in flight resumes by polling it, never by sending it again.
* `batch-file`: the lines are written to `teacher_batch_<round>.jsonl` in the run folder and
  the run stops, saying how to run them (`vllm run_batch -i FILE -o OUT --model M`, or an
  upload by hand); rerun with `--teacher.batch-output OUT` to fold the replies in (and write
  the correction round's file, if a reply needs one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from tqdm import tqdm

from sieverag.data_gen.teacher import TeacherClient, TeacherRequest, cache_key
from sieverag.inference.core.errors import BackendUnavailableError, DatasetError, SieveragError
from sieverag.inference.core.io_utils import parse_json, read_text, write_atomic
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.openai_backend import ReplyUsage, server_key

STATE_FILE = "teacher_batches.json"
ENDPOINT = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"
# A line is sent in at most this many batches; failing in all of them stops the run.
BATCH_ATTEMPTS = 3
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: its id in the file, its cache key, the chunk it labels, the
    round, and the conversation it sends."""

    custom_id: str
    key: str
    request: TeacherRequest
    round: str
    messages: Conversation


class BatchState:
    """`teacher_batches.json`: the batches sent (id, input file, each line's custom id and
    cache key, whether folded), the lines of the last Batch JSONL written for `vllm
    run_batch`, and each line's failures. (Replies go to the teacher cache, as the
    synchronous path's do.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        data: dict[str, Any] = {}
        if path.is_file():
            advice = "delete it to send the teacher's outstanding requests again"
            data = parse_json(read_text(path), str(path), advice)
            if not isinstance(data, dict):
                raise DatasetError(f"{path}: is not a JSON object; {advice}")
        self.batches: list[dict[str, Any]] = data.get("batches", [])
        self.written: dict[str, str] = data.get("written", {})
        self.failures: dict[str, int] = data.get("failures", {})

    def save(self) -> None:
        write_atomic(self.path, json.dumps({"batches": self.batches, "written": self.written,
                                            "failures": self.failures}, indent=1))


class TeacherBatches:
    """The teacher's outstanding requests for some questions, asked as Batch JSONL."""

    def __init__(self, client: TeacherClient, folder: Path,
                 questions: Sequence[tuple[str, Sequence[TeacherRequest]]]) -> None:
        self.client = client
        self.folder = folder
        self.state = BatchState(folder / STATE_FILE)
        self._chunks = [(f"{question_id}/{index}", request)
                        for question_id, requests in questions
                        for index, request in enumerate(requests)]

    def pending(self) -> list[BatchLine]:
        """The lines still to send: one per prompt without a verdict, in the correction
        round when its first reply (cached) broke the format. A request whose replies are
        all cached gets its verdict here, as the synchronous path makes it."""
        lines, seen = [], set()
        for chunk_id, request in self._chunks:
            key = self.client.key(request)
            if key in seen or self.client.cache.get(key) is not None:
                continue
            seen.add(key)
            first = self.client.cache.get_reply(key)
            if first is None:
                lines.append(BatchLine(f"{chunk_id}/label", key, request, "label",
                                       request.messages()))
                continue
            verdict, correction = self.client.first_verdict(request, first)
            if correction is not None:
                second = self.client.cache.get_reply(cache_key(self.client.config.model,
                                                               correction))
                if second is None:
                    lines.append(BatchLine(f"{chunk_id}/correction", key, request,
                                           "correction", correction))
                    continue
                verdict = self.client.corrected_verdict(request, second)
            self.client.keep(request, verdict)
        return lines

    def jsonl(self, lines: Iterable[BatchLine]) -> str:
        return "".join(json.dumps({"custom_id": line.custom_id, "method": "POST",
                                   "url": ENDPOINT,
                                   "body": self.client.chat_request(line.messages)},
                                  ensure_ascii=False) + "\n" for line in lines)

    def fold(self, outputs: Iterable[dict[str, Any]], sent: dict[str, str]) -> list[str]:
        """Fold output lines (Batch API output or error file lines, or `vllm run_batch`'s)
        of the lines `sent` (custom id: cache key) into verdicts; returns the custom ids sent
        that are still outstanding and got no usable reply. A line is matched by its cache
        key, so a reply is never asked for twice however the questions are ordered."""
        by_key = {line.key: line for line in self.pending()}
        answered: set[str] = set()
        for output in outputs:
            custom_id = output.get("custom_id") if isinstance(output, dict) else None
            line = by_key.get(sent.get(custom_id, "")) if isinstance(custom_id, str) else None
            body = _reply_body(output) if line is not None else None
            if line is None or body is None or line.key in answered:
                continue
            answered.add(line.key)
            text = (((body.get("choices") or [{}])[0].get("message") or {}).get("content")
                    or "")
            self.client.take_reply(line.messages, text, ReplyUsage.of(body))
        self.pending()  # verdicts from the replies taken, as the synchronous path makes them
        failed = [custom_id for custom_id, key in sent.items()
                  if key in by_key and key not in answered]
        for custom_id in failed:
            self.state.failures[custom_id] = self.state.failures.get(custom_id, 0) + 1
        self.state.save()
        return failed

    # ----- batch-file ----------------------------------------------------------------

    def run_file(self, output: str | None) -> Path | None:
        """Fold `output` (a Batch output file) in, then write what is still to ask; the
        written input file, or None when every request has its verdict."""
        if output is not None:
            path = Path(output)
            if not path.is_file():
                raise DatasetError(f"--teacher.batch-output {output} is not a file; give the "
                                   "output file of the Batch JSONL this run wrote")
            self.fold(_read_jsonl(path), self.state.written)
        lines = self.pending()
        if not lines:
            return None
        name = "correction" if all(line.round == "correction" for line in lines) else "label"
        path = self.folder / f"teacher_batch_{name}.jsonl"
        write_atomic(path, self.jsonl(lines))
        self.state.written = {line.custom_id: line.key for line in lines}
        self.state.save()
        return path

    # ----- the Batch API -------------------------------------------------------------

    def run_api(self, progress: bool = True) -> None:
        """Send the outstanding requests through the server's Batch API until each has its
        verdict: resume the batches in flight, then submit what is still to ask."""
        api = BatchAPI(self.client)
        while True:
            for batch in self.state.batches:
                if not batch.get("folded"):
                    self._finish(api, batch, progress)
            lines = self.pending()
            if not lines:
                return
            spent = [line.custom_id for line in lines
                     if self.state.failures.get(line.custom_id, 0) >= BATCH_ATTEMPTS]
            if spent:
                for custom_id in spent:  # a rerun gives them their attempts again
                    self.state.failures.pop(custom_id)
                self.state.save()
                raise BackendUnavailableError(
                    f"teacher request(s) {', '.join(spent[:3])} failed in {BATCH_ATTEMPTS} "
                    f"batches at {self.client.config.endpoint} (see the error files of the "
                    f"batches in {self.state.path}); rerun to try them again")
            size = self.client.config.batch_lines
            for start in range(0, len(lines), size):
                self._submit(api, lines[start:start + size])

    def _submit(self, api: BatchAPI, lines: Sequence[BatchLine]) -> None:
        number = len(self.state.batches) + 1
        path = self.folder / f"teacher_batch_{number}.jsonl"
        write_atomic(path, self.jsonl(lines))
        file_id = api.upload(path)
        batch = api.create(file_id)
        self.state.batches.append({"id": batch["id"], "input_file_id": file_id,
                                   "lines": {line.custom_id: line.key for line in lines},
                                   "folded": False})
        self.state.save()

    def _finish(self, api: BatchAPI, batch: dict[str, Any], progress: bool) -> None:
        """Poll a batch until it ends, then fold its output and error files."""
        with tqdm(total=len(batch["lines"]), desc=f"teacher batch {batch['id']}", unit="request",
                  disable=not progress) as bar:
            while True:
                state = api.retrieve(batch["id"])
                counts = state.get("request_counts") or {}
                bar.n = (counts.get("completed") or 0) + (counts.get("failed") or 0)
                bar.set_postfix_str(str(state.get("status")), refresh=True)
                if state.get("status") in _ENDED:
                    break
                time.sleep(self.client.config.batch_poll_s)
        outputs: list[dict[str, Any]] = []
        for field in ("output_file_id", "error_file_id"):
            if state.get(field):
                outputs.extend(_jsonl_lines(api.content(state[field]),
                                            f"{field} {state[field]} of batch {batch['id']}"))
        self.fold(outputs, batch["lines"])
        batch["folded"] = True
        batch["status"] = state.get("status")
        self.state.save()
        if state.get("status") == "failed" and not outputs:
            errors = ((state.get("errors") or {}).get("data") or [{}])
            raise SieveragError(f"the teacher's batch {batch['id']} at "
                                f"{self.client.config.endpoint} failed: "
                                f"{errors[0].get('message', 'no reason given')}; rerun to "
                                "send its requests again")


def _reply_body(output: dict[str, Any]) -> dict[str, Any] | None:
    """The chat reply of a successful output line; None for a failed one."""
    if output.get("error"):
        return None
    response = output.get("response")
    if not isinstance(response, dict) or response.get("status_code") != 200:
        return None
    body = response.get("body")
    return body if isinstance(body, dict) and body.get("choices") else None


def _jsonl_lines(data: bytes, where: str) -> list[dict[str, Any]]:
    lines = []
    for number, text in enumerate(data.decode("utf-8").splitlines(), 1):
        if text.strip():
            lines.append(parse_json(text, f"{where}, line {number}",
                                    "the batch's replies cannot be read; rerun to ask again"))
    return lines


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return _jsonl_lines(path.read_bytes(), str(path))


class BatchAPI:
    """The server's Files and Batches endpoints, through the `openai` SDK's client."""

    def __init__(self, client: TeacherClient) -> None:
        config = client.config
        key = server_key(config.api_key_env)
        self.endpoint = config.endpoint.rstrip("/")
        retries = 4 if config.max_retries is None else config.max_retries
        self._client = openai.OpenAI(base_url=self.endpoint, api_key=key or "none",
                                     timeout=config.timeout_s, max_retries=retries)
        # Without a key no Authorization header is sent, as by the synchronous path.
        self._headers = {"Authorization": openai.Omit()} if key is None else {}

    def upload(self, path: Path) -> str:
        with path.open("rb") as handle:
            return self._call("POST /files", lambda: self._client.files.create(
                file=(path.name, handle), purpose="batch",
                extra_headers=self._headers)).id

    def create(self, input_file_id: str) -> dict[str, Any]:
        return self._call("POST /batches", lambda: self._client.batches.create(
            input_file_id=input_file_id, endpoint=ENDPOINT,
            completion_window=COMPLETION_WINDOW, extra_headers=self._headers)).model_dump()

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._call(f"GET /batches/{batch_id}", lambda: self._client.batches.retrieve(
            batch_id, extra_headers=self._headers)).model_dump()

    def content(self, file_id: str) -> bytes:
        return self._call(f"GET /files/{file_id}/content", lambda: self._client.files.content(
            file_id, extra_headers=self._headers)).content

    def _call(self, what: str, call: Any) -> Any:
        try:
            return call()
        except openai.APIStatusError as error:
            if error.status_code == 429 or error.status_code >= 500:
                raise BackendUnavailableError(
                    f"the teacher's server at {self.endpoint} answered {what} with HTTP "
                    f"{error.status_code}; rerun to resume: the batches sent are kept "
                    "(teacher_batches.json)") from None
            raise SieveragError(f"the teacher's server at {self.endpoint} refused {what} with "
                                f"HTTP {error.status_code}: {str(error.body)[:300]}; does it "
                                "serve the Batch API? (--teacher.mode batch-file writes the "
                                "requests for `vllm run_batch` instead)") from None
        except openai.APIConnectionError as error:
            raise BackendUnavailableError(f"the teacher's server at {self.endpoint} did not "
                                          f"answer {what} ({error}); rerun to resume: the "
                                          "batches sent are kept (teacher_batches.json)"
                                          ) from None


def answer_in_batches(client: TeacherClient, folder: Path,
                      questions: Sequence[tuple[str, Sequence[TeacherRequest]]], *,
                      progress: bool = True) -> Path | None:
    """Get the teacher's verdict on every chunk of `questions` (question id, its requests)
    into the cache, as `client.config.mode` says; in batch-file mode, the input file written
    while some are still to ask (None when all are answered)."""
    batches = TeacherBatches(client, folder, questions)
    if client.config.mode == "batch-file":
        return batches.run_file(client.config.batch_output)
    batches.run_api(progress)
    return None

