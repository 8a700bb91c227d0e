"""`eval-filter`: the trained filter against its baselines on held-out HotpotQA questions.

Every method (see `training.filter_methods`) runs on the SAME questions, chosen as the
dataset's rows minus the questions any training split was built from (read from the
`sieverag build-dataset` output, default: the dataset named in the adapter's metadata).

Metrics (definitions beside the code that computes them):

* chunk level, against the gold passages (`is_gold`): per-question precision / recall / F1
  of the kept passage ids (`inference.eval.metrics.filter_scores`), averaged over questions
  (macro); the same pooled over all passages (micro); passages kept per question; AUROC and
  average precision of the method's score over all passages (methods with a score).
* sentence level, on the questions with supporting facts, against the set of
  (passage, sentence) supporting facts: the trained filter end to end (its chunk stage, then
  its sentence stage on the kept passages) and every baseline keeping whole passages (all
  their sentences); two oracle reference rows show the sentence stage alone on the gold
  passages.

Work is cached per method in `OUT/cache/` under a fingerprint of what decides it (model,
adapter content, questions, settings), so a rerun after an interruption skips finished
methods.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.eval.metrics import filter_scores
from sieverag.inference.filters.adapters import CARD_FILE, check_card
from sieverag.inference.io_utils import write_atomic
from sieverag.inference.llm.models import DEFAULT_MODEL
from sieverag.inference.types import Example
from sieverag.training import filter_methods as methods

FILTER = "trained filter"
FILTER_ADAPTIVE = "trained filter, adaptive bar"
JUDGE = "MAIN-RAG judge"
KEEP_ALL = "keep all"
ORACLE_ALL = "oracle: gold passages, all sentences"
ORACLE_FILTER = "oracle: gold passages, filter sentence stage"


@dataclass(frozen=True)
class FilterEvalConfig:
    """What `eval-filter` compares and on which questions."""

    dataset: str = field(metadata={"help": "HotpotQA-format file with gold passages"})
    out: str = field(metadata={"help": "report folder"})
    adapter: str | None = field(
        default=None, metadata={"help": "LoRA adapter folder, or the name of an installed or "
                                        "shipped filter (`sieverag filter list`); default: "
                                        "smollm2-filter"})
    filter_endpoint: str | None = field(
        default=None, metadata={"help": "OpenAI-compatible base URL serving the filter"})
    filter_model: str | None = field(
        default=None, metadata={"help": "the served filter's model name (its adapter name)"})
    api_key_env: str | None = field(
        default=None, metadata={"help": "environment variable holding the server's key"})
    base_model: str | None = field(
        default=None, metadata={"help": "base model of the filter and the judge; default: the "
                                        "adapter's metadata, else the embedded model"})
    exclude_training: tuple[str, ...] = field(
        default=(), metadata={"help": "build-dataset folders whose train-split questions are "
                                      "left out; default: the adapter's training dataset"})
    question_ids_file: str | None = field(
        default=None, metadata={"help": "evaluate only the question ids listed (one a line)"})
    allow_training_questions: bool = field(
        default=False, metadata={"help": "evaluate without knowing the training questions"})
    limit: int | None = field(default=None, metadata={"help": "first N eligible questions"})
    threshold: float = field(
        default=0.5, metadata={"help": "keep a passage when the filter's P(Yes) exceeds this"})
    top_k: int = field(default=2, metadata={"help": "k of the BM25 and dense top-k baselines"})
    judge_n: float = field(default=0.0, metadata={"help": "n of the judge bar mean(r) − n·σ(r)"})
    lexical_weight: float = field(default=1.0, metadata={
        "help": "w of the 'trained filter + BM25 prior' row: top-k of z(log-odds) + w·z(BM25) "
                "(MCF's lexical_weight); 0 leaves the row out"})
    embedding_model: str = field(default="all-minilm-l6-v2",
                                 metadata={"help": "dense baseline's embedding model"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass (hf)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    dtype: str = field(default="auto", metadata={"help": "auto, float32, bfloat16, float16"})

    def __post_init__(self) -> None:
        served = self.filter_endpoint is not None
        if served != (self.filter_model is not None):
            raise ConfigError("--filter-endpoint and --filter-model go together")
        if not served:
            from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME, AdapterError, find_adapter

            try:
                found = find_adapter(self.adapter or DEFAULT_FILTER_NAME)
            except AdapterError as err:
                raise ConfigError(f"--adapter: {err}") from None
            object.__setattr__(self, "adapter", str(found.path))
        if not 0 < self.threshold < 1:
            raise ConfigError(f"--threshold must be between 0 and 1, got {self.threshold}")
        if self.top_k < 1:
            raise ConfigError(f"--top-k must be >= 1, got {self.top_k}")
        if self.lexical_weight < 0:
            raise ConfigError(f"--lexical-weight must be >= 0, got {self.lexical_weight}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--dtype must be auto, float32, bfloat16 or float16, "
                              f"got {self.dtype!r}")


@dataclass(frozen=True)
class Selection:
    """The evaluated questions and how they were chosen."""

    examples: list[Example]
    rows: int
    excluded_training: int
    training_sources: tuple[str, ...]
    outside_id_list: int


# ----- which questions ---------------------------------------------------------------------


def adapter_metadata(config: FilterEvalConfig) -> dict[str, Any]:
    """The adapter's `sieverag_adapter.json` ({} without an adapter or metadata)."""
    if config.adapter is None:
        return {}
    from sieverag.inference.filters.adapters import read_card

    return read_card(config.adapter) or {}


