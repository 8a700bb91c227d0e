"""Prompt templates: typed YAML files in `inference/prompts/`, never strings buried in code.

A template file has `name`, `inputs` (the field names it needs), `system` and `user`
(`{field}` placeholders). Rendering checks the inputs given are exactly the declared ones.
"""

from __future__ import annotations

import functools
import hashlib
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from sieverag.inference.errors import ConfigError
from sieverag.inference.types import Conversation

PROMPTS_DIR = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class PromptTemplate:
    """A chat prompt with declared inputs; `sha256` identifies its exact text in run configs."""

    name: str
    inputs: tuple[str, ...]
    system: str
    user: str
    sha256: str

    def messages(self, **values: str) -> Conversation:
        """Render to chat messages; every declared input must be given, and nothing else."""
        missing = set(self.inputs) - values.keys()
        unknown = values.keys() - set(self.inputs)
        if missing or unknown:
            raise ValueError(f"prompt {self.name!r}: missing inputs {sorted(missing)}, "
                             f"unknown inputs {sorted(unknown)}")
        conversation: Conversation = []
        if self.system:
            conversation.append({"role": "system", "content": self.system.format(**values)})
        conversation.append({"role": "user", "content": self.user.format(**values)})
        return conversation


def _placeholders(text: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(text) if field}


def parse_template(path: Path) -> PromptTemplate:
    """Read and validate one template file."""
    raw = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"prompt template {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"prompt template {path} must be a mapping")
    expected = {"name", "inputs", "system", "user"}
    if set(data) != expected:
        raise ConfigError(f"prompt template {path} must have exactly the keys {sorted(expected)}, "
                          f"got {sorted(data)}")
    inputs = tuple(data["inputs"] or ())
    used = _placeholders(data["system"] or "") | _placeholders(data["user"])
    if used != set(inputs):
        raise ConfigError(f"prompt template {path}: placeholders {sorted(used)} do not match "
                          f"declared inputs {sorted(inputs)}")
    return PromptTemplate(name=data["name"], inputs=inputs,
                          system=(data["system"] or "").strip(), user=data["user"].strip(),
                          sha256=hashlib.sha256(raw.encode()).hexdigest())


@functools.cache
def load_template(name: str, directory: Path = PROMPTS_DIR) -> PromptTemplate:
    """Load `<directory>/<name>.yaml` (default: `inference/prompts/`)."""
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
        raise ConfigError(f"no prompt template {name!r} in {directory} (known: {known})")
    return parse_template(path)
