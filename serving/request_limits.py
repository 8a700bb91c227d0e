"""What a request may ask, below both the API that parses it and the filtering that runs it:
the size rules every prompt must pass (`PromptLimits`), how a document too long is cut
(`Truncation`) and how a refusal names the documents (`DocumentRefusal`).

The size rules, each checked before the work whose cost it bounds:

* Prompts per /v1/completions request: at most `max_prompts_per_request` (400); documents
  per /v1/rerank request: at least one, at most `max_rerank_documents` (400).
* The filter tokens of a rerank, score or proxy request (MCF's plan, `round_plan`:
  the prompts of the windows the filter may read): at most `max_request_tokens` (413),
  checked once the documents are tokenised, before the filter or retrieval runs.
* A text prompt (a completions string, a chat conversation as its template renders it),
  before it is tokenised: one token stands for at most `max_token_chars` characters (the
  longest vocabulary entry, `tokens.max_token_chars`), so a text of more than
  (context - max_tokens) x that many characters cannot fit (400 `context_length_exceeded`).
* A token-id prompt, before its text and offsets are decoded (which costs time quadratic in
  its length): its length against the context, then each id against the vocabulary, in one
  pass (400).
* Every prompt once tokenised: not empty, and its tokens plus max_tokens within the context
  (400 `context_length_exceeded`). A rerank document of any length is read window by window
  (`inference/filters/windows.py`); only a query that leaves the filter prompt on a window,
  with the tokens its answer needs, no room in the context is refused (naming the query).
* A chat request without max_tokens gets `default_chat_max_tokens`, lowered to what the
  context leaves after the prompt.

The request body's size is bounded before any of this, by `body_limit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sieverag.serving.engine.tokens import EncodedPrompt
from sieverag.serving.refusals import APIError


@dataclass(frozen=True)
class Truncation:
    """How a document too long is cut, from its end (`keep` "start") or its start: to the
    filter's window (`max_prompt_tokens` None: its first or last window's worth of tokens,
    read as one window), or until every filter prompt on it holds at most
    `max_prompt_tokens` tokens (what is left, read window by window)."""

    max_prompt_tokens: int | None = None
    keep: Literal["start", "end"] = "start"

    def start_in(self, text: str, cut: str) -> int:
        """Where `cut`, `text` as this rule cut it, starts in `text`."""
        return len(text) - len(cut) if self.keep == "end" else 0


@dataclass(frozen=True)
class DocumentRefusal:
    """How a refusal names the request's documents: their field and what to send instead."""

    param: str = "documents"
    remedy: str | None = None


@dataclass(frozen=True)
class PromptLimits:
    """The prompt size rules for one served model, shared by chat and completions."""

    max_model_len: int
    vocabulary_size: int
    max_token_chars: int
    max_prompts_per_request: int
    default_chat_max_tokens: int
    max_rerank_documents: int
    max_request_tokens: int

    def check_count(self, prompts: Sequence[object]) -> None:
        """Refuse a completions request with no prompt or more than the cap."""
        if not prompts:
            raise APIError(400, "prompt is an empty list", param="prompt")
        if len(prompts) > self.max_prompts_per_request:
            raise APIError(400, f"the request holds {len(prompts)} prompts; this server takes "
                           f"at most {self.max_prompts_per_request} per request: split it",
                           param="prompt")

    def check_documents(self, texts: Sequence[str], *, param: str = "documents") -> None:
        """Refuse a rerank request with no document or more than the cap."""
        if not texts:
            raise APIError(400, f"{param} is an empty list: send at least one document to "
                           "rerank", param=param)
        if len(texts) > self.max_rerank_documents:
            raise APIError(400, f"the request holds {len(texts)} documents; this server reranks "
                           f"at most {self.max_rerank_documents} per request: split it",
                           param=param)

    def check_request_tokens(self, tokens: int, documents: int) -> None:
        """Refuse (413) a request whose filter tokens (over its `documents`) pass the budget."""
        if tokens > self.max_request_tokens:
            raise APIError(413, f"the request's {documents} document(s) need up to "
                           f"{tokens:,} filter tokens; this server reads at most "
                           f"{self.max_request_tokens:,} per request (--local.max-request-"
                           "tokens): send fewer or shorter documents, or fewer windows per "
                           "document (max_chunks_per_doc)", code="request_too_large")

    def check_window_prompt(self, index: int, prompt_tokens: int, answer_tokens: int,
                            prompt_name: str, param: str = "query") -> None:
        """Refuse (400, naming the query field `param`) a query that leaves a filter prompt
        (`prompt_name`) on a window of document `index` (its largest), with the tokens of its
        answer, no room in the context: a window is never longer than the filter reads, so
        only the query can make it overflow."""
        if prompt_tokens + answer_tokens > self.max_model_len:
            raise APIError(400, f"the query is too long for this model's maximum context "
                           f"length of {self.max_model_len} tokens: the {prompt_name} prompt "
                           f"on document {index} has {prompt_tokens} tokens and the answer "
                           f"needs {answer_tokens} more; shorten the query", param=param,
                           code="context_length_exceeded")

    def check_before_encoding(self, prompt: str | Sequence[int], max_tokens: int,
                              param: str) -> None:
        """Refuse a prompt that cannot fit the context, in time linear in its length, before
        it is tokenised (text) or decoded (token ids)."""
        if isinstance(prompt, str):
            fewest = -(-len(prompt) // self.max_token_chars)  # ceil: a token's most characters
            self._check_fit(fewest, max_tokens, param,
                            f"at least {fewest} tokens ({len(prompt)} characters, and one token "
                            f"stands for at most {self.max_token_chars})")
            return
        self._check_fit(len(prompt), max_tokens, param, f"{len(prompt)} tokens")
        if any(not 0 <= token < self.vocabulary_size for token in prompt):
            raise APIError(400, f"the prompt holds token ids outside the vocabulary "
                           f"[0, {self.vocabulary_size})", param=param)

    def check_encoded(self, prompt: EncodedPrompt, max_tokens: int, param: str) -> None:
        """Refuse an empty tokenised prompt, or one that with max_tokens overflows the context."""
        if not prompt.ids:
            raise APIError(400, "the prompt is empty", param=param)
        self._check_fit(len(prompt.ids), max_tokens, param, f"{len(prompt.ids)} tokens")

    def chat_max_tokens(self, requested: int | None, prompt_tokens: int) -> int:
        """The requested max_tokens, or the server's default lowered to the context left (at
        least 1, so that a prompt filling the context is refused by `check_encoded`)."""
        if requested is not None:
            return requested
        return max(1, min(self.default_chat_max_tokens, self.max_model_len - prompt_tokens))

    def document_too_long(self, index: int, counted: str, param: str = "documents",
                          remedy: str | None = None) -> APIError:
        """The refusal of document `index` (of the field `param`), too long for the context."""
        advice = "shorten it (split it into chunks) or the query" + (
            f", or {remedy}" if remedy else "")
        return APIError(400, f"document {index} does not fit this model's maximum context "
                        f"length of {self.max_model_len} tokens: {counted}; {advice}",
                        param=param, code="context_length_exceeded")

    def _check_fit(self, prompt_tokens: int, max_tokens: int, param: str, counted: str) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} "
                           f"tokens; the prompt has {counted} and max_tokens asks for "
                           f"{max_tokens} more: shorten the prompt or lower max_tokens",
                           param=param if prompt_tokens >= self.max_model_len else "max_tokens",
                           code="context_length_exceeded")