@dataclass(frozen=True)
class TrainingQuestions:
    """The (source, question id) pairs that trained the filter, and where they were read."""

    pairs: frozenset[tuple[str, str]]
    sources: tuple[str, ...]


def training_questions(config: FilterEvalConfig, metadata: Mapping[str, Any]
                       ) -> TrainingQuestions:
    """The questions to leave out: the train splits of --exclude-training-questions, else the
    list in the adapter's card (it travels with a shipped or installed filter), else the train
    split of the dataset the card names."""
    from sieverag.training.data import question_ids

    def from_datasets(folders: Sequence[str]) -> TrainingQuestions:
        pairs = frozenset().union(*(question_ids(f, "train") for f in folders))
        return TrainingQuestions(pairs, tuple(folders))

    if config.exclude_training:
        return from_datasets(config.exclude_training)
    dataset = metadata.get("dataset") or {}
    if dataset.get("train_questions") is not None:
        return TrainingQuestions(frozenset(tuple(q) for q in dataset["train_questions"]),
                                 (f"{config.adapter}/{CARD_FILE}",))
    trained_on = dataset.get("path")
    if trained_on:
        if not Path(trained_on).exists():
            raise ConfigError(f"the adapter was trained on {trained_on}, which is gone: pass "
                              "--exclude-training-questions DATASET_DIR (its build-dataset "
                              "output) so training questions are left out")
        return from_datasets((trained_on,))
    if config.question_ids_file or config.allow_training_questions:
        return TrainingQuestions(frozenset(), ())
    raise ConfigError("cannot tell which questions trained the filter: pass "
                      "--exclude-training-questions DATASET_DIR, or --question-ids FILE, or "
                      "--allow-training-questions")


def select_examples(config: FilterEvalConfig, trained: TrainingQuestions) -> Selection:
    """The dataset's gold-marked rows minus training questions, within the id list, limited."""
    from sieverag.inference.eval.datasets import detect_format, load_examples

    examples = load_examples(config.dataset)
    fmt = detect_format(config.dataset)
    without_gold = [e.id for e in examples if not any(d.is_gold for d in e.documents)]
    if without_gold:
        raise DatasetError(f"{config.dataset}: eval-filter needs gold-marked passages "
                           f"(is_gold); question {without_gold[0]} has none")
    eligible = [e for e in examples if (fmt, e.id) not in trained.pairs]
    excluded = len(examples) - len(eligible)
    outside = 0
    if config.question_ids_file:
        wanted = _read_ids(Path(config.question_ids_file))
        listed = [e for e in eligible if e.id in wanted]
        outside = len(eligible) - len(listed)
        eligible = listed
    if config.limit is not None:
        eligible = eligible[:config.limit]
    if not eligible:
        raise DatasetError(f"{config.dataset}: no question left to evaluate ({len(examples)} "
                           f"rows, {excluded} used for training, {outside} outside the id list)")
    return Selection(eligible, len(examples), excluded, trained.sources, outside)


def _read_ids(path: Path) -> set[str]:
    if not path.is_file():
        raise ConfigError(f"--question-ids {path}: file not found")
    ids = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    return ids - {""}


