"""Which chat template a model's prompts are rendered with: one rule for every consumer.

A model's prompts use its tokenizer's own chat template. A base model whose tokenizer has
none (Meta-Llama-3-8B, Qwen2.5-7B base) gets sieverag's named fallback, `sieverag-plain`
(`inference/prompts/chat_templates/sieverag-plain.jinja`), set on the tokenizer when it is
loaded (`load_tokenizer`), so training, MCF's scoring, the embedded server and the openai
backend's `chat_template_model` all render the same text; `sieverag serve --engine vllm`
passes the same file as vLLM's `--chat-template`. A trained filter's card records which
template it learned (`template_identity`) and `card_file.check_card` refuses a model whose
template is another.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

TOKENIZER_TEMPLATE = "tokenizer"
"""The name recorded for a tokenizer's own chat template."""
FALLBACK_TEMPLATE = "sieverag-plain"
CHAT_TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "prompts" / "chat_templates"
# Where a saved tokenizer keeps its own template (else tokenizer_config.json's key).
OWN_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")
CARD_KEY = "chat_template"  # a filter card's {"name", "sha256"} of the template it learned


def fallback_template_file(name: str = FALLBACK_TEMPLATE) -> Path:
    """The file of sieverag's named chat template `name` (vLLM's `--chat-template` reads it)."""
    path = CHAT_TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CHAT_TEMPLATES_DIR.glob("*.jinja")))
        raise ValueError(f"no chat template named {name!r} (sieverag's: {known})")
    return path


@functools.cache
def fallback_template(name: str = FALLBACK_TEMPLATE) -> str:
    """The text of sieverag's named chat template `name`."""
    return fallback_template_file(name).read_text(encoding="utf-8")


def use_chat_template(tokenizer: Any) -> str:
    """Give `tokenizer` the chat template its prompts are rendered with (its own, else
    `FALLBACK_TEMPLATE`) and return that template's name."""
    if tokenizer.chat_template and tokenizer.chat_template != fallback_template():
        return TOKENIZER_TEMPLATE
    tokenizer.chat_template = fallback_template()
    return FALLBACK_TEMPLATE


def template_identity(tokenizer: Any) -> dict[str, str]:
    """{"name", "sha256"} of the chat template `tokenizer` renders with (after
    `use_chat_template`): what a filter card records and `check_card` compares."""
    name = use_chat_template(tokenizer)
    text = tokenizer.chat_template
    if not isinstance(text, str):  # a tokenizer with several named templates
        text = repr(sorted(dict(text).items()))
    return {"name": name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def load_tokenizer(folder: str | Path, **kwargs: Any) -> Any:
    """A model folder's tokenizer (local files only) with the chat template its prompts are
    rendered with (`use_chat_template`). Every place sieverag loads a tokenizer calls this."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    use_chat_template(tokenizer)
    return tokenizer


def has_own_template(folder: str | Path) -> bool:
    """Whether the model folder's tokenizer brings a chat template of its own (in any of the
    files transformers reads one from)."""
    folder = Path(folder)
    if any((folder / name).exists() for name in OWN_TEMPLATE_FILES):
        return True
    config = folder / "tokenizer_config.json"
    return config.is_file() and bool(
        json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


@functools.cache
def model_template_identity(folder: str) -> dict[str, str]:
    """`template_identity` of the model folder's tokenizer (loaded once per process)."""
    return template_identity(load_tokenizer(folder))
