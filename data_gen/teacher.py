"""Teacher labels from a strong model over any OpenAI-compatible chat API, cached on disk.

For one question and one chunk (split into numbered sentences) the teacher is asked, with the
`teacher_label` prompt (data_gen/prompts), for one JSON object
`{"relevant": bool, "key_sentences": [numbers]}`.
A reply is valid when it parses (a Markdown code fence around it is tolerated), `relevant` is
a boolean and every key sentence number names a sentence of the chunk. An invalid reply is
answered once with the `teacher_correction` prompt; a second invalid reply is recorded as
`invalid`, never silently accepted.

Transport is `OpenAIBackend.chat`, on the `openai` SDK: bounded concurrency, paced by
`--teacher.rpm` / `--teacher.tpm` and the server's rate-limit headers, 429, 5xx, timeouts,
dropped connections and replies cut short retried with backoff (a `Retry-After` pauses every
request) for up to `--teacher.patience` seconds (a retried request is one call: its label and
usage are counted once), the key from an environment variable; only a server that stays down
past the patience, or answers with something that is not JSON, stops the run with
`BackendUnavailableError` (everything finished so far is kept). A server that wants
`max_completion_tokens`, or refuses `temperature`, gets it after its first refusal.

The cache is an append-only jsonl file keyed by sha256 of (model, prompt messages). Every
reply is appended (with its usage) and fsynced the moment it arrives, before it is read, and a
finished request's verdict after it; so an interrupted run — even `kill -9` — loses only the
requests in flight, and a rerun asks nothing it already has a reply to (not even the first
half of a corrected request). Each reply's usage then goes to the run's ledger
(`data_gen/ledger.py`: `usage.jsonl`, prices, `--teacher.max-cost`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sieverag.data_gen.ledger import USAGE_FILE, Prices, UsageLedger
from sieverag.data_gen.templates import load_data_gen_template
from sieverag.inference.core.errors import (
    BackendUnavailableError,
    ConfigError,
    DatasetError,
    SieveragError,
)
from sieverag.inference.core.io_utils import JsonlLog, parse_json
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Conversation
from sieverag.inference.filters.filter_format import numbered_sentences
from sieverag.inference.llm.backend_protocol import GenerationSettings, Usage
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig, ReplyUsage
from sieverag.inference.llm.openai_transport import TokenField
from sieverag.inference.llm.rate_limit import prompt_bytes

AGENT = "teacher"
# Steps of requests a labelling run keeps out at most (`steps_in_flight`).
MAX_STEPS_IN_FLIGHT = 16
TeacherMode = Literal["sync", "batch", "batch-file"]
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
    max_retries: int | None = field(default=None, metadata={
        "help": "retries of one request on 429/5xx/timeouts (unset: as many as "
                "--teacher.patience allows)"})
    backoff_s: float = field(default=1.0, metadata={
        "help": "first retry delay, doubling up to a minute, with jitter (Retry-After wins)"})
    patience: float = field(default=3600.0, metadata={
        "help": "seconds a request keeps retrying a rate-limited or failing server before the "
                "run stops (it waits, and the progress bar says so)"})
    rpm: int | None = field(default=None, metadata={
        "help": "requests a minute at most, shared by every request in flight (unset: only "
                "the server's x-ratelimit headers pace)"})
    tpm: int | None = field(default=None, metadata={
        "help": "tokens a minute at most (prompt estimated, plus --teacher.max-tokens)"})
    token_field: TokenField = field(default="auto", metadata={
        "help": "reply-length field: max_tokens, max_completion_tokens (OpenAI's reasoning "
                "models), or auto (max_tokens until the server refuses it)"})
    price_in: float = field(default=0.0, metadata={
        "help": "USD per million prompt tokens (the ledger's dollars)"})
    price_out: float = field(default=0.0, metadata={
        "help": "USD per million completion tokens, reasoning tokens included"})
    price_cached: float | None = field(default=None, metadata={
        "help": "USD per million prompt tokens read from the server's cache (unset: "
                "--teacher.price-in)"})
    max_cost: float | None = field(default=None, metadata={
        "help": "USD the teacher may cost in this output folder, all runs together: the run "
                "stops before a request that could pass it (rerun with more to go on)"})
    max_tokens: int = field(default=256, metadata={"help": "reply length cap in tokens"})
    mode: TeacherMode = field(default="sync", metadata={
        "help": "sync: one request per chunk as labelling goes; batch: the requests go "
                "through the server's Batch API (/v1/files, /v1/batches), polled until done; "
                "batch-file: the requests are written as Batch JSONL for `vllm run_batch` (or "
                "an upload), and --teacher.batch-output reads its output back"})
    batch_output: str | None = field(default=None, metadata={
        "help": "batch-file mode: the output file of the last written Batch JSONL"})
    batch_poll_s: float = field(default=30.0, metadata={
        "help": "batch mode: seconds between looks at a submitted batch"})
    batch_lines: int = field(default=50_000, metadata={
        "help": "batch mode: most requests in one batch (OpenAI's limit is 50,000)"})

    def __post_init__(self) -> None:
        at_least(1, "teacher.", max_concurrency=self.max_concurrency, max_tokens=self.max_tokens,
                 batch_lines=self.batch_lines)
        if not self.batch_poll_s > 0:
            raise ConfigError(f"teacher.batch_poll_s must be > 0, got {self.batch_poll_s}")
        if self.batch_output is not None and self.mode != "batch-file":
            raise ConfigError("teacher.batch_output is read in --teacher.mode batch-file only, "
                              f"not {self.mode}; add --teacher.mode batch-file")
        at_least(0, "teacher.", max_retries=self.max_retries, price_in=self.price_in,
                 price_out=self.price_out, price_cached=self.price_cached,
                 max_cost=self.max_cost)
        at_least(1, "teacher.", rpm=self.rpm, tpm=self.tpm)
        if not self.patience > 0:
            raise ConfigError(f"teacher.patience must be > 0 seconds, got {self.patience}")
        if self.max_cost is not None and self.prices().free:
            raise ConfigError("teacher.max_cost needs the prices: set --teacher.price-in and "
                              "--teacher.price-out (USD per million tokens)")

    def prices(self) -> Prices:
        return Prices(self.price_in, self.price_out, self.price_cached)

    def backend_config(self) -> OpenAIBackendConfig:
        try:
            return OpenAIBackendConfig(
                base_url=self.endpoint, model=self.model, api_key_env=self.api_key_env,
                max_concurrency=self.max_concurrency, timeout_s=self.timeout_s,
                max_retries=self.max_retries, backoff_s=self.backoff_s,
                patience_s=self.patience, rpm=self.rpm, tpm=self.tpm,
                token_field=self.token_field)
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
    """An append-only jsonl file: each reply (with its usage) as it arrives, and each
    finished request's verdict; one fsynced line each."""

    def __init__(self, path: Path) -> None:
        self._log = JsonlLog(path)
        self._entries: dict[str, TeacherVerdict] = {}
        self._replies: dict[str, tuple[str, ReplyUsage]] = {}
        self._lock = threading.Lock()
        for entry in self._log.read():
            try:
                if "verdict" in entry:
                    self._entries[entry["key"]] = TeacherVerdict.from_json(entry["verdict"])
                else:
                    self._replies[entry["key"]] = (entry["reply"],
                                                   ReplyUsage(**entry["usage"]))
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

    def get_reply(self, key: str) -> str | None:
        """The reply received to the conversation of cache key `key`, if any."""
        with self._lock:
            kept = self._replies.get(key)
        return None if kept is None else kept[0]

    def put_reply(self, key: str, model: str, reply: str, usage: ReplyUsage) -> None:
        with self._lock:
            self._replies[key] = (reply, usage)
            self._log.append({"key": key, "model": model, "reply": reply,
                              "usage": asdict(usage)})

    def receipts(self) -> list[tuple[str, ReplyUsage]]:
        """(key, usage) of every reply cached."""
        with self._lock:
            return [(key, usage) for key, (_, usage) in self._replies.items()]

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


