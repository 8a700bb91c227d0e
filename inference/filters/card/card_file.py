"""The filter's card as a file: `sieverag_adapter.json` beside a LoRA adapter, read, checked
against the model and prompts in use, and written (whole by `sieverag filter package`, a
fitted section at a time by `sieverag filter fit-combination` and the end of `sieverag train`).

Before an adapter is loaded onto a base model, `check_card` compares its card with that model
(sha256 of the weights) and with the filter prompt templates in use (sha256 of each file): a
filter is only meaningful on the weights and prompts it was trained with, and a mismatch is
refused with one error naming both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sieverag.inference.core.io_utils import parse_json, read_text, write_json_atomic
from sieverag.inference.filters.adapter_files import (
    AdapterError,
    read_json_object,
    weights_sha256,
)
from sieverag.inference.filters.filter_format import FORMAT_KEY, card_format

CARD_FILE = "sieverag_adapter.json"
CARD_FORMAT = "sieverag-filter-card/1"
# Card keys that `check_card` compares with the model and prompts in use.
BASE_SHA_KEY = "base_model_sha256"
TEMPLATES_KEY = "prompt_templates"
# Keys of a training run's metadata that describe how the adapter was made, kept in the card;
# with the combination `sieverag train` fitted (the bf16 weights' P(Yes) is checked to stay
# within `max_p_yes_diff` of the trained ones it was fitted on).
CARRIED_KEYS = ("recipe", "metrics", "versions", "combination")
# eval-filter's chunk-level figures kept per method in the card.
HELD_OUT_FIGURES = ("precision", "recall", "f1", "auroc", "ece", "kept_per_question")
_REPORT_ADVICE = "give the --out folder of `sieverag eval-filter`"


# ----- reading and checking --------------------------------------------------------------


def read_card(folder: str | Path) -> dict[str, Any] | None:
    """The adapter's card (`sieverag_adapter.json`), or None when it has none."""
    path = Path(folder) / CARD_FILE
    return read_json_object(path) if path.is_file() else None


def filter_template_hashes(filter_format: str | None = None) -> dict[str, str]:
    """sha256 of each filter prompt template file in use, by template name: those of one
    filter format (`filter_format.FORMAT_TEMPLATES`), or of every format (None)."""
    from sieverag.inference.core.prompt_templates import load_template
    from sieverag.inference.filters.filter_format import FORMAT_TEMPLATES

    names = ([n for names in FORMAT_TEMPLATES.values() for n in names] if filter_format is None
             else FORMAT_TEMPLATES[filter_format])
    return {name: load_template(name).sha256 for name in names}


def check_card(folder: str | Path, base_model_dir: str | Path) -> None:
    """Refuse an adapter whose card names other base weights or other filter prompts than
    the ones in use, with one error naming both. An adapter without a card is not checked."""
    card = read_card(folder)
    if card is None:
        return
    trained_on = card.get(BASE_SHA_KEY)
    if trained_on:
        in_use = weights_sha256(base_model_dir)
        if in_use != trained_on:
            raise AdapterError(
                f"filter adapter {folder} was trained on base model "
                f"{card.get('base_model', '?')} (weights sha256 {trained_on[:16]}…), but the "
                f"model in use, {base_model_dir}, has weights sha256 {in_use[:16]}…: run it "
                f"on {card.get('base_model', '<its base model>')} (--models.filter.model), or "
                "use a filter trained on this model")
    check_chat_template(folder, card, base_model_dir)
    check_prompts(folder, card)


def check_chat_template(folder: str | Path, card: dict[str, Any],
                        base_model_dir: str | Path) -> None:
    """Refuse an adapter whose card names another chat template than the one the model in
    use renders prompts with (its tokenizer's own, else sieverag's fallback)."""
    from sieverag.inference.llm.chat_template import CARD_KEY, model_template_identity

    trained_with = card.get(CARD_KEY)
    if not trained_with:
        return
    in_use = model_template_identity(str(Path(base_model_dir).resolve()))
    if in_use != trained_with:
        raise AdapterError(
            f"filter adapter {folder} was trained with the chat template "
            f"{trained_with.get('name')} (sha256 {str(trained_with.get('sha256'))[:16]}…), but "
            f"the model in use, {base_model_dir}, renders prompts with {in_use['name']} (sha256 "
            f"{in_use['sha256'][:16]}…): the filter reads its verdicts after the template it "
            "learned; use that model's tokenizer or retrain the filter")


