"""Teacher labels from a strong model over any OpenAI-compatible chat API, cached on disk.

For one question and one chunk (split into numbered sentences) the teacher is asked, with the
`teacher_label` prompt (data_gen/prompts), for one JSON object
`{"relevant": bool, "key_sentences": [numbers]}`.
A reply is valid when it parses (a Markdown code fence around it is tolerated), `relevant` is
a boolean and every key sentence number names a sentence of the chunk. An invalid reply is
answered once with the `teacher_correction` prompt; a second invalid reply is recorded as
`invalid`, never silently accepted.

Transport is `OpenAIBackend.generate`, on the `openai` SDK: bounded concurrency, the SDK's
retries with backoff on 429, 5xx, timeouts and dropped connections (a retried request is one
call: its label and usage are counted once), the key from an environment variable; when the
retries run out, or a reply is not JSON, the run stops with `BackendUnavailableError`
(everything finished so far is kept).

The cache is an append-only jsonl file keyed by sha256 of (model, prompt messages). Each
finished request (valid or invalid) is appended and flushed as soon as its reply arrives, so
an interrupted run — even `kill -9` — loses only the requests in flight, and a rerun asks
nothing that is already in the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sieverag.data_gen.templates import load_data_gen_template
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import JsonlLog, parse_json
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Conversation
from sieverag.inference.filters.filter_format import numbered_sentences
from sieverag.inference.llm.base import GenerationSettings, Usage
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

AGENT = "teacher"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@settings
class TeacherConfig:
    """Where the teacher is served and how hard to push it."""

    endpoint: str = field(metadata={"help": "OpenAI-compatible base URL, e.g. https://host/v1"})
    model: str = field(metadata={"help": "model name as the server serves it"})
    api_key_env: str | None = field(default=None,
                                    metadata={"help": "environment variable holding the key"})
    max_concurrency: int = field(default=8, metadata={"help": "requests in flight"})
    timeout_s: float = field(default=60.0, metadata={"help": "seconds to wait for one reply"})
    max_retries: int = field(default=4, metadata={"help": "retries on 429/5xx/timeouts"})
    backoff_s: float = field(default=1.0, metadata={"help": "first retry delay, doubling"})
    max_tokens: int = field(default=256, metadata={"help": "reply length cap in tokens"})

    def __post_init__(self) -> None:
        at_least(1, "teacher.", max_concurrency=self.max_concurrency, max_tokens=self.max_tokens)
        at_least(0, "teacher.", max_retries=self.max_retries)

    def backend_config(self) -> OpenAIBackendConfig:
        try:
            return OpenAIBackendConfig(
                base_url=self.endpoint, model=self.model, api_key_env=self.api_key_env,
                max_concurrency=self.max_concurrency, timeout_s=self.timeout_s,
                max_retries=self.max_retries, backoff_s=self.backoff_s)
        except ValueError as err:
            raise ConfigError(f"teacher: {err}") from err


@dataclass(frozen=True)
class TeacherRequest:
    """One chunk to label: the question and the chunk's sentences (and title)."""

    question: str
    sentences: tuple[str, ...]
    title: str = ""

    def messages(self) -> Conversation:
        return load_data_gen_template("teacher_label").messages(
            question=self.question, sentences=numbered_sentences(self.sentences, self.title))


@dataclass(frozen=True)
class TeacherVerdict:
    """The teacher's label for one chunk; `key_sentences` are 0-based.

    `status` is "valid", or "invalid" when both replies broke the format (`error` says how;
    `relevant` is then None).
    """

    status: Literal["valid", "invalid"]
    relevant: bool | None
    key_sentences: tuple[int, ...]
    reply: str
    error: str = ""
    attempts: int = 1

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "key_sentences": list(self.key_sentences)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TeacherVerdict:
        return cls(status=data["status"], relevant=data["relevant"],
                   key_sentences=tuple(data["key_sentences"]), reply=data["reply"],
                   error=data.get("error", ""), attempts=data.get("attempts", 1))


class TeacherReplyError(ValueError):
    """A teacher reply that does not follow the requested JSON format."""


