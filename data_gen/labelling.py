"""The `label` run: QA examples with chunks in, one jsonl line of label signals per question out.

Output folder:

* `labels.jsonl` — append-only, one line per finished question (schema below); a rerun skips
  the question ids already there, so an interrupted run resumes where it stopped;
* `label_config.json` — the settings that decide the labels; a rerun with different ones is
  refused (use another folder);
* `teacher_cache.jsonl` — the teacher's replies (`data_gen.teacher`);
* `usage.jsonl` — the teacher's ledger: each reply's tokens and dollars, every run of the
  folder (`data_gen.ledger`); summary.json's `teacher.ledger` sums it;
* `summary.json` — rewritten at the end of each run: counts, teacher and scorer usage, and the
  agreement of each signal with the data's gold marks (`data_gen.labels.gold_agreement`).

`concurrency` questions at a time have their CXMI scored in one scorer call
(`Labeller.label_many`); their records are those of one at a time, in the same order.

A `labels.jsonl` line (typed as `data_gen.label_records.LabelRecord`):

    {"question_id", "source", "question", "answers": [...],
     "no_context_logprobs": {alias: log p(alias | q)} | null (aliases that scored best somewhere),
     "chunks": [{"id", "title", "text", "sentences": [...], "sentences_given": bool,
                 "gold": bool | null, "gold_sentences": [0-based] | null,
                 "strinc": bool, "sentence_strinc": [bool per sentence],
                 "cxmi": {"score", "alias", "logprob_with", "logprob_without"} | null,
                 "sentence_cxmi": [{...} per sentence] | null,
                 "teacher": {"status", "relevant", "key_sentences", "reply", "error",
                             "attempts"} | null}]}
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from tqdm import tqdm

from sieverag.data_gen.cxmi import AGENT as CXMI_AGENT
from sieverag.data_gen.cxmi import (
    DEFAULT_BATCH_TOKENS,
    BatchedCXMI,
    CXMIQuestion,
    CXMIScore,
    CXMIScorer,
    cxmi_scorer,
)
from sieverag.data_gen.label_records import ChunkLabels, CXMIEntry, LabelRecord, read_labels
from sieverag.data_gen.labels import LabelPolicy, gold_agreement
from sieverag.data_gen.ledger import progress_ticker
from sieverag.data_gen.passages import with_borrowed_negatives
from sieverag.data_gen.shards import SHARD_HELP, in_shard, parse_shard
from sieverag.data_gen.strinc import strinc
from sieverag.data_gen.teacher import (
    TeacherClient,
    TeacherConfig,
    TeacherRequest,
    TeacherVerdict,
    steps_in_flight,
)
from sieverag.data_gen.templates import load_data_gen_template
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.in_flight import InFlightProgress, question_failure
from sieverag.inference.core.io_utils import (
    JsonlLog,
    check_output_folder,
    parse_json,
    read_text,
    write_atomic,
)
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Device, Document, Example
from sieverag.inference.data import (
    PassageHandling,
    dataset_identity,
    detect_format,
    example_source,
    load_examples,
    odd_passages_line,
)
from sieverag.inference.data.dataset_fields import dataset_field, dataset_format_field, limit_field
from sieverag.inference.llm.context_guard import context_guard_of
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.retrieval.sentences import split_sentences

CXMILevel = Literal["chunk", "sentence", "both"]
LABELS_FILE = "labels.jsonl"
CONFIG_FILE = "label_config.json"
TEACHER_CACHE_FILE = "teacher_cache.jsonl"
SUMMARY_FILE = "summary.json"

LABEL_CONCURRENCY_HELP = (
    "questions whose CXMI is scored together, in one call of the in-process scorer (their "
    "chunks and sentences fill the same batches; a step then holds at least this many "
    "questions; the teacher has its own --teacher.max-concurrency); the labels are the same, "
    "in dataset order")


def _none_word(value: Any) -> Any:
    """The word `none`, as a flag or a YAML file spells it, is None."""
    return None if isinstance(value, str) and value.strip().lower() == "none" else value


# A scorer model, or None (`none`): no CXMI.
ScorerName = Annotated[str | None, BeforeValidator(_none_word)]


@settings
class LabelRunConfig:
    """Settings of a `label` run."""

    dataset: str = dataset_field()
    out: str = field(metadata={"help": "label folder (rerunning into it resumes)"})
    dataset_format: str = dataset_format_field()
    limit: int | None = limit_field()
    scorer: ScorerName = field(default=DEFAULT_MODEL, metadata={
        "help": "CXMI scorer: embedded name or local Hugging Face folder; none: no CXMI"})
    cxmi_level: CXMILevel = field(default="both", metadata={
        "help": "score chunks, sentences or both with CXMI"})
    batch_size: int = field(default=16, metadata={"help": "scorer sequences per forward pass"})
    scorer_batch_tokens: int = field(default=DEFAULT_BATCH_TOKENS, metadata={
        "help": "in-process scorer: most padded tokens in one forward pass (a few hundred "
                "suit a CPU; raise it on a GPU, with --batch-size)"})
    scorer_endpoint: tuple[str, ...] = field(default=(), metadata={
        "help": "score CXMI through served prompt log-probs instead of in-process: "
                "OpenAI-compatible base URL(s) of vLLM or `sieverag serve` serving --scorer "
                "under its name, comma-separated replicas sharing the work"})
    device: Device = field(default="auto",
                                                   metadata={"help": "scorer device"})
    teacher: TeacherConfig | None = field(default=None, metadata={
        "help": "the teacher, any OpenAI-compatible API (unset: no teacher)"})
    max_documents: int | None = field(default=None,
                                      metadata={"help": "label at most N chunks per question"})
    borrowed_negatives: int = field(
        default=0, metadata={"help": "add N chunks of other questions as extra negatives "
                                     "(for data with one passage per question: SQuAD, NQ)"})
    seed: int = field(default=0, metadata={"help": "seed for borrowed negatives"})
    questions_per_step: int = field(default=8,
                                    metadata={"help": "questions whose teacher requests go "
                                                      "out together"})
    concurrency: int = field(default=1, metadata={"help": LABEL_CONCURRENCY_HELP})
    shard: str | None = field(default=None, metadata={"help": SHARD_HELP})

    def __post_init__(self) -> None:
        if self.shard is not None:
            parse_shard(self.shard)
        if self.scorer_endpoint and self.scorer is None:
            raise ConfigError("scorer_endpoint is set but scorer is none: name the served "
                              "scorer model with --scorer, or leave out --scorer-endpoint")
        at_least(1, limit=self.limit, batch_size=self.batch_size,
                 scorer_batch_tokens=self.scorer_batch_tokens,
                 questions_per_step=self.questions_per_step, concurrency=self.concurrency,
                 max_documents=self.max_documents)
        at_least(0, borrowed_negatives=self.borrowed_negatives)

    def fingerprint(self, source: str) -> dict[str, Any]:
        """The settings that decide the labels (a resumed run must match them)."""
        templates = [load_data_gen_template("teacher_label"),
                     load_data_gen_template("cxmi_with_context"),
                     load_data_gen_template("cxmi_without_context")]
        return {
            "dataset": dataset_identity(self.dataset), "source": source,
            "scorer": self.scorer, "cxmi_level": self.cxmi_level if self.scorer else None,
            "teacher_model": self.teacher.model if self.teacher else None,
            "max_documents": self.max_documents, "borrowed_negatives": self.borrowed_negatives,
            "seed": self.seed, "prompts": {t.name: t.sha256 for t in templates},
            **({"shard": self.shard} if self.shard is not None else {}),
        }


def chunk_sentences(document: Document) -> tuple[list[str], bool]:
    """The chunk's sentences (the data's own split when given) and whether they were given."""
    if document.sentences:
        return [s.strip() for s in document.sentences], True
    return split_sentences(document.text) or [document.text.strip()], False


def _check_fingerprint(out: Path, fingerprint: dict[str, Any]) -> None:
    path = out / CONFIG_FILE
    if path.is_file():
        advice = "use another --out, or delete the file if the folder's labels match these settings"
        stored = parse_json(read_text(path), str(path), advice)
        if not isinstance(stored, dict):
            raise DatasetError(f"{path}: is not a JSON object; {advice}")
        changed = sorted(k for k in fingerprint.keys() | stored.keys()
                         if fingerprint.get(k) != stored.get(k))
        if changed:
            raise ConfigError(f"{out} holds labels made with other settings ({', '.join(changed)} "
                              "differ); rerun with the same settings or use another --out")
        return
    write_atomic(path, json.dumps(fingerprint, indent=2))


def _score_entry(score: CXMIScore) -> CXMIEntry:
    return CXMIEntry(**{k: (round(v, 5) if isinstance(v, float) else v)
                        for k, v in asdict(score).items()})


@dataclass
class LabelRunSummary:
    """What a run did; written to summary.json."""

    questions_total: int = 0
    questions_done_before: int = 0
    questions_labelled: int = 0
    chunks_labelled: int = 0
    teacher: dict[str, Any] | None = None
    scorer_usage: dict[str, int] | None = None
    teacher_batch_input: str | None = None
    """batch-file mode: the Batch JSONL written, to run before labelling goes on."""
    odd_passages: str | None = None
    """The line counting the odd passages of the questions labelled now (`odd_passages_line`)."""
    gold_agreement: dict[str, Any] = field(default_factory=dict)


# One question's CXMI: chunk scores, sentence scores per chunk, no-context log-prob per alias.
_QuestionCXMI = tuple[list[CXMIScore], list[list[CXMIScore]], dict[str, float] | None]


class Labeller:
    """Computes the signals of questions, one at a time or several scored together."""

    def __init__(self, config: LabelRunConfig, scorer: CXMIScorer | None,
                 teacher: TeacherClient | None,
                 positions: dict[str, int] | None = None) -> None:
        self.config = config
        self.scorer = scorer
        self.teacher = teacher
        self.positions = positions  # a sharded run's: each question's place in the dataset

    def teacher_requests(self, example: Example) -> list[TeacherRequest]:
        return [TeacherRequest(example.question, tuple(chunk_sentences(d)[0]), d.title)
                for d in self.documents(example)]

    def documents(self, example: Example) -> Sequence[Document]:
        """The chunks of `example` it labels: the first `max_documents`."""
        return example.documents[:self.config.max_documents]

    def label(self, example: Example,
              verdicts: Sequence[TeacherVerdict] | None) -> LabelRecord:
        return self.label_many([example], [verdicts])[0]

    def label_many(self, examples: Sequence[Example],
                   verdicts: Sequence[Sequence[TeacherVerdict] | None]) -> list[LabelRecord]:
        """One record per example, in order, each as `label` makes it; the CXMI of all their
        chunks and sentences is scored in one scorer call (`CXMIScorer.score_many`)."""
        documents = [self.documents(e) for e in examples]
        splits = [[chunk_sentences(d) for d in docs] for docs in documents]
        cxmi = self._cxmi(examples, documents, splits)
        return [self._record(*parts) for parts in zip(
            examples, documents, splits, cxmi, verdicts, strict=True)]

    def _record(self, example: Example, documents: Sequence[Document],
                split: Sequence[tuple[list[str], bool]], cxmi: _QuestionCXMI,
                verdicts: Sequence[TeacherVerdict] | None) -> LabelRecord:
        chunk_scores, sentence_scores, no_context = cxmi
        chunks = []
        for index, (document, (sentences, given)) in enumerate(zip(documents, split, strict=True)):
            gold_sentences = (list(document.supporting_sentences)
                              if given and document.supporting_sentences is not None else None)
            chunks.append(ChunkLabels(
                id=document.id, title=document.title, text=document.text,
                sentences=sentences, sentences_given=given,
                gold=document.is_gold, gold_sentences=gold_sentences,
                strinc=strinc(document.as_context(), example.answers),
                sentence_strinc=[strinc(s, example.answers) for s in sentences],
                cxmi=_score_entry(chunk_scores[index]) if chunk_scores else None,
                sentence_cxmi=([_score_entry(s) for s in sentence_scores[index]]
                               if sentence_scores else None),
                teacher=verdicts[index].as_json() if verdicts is not None else None,
            ))
        position = ({"position": self.positions[example.id]}
                    if self.positions is not None else {})
        return LabelRecord(question_id=example.id, source=example_source(example),
                           question=example.question, answers=list(example.answers),
                           no_context_logprobs=no_context, chunks=chunks, **position)

    def _cxmi(self, examples: Sequence[Example], documents: Sequence[Sequence[Document]],
              splits: Sequence[Sequence[tuple[list[str], bool]]]) -> list[_QuestionCXMI]:
        """Per example: its chunks' scores, its sentences' (per chunk), its no-context
        log-probs; empty and None without a scorer."""
        if self.scorer is None:
            return [([], [], None) for _ in examples]
        level = self.config.cxmi_level
        questions = []
        for example, docs, split in zip(examples, documents, splits, strict=True):
            contexts = [d.as_context() for d in docs] if level != "sentence" else []
            if level != "chunk":
                contexts += [s for sentences, _ in split for s in sentences]
            questions.append(CXMIQuestion(example.question, example.answers, contexts))
        results = []
        for docs, split, scores in zip(documents, splits, self.scorer.score_many(questions),
                                       strict=True):
            n_chunks = len(docs) if level != "sentence" else 0
            by_sentence: list[list[CXMIScore]] = []
            if level != "chunk":
                position = n_chunks
                for sentences, _ in split:
                    by_sentence.append(scores[position:position + len(sentences)])
                    position += len(sentences)
            no_context = {score.alias: round(score.logprob_without, 5) for score in scores}
            results.append((scores[:n_chunks], by_sentence, no_context))
        return results


def _load(config: LabelRunConfig) -> tuple[list[Example], str, dict[str, int] | None]:
    """The questions to label (the shard's, when sharded), their source, and with a shard
    each question's place in the whole dataset."""
    source = detect_format(config.dataset) if config.dataset_format == "auto" \
        else config.dataset_format
    examples = load_examples(config.dataset, config.dataset_format, config.limit)
    seen: set[str] = set()
    for example in examples:
        if example.id in seen:
            raise DatasetError(f"{config.dataset}: question id {example.id!r} occurs twice; "
                               "labels are resumed by question id, so ids must be unique")
        seen.add(example.id)
        if not example.documents:
            raise DatasetError(f"{config.dataset}: question {example.id!r} has no chunks to label")
    # Negatives are borrowed over the whole dataset, then the shard taken: a question's chunks
    # are the same in every shard split.
    examples = with_borrowed_negatives(examples, config.borrowed_negatives, config.seed)
    if config.shard is None:
        return examples, source, None
    return ([e for e in examples if in_shard(e.id, config.shard)], source,
            {e.id: position for position, e in enumerate(examples)})


def run_labelling(
    config: LabelRunConfig, *, progress: bool = True,
    scorer_factory: Callable[[LabelRunConfig], CXMIScorer] | None = None,
) -> LabelRunSummary:
    """Label every question of the dataset not yet in `out/labels.jsonl`; return a summary.

    `scorer_factory` builds the CXMI scorer (default: the hf backend on `config.scorer`).
    """
    check_output_folder(config.out)
    examples, source, positions = _load(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    _check_fingerprint(out, config.fingerprint(source))
    labels_path = out / LABELS_FILE
    done = {record.question_id for record in read_labels(labels_path)}
    todo = [e for e in examples if e.id not in done]
    summary = LabelRunSummary(questions_total=len(examples),
                              questions_done_before=len(examples) - len(todo))
    scorer = None
    teacher = (TeacherClient(config.teacher, out / TEACHER_CACHE_FILE)
               if config.teacher is not None else None)
    labeller = Labeller(config, scorer, teacher, positions)
    writer = JsonlLog(labels_path)
    try:
        if teacher is not None and teacher.config.mode != "sync" and todo:
            from sieverag.data_gen.batch import answer_in_batches

            waiting = answer_in_batches(teacher, out, [(e.id, labeller.teacher_requests(e))
                                                       for e in todo], progress=progress)
            summary.teacher_batch_input = None if waiting is None else str(waiting)
        if summary.teacher_batch_input is None:
            if config.scorer is not None and todo:
                scorer = labeller.scorer = (scorer_factory or _default_scorer)(config)
            summary.odd_passages = odd_passages_line(
                [replace(e, documents=tuple(labeller.documents(e))) for e in todo],
                label_passage_handling(scorer))
            bar = tqdm(total=len(examples), initial=len(examples) - len(todo),
                       desc="labelling", unit="question", disable=not progress)
            with _teacher_progress(bar, teacher, config, examples):
                _label_all(labeller, todo, writer, summary, bar)
    finally:
        if teacher is not None:
            teacher.close()
            stats = teacher.stats
            summary.teacher = {"model": config.teacher.model, "cached": stats.cached,
                               "asked": stats.asked, "valid": stats.valid,
                               "invalid": stats.invalid, "corrections": stats.corrections,
                               "requests": stats.usage.calls,
                               "prompt_tokens": stats.usage.prompt_tokens,
                               "completion_tokens": stats.usage.completion_tokens,
                               "ledger": teacher.ledger.totals.as_json(),
                               "adaptations": teacher.backend.adaptations}
        if scorer is not None:
            usage = scorer.backend.meter.snapshot().get(CXMI_AGENT)
            if usage is not None:
                summary.scorer_usage = {"sequences": usage.calls, "tokens": usage.prompt_tokens}
    summary.gold_agreement = gold_agreement(read_labels(labels_path), LabelPolicy())
    write_atomic(out / SUMMARY_FILE, json.dumps(asdict(summary), indent=2, ensure_ascii=False))
    return summary


def label_passage_handling(scorer: CXMIScorer | None) -> PassageHandling:
    """What labelling does with odd passages (`odd_passages_line`): labels every chunk as
    given, a blank or repeated one too; a CXMI scorer that checks its context (in-process,
    or served with `context_length`) cuts the prompt of a chunk longer than it to fit."""
    guard = context_guard_of(scorer.backend) if scorer is not None else None
    if guard is None:
        return PassageHandling(blank="labelled as given", duplicate="labelled again")
    return PassageHandling(blank="labelled as given", duplicate="labelled again",
                           long="labelled, their CXMI prompts cut to fit it",
                           window=f"the scorer's context of {guard.context_length} tokens",
                           fits=guard.holds)


def _teacher_progress(bar: tqdm, teacher: TeacherClient | None, config: LabelRunConfig,
                      examples: Sequence[Example]) -> contextlib.AbstractContextManager:
    """While labelling runs, the bar shows the teacher's dollars (so far, projected over every
    chunk of the dataset) and what holds its requests back (`TeacherClient.progress_note`)."""
    if teacher is None:
        return contextlib.nullcontext()
    chunks = sum(len(e.documents[:config.max_documents]) for e in examples)
    return progress_ticker(bar, lambda: teacher.progress_note(chunks))


def _default_scorer(config: LabelRunConfig) -> CXMIScorer:
    if config.scorer_endpoint:
        return served_scorer(config)
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    return cxmi_scorer(HFBackend(HFBackendConfig(model=config.scorer or DEFAULT_MODEL,
                                                 device=config.device,
                                                 batch_size=config.batch_size)),
                       batch_tokens=config.scorer_batch_tokens)


def served_scorer(config: LabelRunConfig) -> CXMIScorer:
    """CXMI through `scorer_endpoint`'s servers (their prompt log-probs, the prompts rendered
    with the scorer's own chat template), one usage meter for all the replicas."""
    from sieverag.inference.llm.backend_protocol import UsageMeter
    from sieverag.inference.llm.model_resolution import resolve_model
    from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig

    name = config.scorer or DEFAULT_MODEL
    template = str(resolve_model(name))
    meter = UsageMeter()
    backends = []
    for url in config.scorer_endpoint:
        try:
            backend_config = OpenAIBackendConfig(base_url=url, model=name,
                                                 chat_template_model=template)
        except ValueError as err:
            raise ConfigError(f"scorer_endpoint {url}: {err}") from err
        backends.append(OpenAIBackend(backend_config, meter=meter))
    return BatchedCXMI(*backends)


def _label_all(labeller: Labeller, todo: list[Example], writer: JsonlLog,
               summary: LabelRunSummary, bar: tqdm) -> None:
    """Label in steps; the teacher works on the next steps while the scorer runs this one,
    `concurrency` questions of it at a time (one scorer call each). Enough steps' requests
    are out at once (`teacher.steps_in_flight`) that the teacher keeps its pace while a
    step's last request waits out a timeout or a backoff."""
    concurrency = labeller.config.concurrency
    size = max(labeller.config.questions_per_step, concurrency)
    steps = [todo[i:i + size] for i in range(0, len(todo), size)]
    progress = InFlightProgress(bar)
    teacher = labeller.teacher
    # The first step's requests size how many steps go out at once; built once.
    first = ([labeller.teacher_requests(e) for e in steps[0]]
             if teacher is not None and steps else None)
    ahead = 2 if first is None else steps_in_flight(teacher.config, sum(map(len, first)))

    def ask(number: int) -> Future | None:
        if teacher is None:
            return None
        requests = (first if number == 0 and first is not None
                    else [labeller.teacher_requests(e) for e in steps[number]])
        return _ask_teacher(teacher, requests, background)

    def keep(record: LabelRecord) -> None:
        writer.append(record.to_json())
        summary.questions_labelled += 1
        summary.chunks_labelled += len(record.chunks)
        progress.done += 1
        bar.update(1)

    with bar, ThreadPoolExecutor(ahead, thread_name_prefix="teacher-step") as background:
        upcoming = deque(ask(number) for number in range(min(ahead, len(steps))))
        for number, step in enumerate(steps):
            asked = upcoming.popleft()
            verdicts = asked.result() if asked is not None else [None] * len(step)
            if number + ahead < len(steps):
                upcoming.append(ask(number + ahead))
            for start in range(0, len(step), concurrency):
                group = step[start:start + concurrency]
                progress.show(len(group))
                bar.refresh()
                _label_group(labeller, group, verdicts[start:start + concurrency], keep,
                             summary)
        progress.show(0)


def _label_group(labeller: Labeller, group: list[Example],
                 verdicts: Sequence[Sequence[TeacherVerdict] | None],
                 keep: Callable[[LabelRecord], None], summary: LabelRunSummary) -> None:
    """`keep` the group's records in order, their CXMI scored together. Where that fails the
    questions are labelled one at a time: those before the failing one are kept, then one
    `QuestionFailedError` names it."""
    if len(group) > 1:
        try:
            records = labeller.label_many(group, verdicts)
        except Exception:  # relabelled one at a time below, to find the question
            records = None
        if records is not None:
            for record in records:
                keep(record)
            return
    for example, verdict in zip(group, verdicts, strict=True):
        try:
            record = labeller.label(example, verdict)
        except Exception as error:
            raise question_failure(repr(example.id), error,
                                   summary.questions_labelled) from error
        keep(record)


def _ask_teacher(teacher: TeacherClient, requests: list[list[TeacherRequest]],
                 background: ThreadPoolExecutor) -> Future:
    """Start the teacher on a step's requests (a list per question); the future gives one
    verdict list per question."""

    def ask() -> list[list[TeacherVerdict]]:
        flat = teacher.label([r for rs in requests for r in rs])
        grouped, position = [], 0
        for rs in requests:
            grouped.append(flat[position:position + len(rs)])
            position += len(rs)
        return grouped

    return background.submit(ask)


