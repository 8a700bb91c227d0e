"""The prompt templates data_gen uses besides the filter's own (which live in `inference`)."""

from __future__ import annotations

import functools
from pathlib import Path

from inference.errors import ConfigError
from inference.prompt_templates import PromptTemplate, parse_template

PROMPTS_DIR = Path(__file__).parent / "prompts"


@functools.cache
def load_data_gen_template(name: str) -> PromptTemplate:
    """Load `data_gen/prompts/<name>.yaml`."""
    path = PROMPTS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no prompt template {name!r} in {PROMPTS_DIR}")
    return parse_template(path)
