"""Engine results as OpenAI response bodies: text completions (legacy log-prob format) and chat
completions (the `content[{token, logprob, bytes, top_logprobs}]` format).

Legacy `top_logprobs` dicts hold the requested alternatives plus the chosen token (as vLLM's
do), so `logprobs=0` still reports the chosen token's log-prob.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from sieverag.serving.engine import SequenceResult, TokenLogprob
from sieverag.serving.tokens import EncodedPrompt, prefix_offsets, token_text


def completion_body(
    model: str, prompts: Sequence[EncodedPrompt], results: Sequence[SequenceResult], *,
    echo: bool, logprobs: int | None, tokenizer: PreTrainedTokenizerBase,
) -> dict[str, Any]:
    """The body of a /v1/completions response, one choice per prompt."""
    choices = []
    for index, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        choice: dict[str, Any] = {
            "index": index,
            "text": (prompt.text if echo else "") + result.text,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        if logprobs is not None:
            choice["logprobs"] = _legacy_logprobs(prompt, result, echo, tokenizer)
        choices.append(choice)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": _usage(prompts, results)}


def chat_body(
    model: str, prompt: EncodedPrompt, result: SequenceResult, *, logprobs: bool,
    tokenizer: PreTrainedTokenizerBase,
) -> dict[str, Any]:
    """The body of a /v1/chat/completions response."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": None,
        "finish_reason": result.finish_reason,
    }
    if logprobs:
        choice["logprobs"] = {"content": [
            {**_chat_token(tokenizer, entry.token_id, entry.logprob),
             "top_logprobs": [_chat_token(tokenizer, token, value) for token, value in entry.top]}
            for entry in result.logprobs
        ]}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": _usage([prompt], [result])}


def _legacy_logprobs(prompt: EncodedPrompt, result: SequenceResult, echo: bool,
                     tokenizer: PreTrainedTokenizerBase) -> dict[str, list[Any]]:
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    if echo:
        assert result.prompt_logprobs is not None, "echo with logprobs scores the prompt"
        for token, entry, offset in zip(prompt.ids, result.prompt_logprobs, prompt.offsets,
                                        strict=True):
            tokens.append(token_text(tokenizer, token))
            token_logprobs.append(None if entry is None else entry.logprob)
            top_logprobs.append(None if entry is None else _top_dict(tokenizer, entry))
            text_offset.append(offset)
    start = len(prompt.text) if echo else 0
    offsets = prefix_offsets(tokenizer, result.token_ids, skip_special_tokens=True)
    for entry, offset in zip(result.logprobs, offsets, strict=True):
        tokens.append(token_text(tokenizer, entry.token_id))
        token_logprobs.append(entry.logprob)
        top_logprobs.append(_top_dict(tokenizer, entry))
        # Tokens after a stop string point at the end of the cut text.
        text_offset.append(start + min(offset, len(result.text)))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def _top_dict(tokenizer: PreTrainedTokenizerBase, entry: TokenLogprob) -> dict[str, float]:
    top: dict[str, float] = {}
    for token, value in (*entry.top, (entry.token_id, entry.logprob)):
        # Most likely first: of two tokens with the same text, the likelier one is kept.
        top.setdefault(token_text(tokenizer, token), value)
    return top


def _chat_token(tokenizer: PreTrainedTokenizerBase, token: int, logprob: float
                ) -> dict[str, Any]:
    text = token_text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def _usage(prompts: Sequence[EncodedPrompt], results: Sequence[SequenceResult]
           ) -> dict[str, int]:
    prompt_tokens = sum(len(p.ids) for p in prompts)
    completion_tokens = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