def parse_teacher_reply(text: str, n_sentences: int) -> tuple[bool, tuple[int, ...]]:
    """(relevant, 0-based key sentences) from a reply; raises `TeacherReplyError` if invalid."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    # Any reply json cannot read is an invalid reply (corrected once, then recorded), never
    # an exception that stops the run; the reason goes back to the teacher in the correction.
    data = parse_json(body, "the reply", error=TeacherReplyError)
    if not isinstance(data, dict):
        raise TeacherReplyError("the reply is not a JSON object")
    relevant = data.get("relevant")
    if not isinstance(relevant, bool):
        raise TeacherReplyError('"relevant" must be true or false')
    numbers = data.get("key_sentences")
    if not isinstance(numbers, list) or any(
            isinstance(n, bool) or not isinstance(n, int) for n in numbers):
        raise TeacherReplyError('"key_sentences" must be a list of sentence numbers')
    wrong = [n for n in numbers if not 1 <= n <= n_sentences]
    if wrong:
        raise TeacherReplyError(f"sentence number(s) {wrong} do not exist "
                                f"(the passage has {n_sentences})")
    return relevant, tuple(sorted({n - 1 for n in numbers}))


def cache_key(model: str, messages: Conversation) -> str:
    """sha256 of the model name and the exact prompt messages."""
    payload = json.dumps({"model": model, "messages": messages}, sort_keys=True,
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class TeacherCache:
    """An append-only jsonl file of finished requests, one flushed line per reply."""

    def __init__(self, path: Path) -> None:
        self._log = JsonlLog(path)
        self._entries: dict[str, TeacherVerdict] = {}
        self._lock = threading.Lock()
        for entry in self._log.read():
            try:
                self._entries[entry["key"]] = TeacherVerdict.from_json(entry["verdict"])
            except (KeyError, TypeError) as err:
                raise DatasetError(f"{path}: a cache entry lacks {err}; delete the file to "
                                   "ask the teacher again") from None

    def get(self, key: str) -> TeacherVerdict | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, model: str, verdict: TeacherVerdict) -> None:
        with self._lock:
            self._entries[key] = verdict
            self._log.append({"key": key, "model": model, "verdict": verdict.as_json()})

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class TeacherStats:
    """What a labelling run asked of the teacher."""

    cached: int = 0
    asked: int = 0
    valid: int = 0
    invalid: int = 0
    corrections: int = 0
    usage: Usage = field(default_factory=Usage)


class TeacherClient:
    """Labels chunks with the teacher, reading and filling the disk cache."""

    def __init__(self, config: TeacherConfig, cache_path: Path) -> None:
        self.config = config
        self.backend = OpenAIBackend(config.backend_config())
        self.cache = TeacherCache(cache_path)
        self.stats = TeacherStats()
        self._settings = GenerationSettings(max_new_tokens=config.max_tokens)
        self._stats_lock = threading.Lock()

    def label(self, requests: Sequence[TeacherRequest]) -> list[TeacherVerdict]:
        """One verdict per request, in order; cached ones are not asked again.

        Requests run concurrently (at most `max_concurrency`); if one fails for good, the
        ones not yet started are dropped and the error raised — finished ones stay cached.
        """
        verdicts: list[TeacherVerdict | None] = [None] * len(requests)
        pending = []
        for index, request in enumerate(requests):
            verdict = self.cache.get(cache_key(self.config.model, request.messages()))
            if verdict is None:
                pending.append(index)
            else:
                verdicts[index] = verdict
        with self._stats_lock:
            self.stats.cached += len(requests) - len(pending)
        if pending:
            with ThreadPoolExecutor(self.config.max_concurrency,
                                    thread_name_prefix="teacher") as pool:
                futures = {pool.submit(self._ask, requests[i]): i for i in pending}
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in done if f.exception() is not None), None)
                if failed is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise failed.exception()
                for future, index in futures.items():
                    verdicts[index] = future.result()
        return [v for v in verdicts if v is not None]  # every slot is filled by now

    def _ask(self, request: TeacherRequest) -> TeacherVerdict:
        messages = request.messages()
        n_sentences = len(request.sentences)
        reply = self._generate(messages)
        try:
            verdict = self._verdict(reply, n_sentences, attempts=1)
        except TeacherReplyError as first_error:
            correction = load_data_gen_template("teacher_correction").messages(
                error=str(first_error), n_sentences=str(n_sentences))
            retry = [*messages, {"role": "assistant", "content": reply}, *correction]
            reply = self._generate(retry)
            with self._stats_lock:
                self.stats.corrections += 1
            try:
                verdict = self._verdict(reply, n_sentences, attempts=2)
            except TeacherReplyError as second_error:
                verdict = TeacherVerdict("invalid", None, (), reply, str(second_error), 2)
        self.cache.put(cache_key(self.config.model, messages), self.config.model, verdict)
        with self._stats_lock:
            self.stats.asked += 1
            if verdict.status == "valid":
                self.stats.valid += 1
            else:
                self.stats.invalid += 1
        return verdict

    def _generate(self, messages: Conversation) -> str:
        reply = self.backend.generate([messages], self._settings, agent=AGENT)[0]
        usage = self.backend.meter.snapshot().get(AGENT, Usage())
        with self._stats_lock:
            self.stats.usage = usage
        return reply

    @staticmethod
    def _verdict(reply: str, n_sentences: int, attempts: int) -> TeacherVerdict:
        relevant, keys = parse_teacher_reply(reply, n_sentences)
        return TeacherVerdict("valid", relevant, keys, reply, "", attempts)

    def close(self) -> None:
        self.backend.close()