def steps_in_flight(config: TeacherConfig, requests_per_step: int) -> int:
    """How many steps of requests a labelling run keeps out at once so the teacher keeps its
    pace while a step's last request waits out a timeout and one backoff: the oldest step,
    one more (whose own last request may hang too), and enough besides to hold `rpm` x
    (timeout + backoff) requests; at most `MAX_STEPS_IN_FLIGHT`. Without `rpm` the pace is
    the server's, unknown: 2.

    Measured with bench_label_faults.py (600 rpm, a 10 s timeout, steps of 64 requests,
    2 % of requests hanging): 2 steps out reached 85 % of the set pace, 3 steps 93 %, 4
    steps (what this gives there) 99 %."""
    if config.rpm is None or requests_per_step < 1:
        return 2
    held = config.rpm / 60 * (config.timeout_s + config.backoff_s)
    return min(MAX_STEPS_IN_FLIGHT, 2 + math.ceil(held / requests_per_step))


class TeacherClient:
    """Labels chunks with the teacher, reading and filling the disk cache."""

    def __init__(self, config: TeacherConfig, cache_path: Path,
                 ledger_path: Path | None = None) -> None:
        self.config = config
        self.backend = OpenAIBackend(config.backend_config())
        self.cache = TeacherCache(cache_path)
        self.ledger = UsageLedger(ledger_path or cache_path.with_name(USAGE_FILE),
                                  config.prices(), config.max_cost)
        self.ledger.settle_receipts(self.cache.receipts())
        self.stats = TeacherStats()
        self._sent = threading.local()  # whether this thread's request reached the server
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
            verdict = self.cache.get(self.key(request))
            if verdict is None:
                pending.append(index)
            else:
                verdicts[index] = verdict
        with self._stats_lock:
            self.stats.cached += len(requests) - len(pending)
        if pending and self.config.mode != "sync":  # the batches answered every request first
            raise SieveragError(f"{len(pending)} teacher request(s) have no verdict from the "
                                f"{self.config.mode} run; rerun the command to send them")
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
        self._sent.value = False
        reply = self._generate(request.messages())
        verdict, correction = self.first_verdict(request, reply)
        if correction is not None:
            verdict = self.corrected_verdict(request, self._generate(correction))
        self.keep(request, verdict, asked=self._sent.value)
        return verdict

    @staticmethod
    def first_verdict(request: TeacherRequest,
                      reply: str) -> tuple[TeacherVerdict | None, Conversation | None]:
        """The verdict a first reply gives, or (when it breaks the format) None and the
        conversation that asks for the correction (`corrected_verdict` reads its reply)."""
        messages = request.messages()
        n_sentences = len(request.sentences)
        try:
            return TeacherClient._verdict(reply, n_sentences, attempts=1), None
        except TeacherReplyError as first_error:
            correction = load_data_gen_template("teacher_correction").messages(
                error=str(first_error), n_sentences=str(n_sentences))
            return None, [*messages, {"role": "assistant", "content": reply}, *correction]

    def corrected_verdict(self, request: TeacherRequest, reply: str) -> TeacherVerdict:
        """The verdict the reply to the correction gives: valid, or recorded invalid."""
        with self._stats_lock:
            self.stats.corrections += 1
        try:
            return self._verdict(reply, len(request.sentences), attempts=2)
        except TeacherReplyError as second_error:
            return TeacherVerdict("invalid", None, (), reply, str(second_error), 2)

    def keep(self, request: TeacherRequest, verdict: TeacherVerdict, *,
             asked: bool = True) -> None:
        """Cache a finished request's verdict and count it (`asked`: the teacher was asked;
        else its replies were all in the cache)."""
        self.cache.put(self.key(request), self.config.model, verdict)
        with self._stats_lock:
            if asked:
                self.stats.asked += 1
            else:
                self.stats.cached += 1
            if verdict.status == "valid":
                self.stats.valid += 1
            else:
                self.stats.invalid += 1

    def take_reply(self, messages: Conversation, text: str, usage: ReplyUsage) -> None:
        """Keep a reply that came another way (a batch's output line) as `_generate` keeps
        the server's: cached with its usage, entered in the ledger, counted."""
        key = cache_key(self.config.model, messages)
        self.cache.put_reply(key, self.config.model, text, usage)
        self.ledger.record(key, usage, prompt_bytes({"messages": messages}))
        self.backend.meter.record(AGENT, 1, usage.prompt_tokens, usage.completion_tokens)
        with self._stats_lock:
            self.stats.usage = self.backend.meter.snapshot().get(AGENT, Usage())

    def key(self, request: TeacherRequest) -> str:
        """The request's cache key."""
        return cache_key(self.config.model, request.messages())

    def chat_request(self, messages: Conversation) -> dict[str, Any]:
        """The /chat/completions body this client sends for `messages` (a Batch API line's)."""
        return self.backend.chat_request(messages, self._settings)

    def progress_note(self, total_requests: int) -> str:
        """For a progress bar: dollars so far and projected for `total_requests`, and what
        holds the requests back ("rate limited: resuming in 42 s")."""
        note = self.ledger.progress(len(self.cache), total_requests)
        waiting = self.backend.waiting()
        return note if waiting is None else f"{note}; {waiting}"

    def _generate(self, messages: Conversation) -> str:
        """The reply to `messages`: the cached one, else the server's, cached (with its
        usage) and entered in the ledger before it is used."""
        key = cache_key(self.config.model, messages)
        cached = self.cache.get_reply(key)
        if cached is not None:
            return cached
        self._sent.value = True
        size = prompt_bytes({"messages": messages})
        with self.ledger.reserve(size, self.config.max_tokens):
            try:
                reply = self.backend.chat([messages], self._settings, agent=AGENT)[0]
            except BackendUnavailableError as error:
                raise BackendUnavailableError(
                    f"teacher: {error}; finished replies are kept: rerun the same command to "
                    f"resume (--teacher.patience {self.config.patience:g} s now)") from None
            self.cache.put_reply(key, self.config.model, reply.text, reply.usage)
            self.ledger.record(key, reply.usage, size)
        usage = self.backend.meter.snapshot().get(AGENT, Usage())
        with self._stats_lock:
            self.stats.usage = usage
        return reply.text

    @staticmethod
    def _verdict(reply: str, n_sentences: int, attempts: int) -> TeacherVerdict:
        relevant, keys = parse_teacher_reply(reply, n_sentences)
        return TeacherVerdict("valid", relevant, keys, reply, "", attempts)

    def close(self) -> None:
        self.backend.close()