def check_prompts(folder: str | Path, card: dict[str, Any]) -> None:
    """Refuse an adapter whose card names other filter prompt templates than the ones in use."""
    in_use = filter_template_hashes()
    for name, trained_sha in (card.get(TEMPLATES_KEY) or {}).items():
        current = in_use.get(name)
        if current != trained_sha:
            raise AdapterError(
                f"filter adapter {folder} was trained with the prompt template {name} "
                f"(sha256 {str(trained_sha)[:16]}…), but the template in use has sha256 "
                f"{str(current)[:16]}…: the filter only works with the prompts it learned; "
                "restore that template or retrain the filter")


# ----- writing -----------------------------------------------------------------------------


def write_card(folder: str | Path, card: Mapping[str, Any]) -> Path:
    """Write `card` as the card of the adapter folder `folder` (atomically: a temp file, then
    renamed); returns the card's path."""
    path = Path(folder) / CARD_FILE
    write_json_atomic(path, dict(card))
    return path


def packaged_card(metadata: Mapping[str, Any], *, name: str, hub_name: str, base_sha: str,
                  templates: Mapping[str, str], dataset: Mapping[str, Any],
                  weights: Mapping[str, Any], held_out: Mapping[str, Any] | None
                  ) -> dict[str, Any]:
    """The card `sieverag filter package` writes for the training run whose card is
    `metadata`: the base model and the sha256 of its weights, the filter prompt templates'
    sha256, the run's `CARRIED_KEYS`, its dataset record, the packaged `weights` (dtype, bytes,
    digest, the P(Yes) check) and the `held_out` figures (`held_out_quality`; None: none),
    the training machine's absolute paths reduced to their last part."""
    return {
        "format": CARD_FORMAT,
        "name": name,
        "trained_as": metadata.get("name"),
        "base_model": metadata["base_model"],
        "base_model_hub_name": hub_name,
        BASE_SHA_KEY: base_sha,
        TEMPLATES_KEY: dict(templates),
        FORMAT_KEY: card_format(metadata),
        **{key: _portable(metadata[key]) for key in CARRIED_KEYS if key in metadata},
        "dataset": _portable(dict(dataset)),
        "weights": dict(weights),
        "held_out": None if held_out is None else dict(held_out),
    }


def _portable(value: Any) -> Any:
    """`value` with the training machine's absolute paths reduced to their last part."""
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, str) and value.startswith("/") and Path(value).is_absolute():
        return Path(value).name
    return value


def held_out_quality(eval_dir: str | Path) -> dict[str, Any]:
    """The chunk-level figures of an `eval-filter` report (report.json), for the card."""
    path = Path(eval_dir) / "report.json"
    if not path.is_file():
        raise AdapterError(f"{path} not found: {_REPORT_ADVICE}")
    report = parse_json(read_text(path, AdapterError), str(path), _REPORT_ADVICE,
                        error=AdapterError)
    if not (isinstance(report, dict) and isinstance(report.get("chunk"), dict)
            and isinstance(report.get("questions"), dict)):
        raise AdapterError(f"{path} is not an eval-filter report (no chunk and questions "
                           f"sections): {_REPORT_ADVICE}")
    chunk, questions = report["chunk"], report["questions"]
    return {
        "dataset": Path(str(report.get("config", {}).get("dataset", ""))).name,
        "questions": questions.get("evaluated"),
        "training_questions_left_out": questions.get("excluded_as_training"),
        "passages": report.get("passages"),
        # The row of the MCF rule amber runs by default (e.g. "MCF top_k=2 + BM25 prior w=1").
        "amber_default_row": (report.get("filter") or {}).get("amber_default_row"),
        "chunk": {method: {k: figures.get(k) for k in HELD_OUT_FIGURES if k in figures}
                  for method, figures in chunk.items()},
        "sentence": {method: figures.get("f1") for method, figures in
                     (report.get("sentence") or {}).items()},
        # Every evaluated dataset's line (filter vs BM25 / dense AUROC, F1s), when several.
        "by_dataset": report.get("by_dataset") if len(report.get("datasets") or {}) > 1
        else None,
    }