# ----- metrics -----------------------------------------------------------------------------


def chunk_quality(examples: Sequence[Example], decisions: methods.ChunkDecisions
                  ) -> dict[str, float | None]:
    """Chunk-level figures of one method against the gold passages.

    precision / recall / f1: `filter_scores` per question, averaged over questions;
    micro_*: the same counts pooled over every passage of every question;
    kept_per_question: mean number of passages kept;
    auroc: area under the ROC curve of the method's score over all passages (gold = positive),
    average_precision: area under its precision–recall curve (None without a score).
    """
    per_question = []
    hits = kept_total = gold_total = 0
    for example in examples:
        kept = set(decisions.kept[example.id])
        gold = {d.id for d in example.documents if d.is_gold}
        scores = filter_scores(kept, gold)
        if scores is not None:
            per_question.append(scores)
        hits += len(kept & gold)
        kept_total += len(kept)
        gold_total += len(gold)
    result = _averaged(per_question)
    result.update(_micro(hits, kept_total, gold_total))
    result["kept_per_question"] = statistics.fmean(len(decisions.kept[e.id]) for e in examples)
    result.update(ranking_quality(examples, decisions.scores))
    return result


def ranking_quality(examples: Sequence[Example], scores: Mapping[str, float] | None
                    ) -> dict[str, float | None]:
    """AUROC and average precision of passage scores against gold (None when undefined)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    if scores is None:
        return {"auroc": None, "average_precision": None}
    labels = [bool(d.is_gold) for e in examples for d in e.documents]
    values = [scores[d.id] for e in examples for d in e.documents]
    if all(labels) or not any(labels):
        return {"auroc": None, "average_precision": None}
    return {"auroc": float(roc_auc_score(labels, values)),
            "average_precision": float(average_precision_score(labels, values))}


def sentence_quality(examples: Sequence[Example],
                     kept: Mapping[str, Iterable[tuple[str, int]]]) -> dict[str, float]:
    """Sentence-level figures: kept (passage id, sentence index) pairs against supporting facts.

    precision / recall / f1 per question (`filter_scores`), averaged over questions; micro_*
    pooled; kept_per_question: mean sentences kept.
    """
    per_question = []
    hits = kept_total = gold_total = 0
    sizes = []
    for example in examples:
        chosen = set(kept[example.id])
        gold = supporting_facts(example)
        scores = filter_scores(chosen, gold)
        if scores is not None:
            per_question.append(scores)
        hits += len(chosen & gold)
        kept_total += len(chosen)
        gold_total += len(gold)
        sizes.append(len(chosen))
    result = _averaged(per_question)
    result.update(_micro(hits, kept_total, gold_total))
    result["kept_per_question"] = statistics.fmean(sizes) if sizes else 0.0
    return result


def supporting_facts(example: Example) -> set[tuple[str, int]]:
    """The question's gold (passage id, sentence index) pairs."""
    return {(d.id, i) for d in example.documents for i in (d.supporting_sentences or ())}


def has_supporting_facts(example: Example) -> bool:
    """True when the row carries sentence-level gold and every passage has its sentences."""
    return (any(d.supporting_sentences for d in example.documents)
            and all(d.sentences for d in example.documents))


