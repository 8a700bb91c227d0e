"""`sieverag filter package RUN_DIR`: a training output folder → a shippable filter adapter.

The packaged folder holds exactly the three adapter files (`ADAPTER_FILES`), nothing else
(no checkpoints, no optimizer state):

* `adapter_model.safetensors` — the LoRA weights in bfloat16 (half the size). Before the
  folder is written, the bf16 adapter and the adapter as trained score the same validation
  passages on the training device (cuda:0 where there is a GPU, else the CPU) over one copy
  of the base in the training precision (the recipe's: bf16 for the GPU recipes, so an 8B
  base is never copied to float32), and the largest difference in P(Yes) must stay within
  `max_p_yes_diff` (default 1e-2); the figure, the tolerance, the device and the precision go
  into the card.
* `adapter_config.json` — PEFT's config, `base_model_name_or_path` the base model's public
  name rather than the training machine's folder.
* `sieverag_adapter.json` — the card: base model and the sha256 of its weights, the sha256
  of each filter prompt template, the training data (fingerprint, sources, record counts,
  the training questions), the recipe, the training metrics, the combination `sieverag train`
  fitted (when it did), the weights check, and the held-out quality from an `eval-filter`
  report when one is given (`card.card_file.packaged_card` says what it holds).

The next retrained filter replaces the shipped one the same way:
`sieverag filter package runs/filter-smollm2-cpu --eval-filter runs/eval-filter
--out inference/filters/shipped/smollm2-filter`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import (
    atomic_directory,
    parse_json,
    write_json_atomic,
)
from sieverag.inference.core.types import Device, DType, check_device_present
from sieverag.inference.filters.adapter_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    adapter_content_hash,
    read_adapter_config,
    weights_sha256,
)
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, check_adapter_files
from sieverag.inference.filters.card.card_file import (
    BASE_SHA_KEY,
    CARD_FILE,
    TEMPLATES_KEY,
    filter_template_hashes,
    held_out_quality,
    packaged_card,
    read_card,
    write_card,
)
from sieverag.inference.filters.filter_format import card_format

_SPLIT_ADVICE = "is it a folder written by `sieverag build-dataset`?"


@dataclass(frozen=True)
class PackagedFilter:
    """What `package_filter` wrote and measured."""

    folder: Path
    weights_bytes: int
    passages_checked: int
    max_p_yes_diff: float
    check_device: str = "cpu"  # where the check ran: cuda:0 or cpu
    check_dtype: str = "float32"  # the base's precision in the check: the training precision


def package_filter(run_dir: str | Path, out: str | Path, *, name: str = DEFAULT_FILTER_NAME,
                   eval_dir: str | Path | None = None, check_passages: int = 200,
                   max_p_yes_diff: float = 1e-2) -> PackagedFilter:
    """Write the shippable adapter of the training output `run_dir` to `out` (replacing it
    whole, or leaving it as it was when any check fails)."""
    import torch
    from safetensors.torch import load_file, save_file

    from sieverag.inference.llm.model_resolution import EMBEDDED_MODELS, resolve_model

    run_dir, out = Path(run_dir), Path(out)
    check_adapter_files(run_dir)
    metadata = read_card(run_dir)
    if metadata is None or "base_model" not in metadata:
        raise AdapterError(f"{run_dir} has no {CARD_FILE} naming its base model: give the "
                           "output folder of a training run (`-m sieverag.training.sft`)")
    base_model = metadata["base_model"]
    base_dir = resolve_model(base_model)
    base_sha = weights_sha256(base_dir)
    _same(run_dir, "base model weights sha256", metadata.get(BASE_SHA_KEY), base_sha)
    templates = filter_template_hashes(card_format(metadata))
    for template, sha in templates.items():
        _same(run_dir, f"prompt template {template} sha256",
              (metadata.get(TEMPLATES_KEY) or {}).get(template), sha)
    embedded = EMBEDDED_MODELS.get(base_model)
    hub_name = embedded.hub_name if embedded else metadata.get("base_model_hub_name") or base_model
    passages = validation_prompts(metadata, check_passages)
    dtype, device = training_dtype(metadata), check_device_present("auto")
    dataset = with_training_questions(metadata.get("dataset") or {})
    held_out = held_out_quality(eval_dir) if eval_dir is not None else None

    with atomic_directory(out) as staging:
        tensors = load_file(run_dir / WEIGHTS_FILE)
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
                  staging / WEIGHTS_FILE, metadata={"format": "pt"})
        config = read_adapter_config(run_dir)
        config["base_model_name_or_path"] = hub_name
        write_json_atomic(staging / CONFIG_FILE, config)
        diff = max_p_yes_difference(str(base_dir), run_dir, staging, passages, dtype=dtype,
                                    device=device)
        if diff > max_p_yes_diff:
            raise AdapterError(f"the bf16 weights of {run_dir} move P(Yes) by up to {diff:.4f} "
                               f"on {len(passages)} passages ({dtype} base on {device}; "
                               f"allowed {max_p_yes_diff}): ship this filter in its training "
                               "precision or retrain it")
        weights = {"dtype": "bfloat16", "bytes": (staging / WEIGHTS_FILE).stat().st_size,
                   "content_sha256": adapter_content_hash(staging),
                   "p_yes_check": {"passages": len(passages),
                                   "max_abs_diff_vs_trained": round(diff, 6),
                                   "tolerance": max_p_yes_diff,
                                   "base_dtype": dtype, "device": device}}
        write_card(staging, packaged_card(metadata, name=name, hub_name=hub_name,
                                          base_sha=base_sha, templates=templates,
                                          dataset=dataset, weights=weights, held_out=held_out))
    return PackagedFilter(out, (out / WEIGHTS_FILE).stat().st_size, len(passages), diff,
                          device, dtype)


def _same(run_dir: Path, what: str, recorded: str | None, current: str) -> None:
    """A run that recorded a hash must still match it (runs from before cards recorded none)."""
    if recorded is not None and recorded != current:
        raise AdapterError(f"{run_dir} was trained with {what} {recorded[:16]}…, but the one in "
                           f"use now is {current[:16]}…: package it where it was trained, or "
                           "retrain it")


def with_training_questions(dataset: dict[str, Any]) -> dict[str, Any]:
    """The run's dataset record with its training questions and sources, read from the
    build-dataset folder's train.jsonl when the run did not record them (runs from before
    cards did not), so an evaluation anywhere can leave them out."""
    if "train_questions" in dataset:
        return dataset
    path = Path(str(dataset.get("path", ""))) / "train.jsonl"
    if not path.is_file():
        raise AdapterError(f"the run records no training questions and {path} is gone: package "
                           "the run where its build-dataset folder is")
    questions: set[tuple[str, str]] = set()
    sources: dict[str, int] = {}
    for record in _split_records(path, ("source", "question_id")):
        questions.add((record["source"], record["question_id"]))
        sources[record["source"]] = sources.get(record["source"], 0) + 1
    return {**dataset, "sources": {"train": sources},
            "train_questions": sorted(map(list, questions))}


def _split_records(path: Path, keys: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The records of a build-dataset split file, in order, each a JSON object holding `keys`;
    a line that is not is one `DatasetError` naming the file and the line."""
    try:
        handle = path.open("rb")
    except OSError as err:
        raise DatasetError(f"{path}: cannot be read ({err.strerror})") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            record = parse_json(line, where, _SPLIT_ADVICE)
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: is not a JSON object; {_SPLIT_ADVICE}")
            missing = [k for k in keys if k not in record]
            if missing:
                raise DatasetError(f"{where}: not a build-dataset record (no "
                                   f"{', '.join(map(repr, missing))}); {_SPLIT_ADVICE}")
            yield record


