"""Prompt templates: typed YAML files in `inference/prompts/`, never strings buried in code.

A template file has `name`, `inputs` (the field names it needs), `system` and `user`
(`{field}` placeholders). Rendering checks the inputs given are exactly the declared ones.

A rendered message's text is a `TemplateText`: a plain string that also remembers its
template and input values, so that the backends' context guard (inference/llm/context_guard.py)
can render it again with shorter documents when a prompt does not fit the model's context.
Which inputs may be cut is fixed by their names, `CUT_ORDER`: the retrieved text first, then
the memory notes; never the question, the instruction or any other input. (A name, not a
key in the YAML file: the shipped filter's card pins its templates' bytes.)
"""

from __future__ import annotations

import functools
import hashlib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Conversation

PROMPTS_DIR = Path(__file__).parents[1] / "prompts"

# The inputs a prompt too long for its model may lose text from, group by group: all of the
# first group's (retrieved text), and only then the memory notes.
CUT_ORDER: tuple[frozenset[str], ...] = (
    frozenset({"documents", "document", "evidence", "context", "chunk", "sentences"}),
    frozenset({"memory"}),
)


class TemplateText(str):
    """A message's text rendered from a template: equal to `template.format(**values)` in
    every way a string is, and able to render itself again with some values changed."""

    template: str
    values: dict[str, Any]

    def __new__(cls, template: str, values: Mapping[str, Any]) -> TemplateText:
        used = {name: values[name] for name in _placeholders(template)}
        text = super().__new__(cls, template.format(**used))
        text.template, text.values = template, used
        return text

    def with_values(self, **changes: str) -> TemplateText:
        """The same template rendered with `changes` laid over its values."""
        return TemplateText(self.template, {**self.values, **changes})

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as what makes it, not as a bare str
        return TemplateText, (self.template, self.values)


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
            conversation.append({"role": "system", "content": TemplateText(self.system, values)})
        conversation.append({"role": "user", "content": TemplateText(self.user, values)})
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
