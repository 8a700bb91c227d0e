"""The documents a /v1/chat/completions request marks for the filtering proxy, and the request
it forwards in their place.

A request marks its documents in one of two ways (README "Use the filter in an existing
application"):

* **field** — a top-level `documents` list of strings or `{"text", "title"?}` objects. The
  field is removed before forwarding, and the kept documents go into the last user message as
  a `<documents>` block, before its text.
* **block** — the last user message holds one `<documents>` … `</documents>` block whose
  passages are numbered `[1] …`, `[2] …`, each number at the start of its own line (a passage
  runs to the next numbered line). The block is rewritten in place.

Either way the filter judges each passage against the last user message's text outside the
block (the question, with whatever instruction the application wrote around it), and the
forwarded block is `<documents>`, the kept passages one per numbered line (best first, each
with the number it had: index + 1 for the field, its own number in a block; a title on the
number's line, the text after it), `</documents>`. An optional top-level `granularity`
("chunk" or "sentence") says whether kept passages are cut to their key sentences; it is
removed too, as is a top-level `sieverag` object of the proxy's own per-request settings
(`ProxyFields`: `context_tokens`, the request's context budget). A request with neither mark
is not a marked request (`find_marked` gives None).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from sieverag.inference.core.types import Document
from sieverag.serving.api.request_fields import Text
from sieverag.serving.refusals import APIError

OPEN_TAG = "<documents>"
CLOSE_TAG = "</documents>"
# A passage's number at the start of a line inside the block: "[3] ...".
_NUMBERED_LINE = re.compile(r"^[ \t]*\[(\d+)\][ \t]?", re.MULTILINE)
# The top-level fields the proxy reads and removes before forwarding.
SETTINGS_FIELD = "sieverag"
PROXY_FIELDS = ("documents", "granularity", SETTINGS_FIELD)

Convention = Literal["field", "block"]
Granularity = Literal["chunk", "sentence"]


class MarkedDocument(BaseModel):
    """A document of the `documents` field given as an object."""

    model_config = ConfigDict(extra="forbid")

    text: Text
    title: Text | None = None


class ProxyFields(BaseModel):
    """The request's `sieverag` object: the proxy's settings for this request."""

    model_config = ConfigDict(extra="forbid")

    context_tokens: StrictInt | None = Field(
        None, ge=1, description="the context budget: the forwarded passages hold at most this "
                                "many tokens of the filter's tokenizer (the best context that "
                                "fits); null: the server's --proxy-context-tokens")


_DOCUMENTS = TypeAdapter(list[Text | MarkedDocument])
_GRANULARITY = TypeAdapter(Granularity)


@dataclass(frozen=True)
class Passage:
    """One marked document: the number it is written with, and the document the filter
    reads (its id the passage's position in the request, from 0)."""

    number: str
    document: Document


@dataclass(frozen=True)
class MarkedRequest:
    """A request whose documents the proxy filters: the parsed body, where its block goes,
    the question the passages are judged against, and the passages in request order."""

    body: dict[str, Any]
    convention: Convention
    granularity: Granularity | None
    question: str
    passages: tuple[Passage, ...]
    message_index: int  # the last user message
    # The text part holding the block; None: the content is a string, or (field) the block
    # goes in as a new first part.
    part_index: int | None
    before: str  # the text before the block
    after: str  # and after it
    settings: ProxyFields = field(default_factory=ProxyFields)

    def forwarded_body(self, kept: Sequence[Passage]) -> dict[str, Any]:
        """The body to forward: the proxy's fields removed, the block holding `kept`."""
        body = {key: value for key, value in self.body.items() if key not in PROXY_FIELDS}
        messages = list(body["messages"])
        message = dict(messages[self.message_index])
        text = self.before + documents_block(kept) + self.after
        content = message["content"]
        if isinstance(content, str):
            message["content"] = text
        elif self.part_index is None:  # the field's block goes in as the first text part
            message["content"] = [{"type": "text", "text": text}, *content]
        else:
            parts = list(content)
            parts[self.part_index] = {**parts[self.part_index], "text": text}
            message["content"] = parts
        messages[self.message_index] = message
        body["messages"] = messages
        return body


def documents_block(passages: Sequence[Passage]) -> str:
    """`<documents>`, one numbered line per passage (title, if any, then text), `</documents>`."""
    lines = [passage_lines(passages)] if passages else []
    return "\n".join([OPEN_TAG, *lines, CLOSE_TAG])


def passage_lines(passages: Sequence[Passage]) -> str:
    """The block's passages, one numbered line each (its title, if any, then its text)."""
    return "\n".join(f"[{p.number}] {p.document.as_context()}" for p in passages)


def find_marked(body: Any) -> MarkedRequest | None:
    """The request's marked documents, or None when it marks none (neither a `documents`
    field nor a block in its last user message). A marked request that is malformed is
    refused (`APIError` 400, naming the field)."""
    has_field = isinstance(body, dict) and "documents" in body
    located = _last_user_text(body)
    has_block = located is not None and OPEN_TAG in located[2]
    if not has_field and not has_block:
        for name in ("granularity", SETTINGS_FIELD):
            if isinstance(body, dict) and name in body:
                raise APIError(400, f"{name} applies to marked documents, and this request "
                               "marks none: send a `documents` field or a <documents> block "
                               "in the last user message", param=name)
        return None
    if has_field and has_block:
        raise APIError(400, "the request marks documents twice, in the `documents` field and "
                       "in a <documents> block of the last user message: use one",
                       param="documents")
    if located is None:
        raise APIError(400, "the `documents` field needs a user message to go into: messages "
                       "must be a list holding a user message whose content is a string or a "
                       "list of parts", param="messages")
    message_index, part_index, text = located
    granularity = _granularity(body.get("granularity"))
    settings = _settings(body.get(SETTINGS_FIELD))
    content = body["messages"][message_index]["content"]
    if has_field:
        passages = tuple(Passage(str(i + 1), document)
                         for i, document in enumerate(_field_documents(body["documents"])))
        # Before a string's text; text parts get the block as a part of its own.
        after = "\n\n" + content if isinstance(content, str) and content else ""
        return MarkedRequest(body, "field", granularity, _question(_user_text(content)),
                             passages, message_index, None, "", after, settings)
    before, inside, after = _split_block(text)
    others = "" if isinstance(content, str) else _user_text(
        [part for i, part in enumerate(content) if i != part_index])
    return MarkedRequest(body, "block", granularity, _question(f"{before}\n{after}\n{others}"),
                         _block_passages(inside), message_index, part_index, before, after,
                         settings)


def _last_user_text(body: Any) -> tuple[int, int | None, str] | None:
    """(message index, text part index or None, text) of the last user message: its string
    content, or the text part holding a block (else None and ""); None when the body has no
    user message whose content is a string or a list of parts."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return index, None, content
        if not isinstance(content, list):
            return None
        texts = [(i, part["text"]) for i, part in enumerate(content)
                 if isinstance(part, dict) and part.get("type") == "text"
                 and isinstance(part.get("text"), str)]
        part_index, text = next((t for t in texts if OPEN_TAG in t[1]), (None, ""))
        return index, part_index, text
    return None


def _user_text(content: Any) -> str:
    """A message content's text: the string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content
                     if isinstance(part, dict) and part.get("type") == "text"
                     and isinstance(part.get("text"), str))