def validation_prompts(metadata: dict[str, Any], limit: int) -> list[list[dict[str, str]]]:
    """Chunk (or one-pass passage) prompts from the run's validation split (else its train
    split) for the bf16-vs-float32 check: the passages the filter is meant to judge."""
    folder = Path(str((metadata.get("dataset") or {}).get("path", "")))
    for split in ("validation", "train"):
        path = folder / f"{split}.jsonl"
        if path.is_file():
            prompts = []
            for record in _split_records(path, ("task", "prompt")):
                if record["task"] in ("chunk", "passage"):
                    prompts.append(record["prompt"])
                if len(prompts) == limit:
                    break
            if prompts:
                return prompts
    raise AdapterError(f"cannot find the run's training data ({folder}/validation.jsonl) for "
                       "the bf16 check: package the run where its build-dataset folder is")


def training_dtype(metadata: dict[str, Any]) -> str:
    """The precision the run trained its base in: the recipe's model `dtype` where it names
    one, else bfloat16 or float16 where the recipe trained in it (`bf16`, `fp16`), else
    float32 (a run that recorded no recipe)."""
    recipe = metadata.get("recipe") or {}
    dtype = (recipe.get("model") or {}).get("dtype")
    if dtype in ("float32", "bfloat16", "float16"):
        return dtype
    training = recipe.get("training") or {}
    return "bfloat16" if training.get("bf16") else "float16" if training.get("fp16") else \
        "float32"


def max_p_yes_difference(base_dir: str, reference: Path, candidate: Path,
                         prompts: Sequence[list[dict[str, str]]], *,
                         dtype: DType = "float32", device: Device = "cpu") -> float:
    """The largest |P(Yes)| difference between two adapters of one base over `prompts`, at
    every verdict each prompt asks for (a one-pass prompt's sentences too), both over one
    copy of the base loaded in `dtype` on `device` (the two adapters share it by name)."""
    from sieverag.inference.filters.filter_format import (
        CHUNK_LABELS,
        p_relevant,
        relevance_log_odds,
    )
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    def p_yes(adapter: Path) -> list[float]:
        backend = HFBackend(HFBackendConfig(model=base_dir, dtype=dtype, device=device,
                                            adapter=str(adapter), prompt_cache_tokens=0))
        reads = backend.marked_label_logprobs(prompts, CHUNK_LABELS, agent="filter_chunk")
        return [p_relevant(relevance_log_odds(s)) for read in reads for s in read]

    return max(abs(a - b) for a, b in zip(p_yes(reference), p_yes(candidate), strict=True))
