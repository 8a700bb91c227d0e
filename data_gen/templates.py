"""The prompt templates data_gen uses besides the filter's own (which live in `inference`)."""

from __future__ import annotations

from pathlib import Path

from sieverag.inference.core.prompt_templates import PromptTemplate, load_template

PROMPTS_DIR = Path(__file__).parent / "prompts"


def load_data_gen_template(name: str) -> PromptTemplate:
    """Load `data_gen/prompts/<name>.yaml`."""
    return load_template(name, PROMPTS_DIR)
