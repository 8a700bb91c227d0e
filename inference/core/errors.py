"""User-facing errors: the CLI prints their message as one line and exits non-zero.

`validation_problems` words a pydantic validation error for such a message, one
"dotted.key: reason" per problem, for configs and stored records alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

# pydantic's error types for a key the model does not have (models / dataclasses), a missing one.
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")
_MISSING_KEY = ("missing", "missing_argument")


class SieveragError(Exception):
    """An error the user can fix; the message names the input and what to do."""


class DatasetError(SieveragError):
    """A dataset or corpus file is missing, malformed, or holds an unusable record."""


class ConfigError(SieveragError):
    """A configuration value or key is invalid."""


class ModelNotFoundError(SieveragError):
    """A model name is neither an embedded model nor a local model folder."""


class BackendUnavailableError(SieveragError):
    """An LLM server cannot be reached or keeps failing."""


class ContextError(SieveragError):
    """A prompt does not fit the model's context (and may not, or cannot, be cut to fit)."""


def validation_problems(err: ValidationError, unknown: str = "unknown key",
                        missing: str = "missing key", positional: Sequence[str] = ()) -> str:
    """Each problem of `err` as "dotted.key: reason", joined by "; " (`unknown` and `missing`
    word a key the model does not have and one it needs; `positional` names arguments
    pydantic reports by index)."""
    problems = []
    for error in err.errors():
        loc = list(error["loc"])
        if loc and isinstance(loc[0], int) and loc[0] < len(positional):
            loc[0] = positional[loc[0]]
        key = ".".join(str(part) for part in loc) or "(top level)"
        if error["type"] in _UNKNOWN_KEY:
            reason = unknown
        elif error["type"] in _MISSING_KEY:
            reason = missing
        else:
            reason = error["msg"].removeprefix("Value error, ")
        problems.append(f"{key}: {reason}")
    return "; ".join(problems)