def _averaged(per_question: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    if not per_question:
        return {"precision": None, "recall": None, "f1": None}
    return {key: statistics.fmean(s[key] for s in per_question)
            for key in ("precision", "recall", "f1")}


def _micro(hits: int, kept: int, gold: int) -> dict[str, float]:
    precision = hits / kept if kept else 0.0
    recall = hits / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {"micro_precision": precision, "micro_recall": recall, "micro_f1": f1}


# ----- the run -----------------------------------------------------------------------------


class MethodCache:
    """One JSON file per method under OUT/cache, valid while its fingerprint matches."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get_or_compute(self, key: str, fingerprint: Mapping[str, Any],
                       compute: Callable[[], Any]) -> Any:
        digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
        path = self.folder / f"{key}.json"
        if path.is_file():
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                stored = {}
            if stored.get("fingerprint") == digest:
                return stored["value"]
        value = compute()
        write_atomic(path, json.dumps({"fingerprint": digest, "value": value}))
        return value


def run_filter_eval(config: FilterEvalConfig, *, progress: bool = True,
                    command: str | None = None) -> dict[str, Any]:
    """Evaluate the filter and the baselines; write report.json, report.md and the plot."""
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
    from sieverag.inference.llm.models import resolve_model
    from sieverag.training.filter_report import write_report

    metadata = adapter_metadata(config)
    base_model = config.base_model or metadata.get("base_model") or DEFAULT_MODEL
    base_path = resolve_model(base_model)
    if config.adapter is not None:
        check_card(config.adapter, base_path)
    selection = select_examples(config, training_questions(config, metadata))
    examples = selection.examples
    question_key = sorted(e.id for e in examples)
    out = Path(config.out)
    cache = MethodCache(out / "cache")

    filter_backend, filter_identity = _filter_backend(config, base_model, str(base_path))
    filter_scores_by_id = cache.get_or_compute(
        "filter-chunks", {"filter": filter_identity, "questions": question_key},
        lambda: methods.filter_chunk_scores(filter_backend, examples, progress=progress))
    judge_state = cache.get_or_compute(
        "judge", {"base": str(base_path), "n": config.judge_n, "questions": question_key,
                  "dtype": config.dtype},
        lambda: _judge_state(HFBackend(HFBackendConfig(
            model=str(base_path), dtype=config.dtype, device=config.device,
            batch_size=config.batch_size)), examples, config.judge_n, progress))
    bm25 = methods.bm25_scores(examples)
    decisions = [
        methods.threshold_decisions(FILTER, examples, filter_scores_by_id, config.threshold),
        # The same scores under the two other chunk rules MCF offers: the k best per question
        # (the baselines' budget) and the adaptive bar on the log-odds (mean − n·σ, n = judge_n).
        methods.top_k_decisions(filter_top_k(config.top_k), examples, filter_scores_by_id,
                                config.top_k),
        methods.adaptive_decisions(FILTER_ADAPTIVE, examples, filter_scores_by_id,
                                   config.judge_n),
    ]
    if config.lexical_weight > 0:
        # MCF with its lexical prior (mcf.lexical_weight), at the baselines' budget.
        decisions.append(methods.top_k_decisions(
            filter_with_prior(config.top_k), examples,
            methods.prior_fused_scores(examples, filter_scores_by_id, bm25,
                                       config.lexical_weight), config.top_k))
    decisions += [
        methods.ChunkDecisions(JUDGE, {k: tuple(v) for k, v in judge_state["kept"].items()},
                               judge_state["scores"]),
        methods.top_k_decisions(f"BM25 top-{config.top_k}", examples, bm25, config.top_k),
        methods.top_k_decisions(
            f"dense top-{config.top_k}", examples,
            methods.dense_scores(examples, config.embedding_model, config.device), config.top_k),
        methods.keep_all(examples),
    ]
    chunk = {d.method: chunk_quality(examples, d) for d in decisions}

    with_facts = [e for e in examples if has_supporting_facts(e)]
    sentence: dict[str, dict[str, float]] = {}
    parse = {"answers": 0, "unparsed": 0}
    if with_facts:
        sentence, parse = _sentence_level(config, cache, filter_backend, filter_identity,
                                          with_facts, decisions, progress)

    report = {
        "command": command,
        "config": asdict(config),
        "filter": {"adapter": config.adapter, "name": metadata.get("name"),
                   "served_as": config.filter_model, "base_model": base_model,
                   "threshold": config.threshold},
        "questions": {"evaluated": len(examples), "rows_in_dataset": selection.rows,
                      "excluded_as_training": selection.excluded_training,
                      "training_datasets": list(selection.training_sources),
                      "outside_id_list": selection.outside_id_list,
                      "with_supporting_facts": len(with_facts)},
        "passages": {"total": sum(len(e.documents) for e in examples),
                     "gold": sum(d.is_gold is True for e in examples for d in e.documents)},
        "chunk": chunk,
        "sentence": sentence,
        "sentence_answers": parse,
        "comparison": _comparison(chunk, config.top_k),
    }
    write_report(report, decisions, examples, out)
    return report


def _filter_backend(config: FilterEvalConfig, base_model: str, base_path: str
                    ) -> tuple[Any, dict[str, Any]]:
    """The filter's backend and what identifies its answers (for the cache)."""
    from sieverag.inference.llm.registry import BackendSpec, build_backend

    if config.filter_endpoint:
        spec = BackendSpec(kind="openai", model=config.filter_model or "",
                           endpoint=config.filter_endpoint, api_key_env=config.api_key_env,
                           chat_template_model=base_path)
        return build_backend(spec), {"endpoint": config.filter_endpoint,
                                     "model": config.filter_model}
    from sieverag.inference.filters.adapters import adapter_content_hash

    spec = BackendSpec(kind="hf", model=base_path, dtype=config.dtype, device=config.device,
                       batch_size=config.batch_size, adapter=config.adapter)
    return build_backend(spec), {"base": base_model, "dtype": config.dtype,
                                 "adapter": adapter_content_hash(config.adapter or "")}


def _judge_state(backend: Any, examples: Sequence[Example], bar_n: float,
                 progress: bool) -> dict[str, Any]:
    decisions = methods.judge_decisions(backend, examples, bar_n, progress=progress)
    return {"kept": {k: list(v) for k, v in decisions.kept.items()},
            "scores": decisions.scores}


def _sentence_level(config: FilterEvalConfig, cache: MethodCache, backend: Any,
                    identity: Mapping[str, Any], examples: Sequence[Example],
                    decisions: Sequence[methods.ChunkDecisions], progress: bool
                    ) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Sentence-level rows: filter end to end, baselines (whole passages), oracle rows."""
    by_method = {d.method: d for d in decisions}
    rules = [m for m in by_method if m.startswith(FILTER)]
    filter_kept = {e.id: set().union(*(by_method[m].kept[e.id] for m in rules))
                   for e in examples}
    # The sentence stage runs on every passage some filter rule kept or that is gold (the
    # oracle rows need the latter); answers are cached per passage.
    items = [(e, d) for e in examples for d in e.documents
             if d.id in filter_kept[e.id] or d.is_gold]
    answers = cache.get_or_compute(
        "filter-sentences", {"filter": identity, "passages": sorted(d.id for _, d in items)},
        lambda: {pid: asdict(a) for pid, a in
                 methods.filter_sentences(backend, items, progress=progress).items()})

    def whole(example: Example, kept_ids: Iterable[str]) -> set[tuple[str, int]]:
        wanted = set(kept_ids)
        return {(d.id, i) for d in example.documents if d.id in wanted
                for i in range(len(d.sentences or ()))}

    def stage(example: Example, kept_ids: Iterable[str]) -> set[tuple[str, int]]:
        wanted = set(kept_ids)
        return {(d.id, i) for d in example.documents if d.id in wanted
                for i in answers[d.id]["kept"]}

    gold_ids = {e.id: [d.id for d in e.documents if d.is_gold] for e in examples}
    rows = {}
    for method, decision in by_method.items():
        if method in rules:
            rows[f"{method} (chunk → sentence)"] = {e.id: stage(e, decision.kept[e.id])
                                                    for e in examples}
        else:
            rows[f"{method} (whole passages)"] = {e.id: whole(e, decision.kept[e.id])
                                                  for e in examples}
    rows[ORACLE_ALL] = {e.id: whole(e, gold_ids[e.id]) for e in examples}
    rows[ORACLE_FILTER] = {e.id: stage(e, gold_ids[e.id]) for e in examples}
    used = {d.id for _, d in items}
    parse = {"answers": len(used),
             "unparsed": sum(not answers[pid]["parsed"] for pid in used)}
    return {name: sentence_quality(examples, kept) for name, kept in rows.items()}, parse


def filter_top_k(k: int) -> str:
    return f"{FILTER} top-{k}"


def filter_with_prior(k: int) -> str:
    return f"{FILTER} + BM25 prior top-{k}"


def _comparison(chunk: Mapping[str, Mapping[str, float | None]], top_k: int
                ) -> dict[str, dict[str, float | None]]:
    """For each chunk rule of the trained filter: its chunk F1 minus each baseline's."""
    baselines = (JUDGE, f"BM25 top-{top_k}", f"dense top-{top_k}", KEEP_ALL)
    result: dict[str, dict[str, float | None]] = {}
    rules = [r for r in (FILTER, filter_top_k(top_k), FILTER_ADAPTIVE, filter_with_prior(top_k))
             if r in chunk]
    for rule in rules:
        mine = chunk[rule]["f1"]
        result[rule] = {
            f"f1_minus_{method}": (None if mine is None or chunk[method]["f1"] is None
                                   else mine - chunk[method]["f1"])
            for method in baselines}
    return result
