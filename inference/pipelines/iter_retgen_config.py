"""The typed settings of the `iter-retgen` pipeline (run config section `iter_retgen`)."""

from __future__ import annotations

from dataclasses import field

from sieverag.inference.errors import ConfigError
from sieverag.inference.settings import settings


@settings
class IterRetGenConfig:
    """Documents per iteration and iterations (reading budget = k x iterations)."""

    k: int = field(default=3, metadata={"help": "documents retrieved per iteration"})
    iterations: int = field(default=2, metadata={"help": "retrieve-generate iterations"})

    def __post_init__(self) -> None:
        if self.k < 1 or self.iterations < 1:
            raise ConfigError(f"iter_retgen.k and iter_retgen.iterations must be >= 1, got "
                              f"{self.k} and {self.iterations}")
