"""What every endpoint's request models build on: the text type, the lenient model config and
the tags of union branches.

Every text field is `Text`: a string UTF-8 can encode, for JSON can spell a lone surrogate
("\\ud800"), which no tokenizer takes. Every request model accepts fields it does not declare
(`LENIENT`), which the field policy names in the `x-sieverag-ignored` header
(`field_policy.unknown_fields`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict
from pydantic_core import PydanticCustomError

# The pydantic error type of a text field that UTF-8 cannot encode.
UNENCODABLE_TEXT = "unencodable_text"

LENIENT = ConfigDict(extra="allow")


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError(UNENCODABLE_TEXT, "text that UTF-8 cannot encode (a lone "
                                  "surrogate such as \\ud800)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


# Union branches are tagged "<what>:<shape>": an error's location holds the tag, which the
# server's error message leaves out (`is_branch_tag`).
def is_branch_tag(part: str) -> bool:
    return ":" in part


def text_or_object(value: Any) -> str:
    """The branch tag of a value given as a string or as an object."""
    return "value:text" if isinstance(value, str) else "value:object"