def _question(text: str) -> str:
    question = " ".join(text.split())
    if not question:
        raise APIError(400, "the last user message holds no text besides the documents: the "
                       "filter judges each passage against that text (the question)",
                       param="messages")
    return question


def _granularity(value: Any) -> Granularity | None:
    if value is None:
        return None
    try:
        return _GRANULARITY.validate_python(value)
    except ValidationError:
        raise APIError(400, f"granularity must be \"chunk\" or \"sentence\", got {value!r}",
                       param="granularity") from None


def _settings(value: Any) -> ProxyFields:
    if value is None:
        return ProxyFields()
    try:
        return ProxyFields.model_validate(value)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in (SETTINGS_FIELD, *problem["loc"]))
        raise APIError(400, f"{where}: {problem['msg']} (the `{SETTINGS_FIELD}` object takes "
                       "context_tokens, an integer >= 1, or null)", param=where) from None


def _field_documents(value: Any) -> list[Document]:
    try:
        documents = _DOCUMENTS.validate_python(value)
    except ValidationError:
        raise APIError(400, "documents must be a list of strings or of objects {\"text\": ..., "
                       "\"title\": ...} (title optional)", param="documents") from None
    return [Document(id=str(i), text=d) if isinstance(d, str)
            else Document(id=str(i), text=d.text, title=d.title or "")
            for i, d in enumerate(documents)]


def _split_block(text: str) -> tuple[str, str, str]:
    """(text before the block, the block's inside, text after it)."""
    if text.count(OPEN_TAG) > 1:
        raise APIError(400, f"the last user message holds more than one {OPEN_TAG} block: "
                       "put every passage in one block", param="messages")
    before, _, rest = text.partition(OPEN_TAG)
    inside, closed, after = rest.partition(CLOSE_TAG)
    if not closed:
        raise APIError(400, f"the last user message opens {OPEN_TAG} but never closes it with "
                       f"{CLOSE_TAG}", param="messages")
    return before, inside, after


def _block_passages(inside: str) -> tuple[Passage, ...]:
    """The block's passages: each numbered line starts one, which runs to the next."""
    starts = list(_NUMBERED_LINE.finditer(inside))
    head = inside[:starts[0].start()] if starts else inside
    if head.strip():
        raise APIError(400, f"the {OPEN_TAG} block holds text before its first numbered "
                       "passage: number every passage, [1] at the start of its line",
                       param="messages")
    ends = [m.start() for m in starts[1:]] + [len(inside)]
    return tuple(Passage(match.group(1), Document(id=str(i), text=inside[match.end():end].strip()))
                 for i, (match, end) in enumerate(zip(starts, ends, strict=True)))
