"""Engine results as OpenAI response bodies (`completions.protocol`, `chat.protocol`): text
completions (legacy log-prob format) and chat completions (the
`content[{token, logprob, bytes, top_logprobs}]` format).

Legacy `top_logprobs` dicts hold the requested alternatives plus the chosen token (as vLLM's
do), so `logprobs=0` still reports the chosen token's log-prob.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from sieverag.serving.api.chat.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatTokenLogprob,
    TopLogprob,
)
from sieverag.serving.api.completions.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
)
from sieverag.serving.api.generation_protocol import TokenUsage
from sieverag.serving.engine.sequence_types import SequenceResult, TokenLogprob
from sieverag.serving.engine.tokens import EncodedPrompt, prefix_offsets, token_text


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def chat_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_body(
    model: str, prompts: Sequence[EncodedPrompt], results: Sequence[SequenceResult], *,
    echo: bool, logprobs: int | None, tokenizer: PreTrainedTokenizerBase,
) -> Completion:
    """The body of a /v1/completions response, one choice per prompt."""
    choices = [
        CompletionChoice(
            index=index, text=(prompt.text if echo else "") + result.text,
            logprobs=None if logprobs is None else legacy_logprobs(
                tokenizer, prompt if echo else None, result.prompt_logprobs, result.logprobs,
                _generated_offsets(tokenizer, result, len(prompt.text) if echo else 0)),
            finish_reason=result.finish_reason)
        for index, (prompt, result) in enumerate(zip(prompts, results, strict=True))]
    return Completion(id=completion_id(), created=int(time.time()), model=model,
                      choices=choices, usage=usage(prompts, results))


def chat_body(
    model: str, prompt: EncodedPrompt, result: SequenceResult, *, logprobs: bool,
    tokenizer: PreTrainedTokenizerBase,
) -> ChatCompletion:
    """The body of a /v1/chat/completions response."""
    choice = ChatChoice(index=0, message=AssistantMessage(content=result.text),
                        logprobs=chat_logprobs(tokenizer, result.logprobs) if logprobs else None,
                        finish_reason=result.finish_reason)
    return ChatCompletion(id=chat_id(), created=int(time.time()), model=model,
                          choices=[choice], usage=usage([prompt], [result]))


def chat_logprobs(tokenizer: PreTrainedTokenizerBase,
                  entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    """The chat format's log-probs of generated tokens."""
    content = []
    for entry in entries:
        text = token_text(tokenizer, entry.token_id)
        content.append(ChatTokenLogprob(
            token=text, logprob=entry.logprob, bytes=list(text.encode("utf-8")),
            top_logprobs=[_chat_token(tokenizer, token, value) for token, value in entry.top]))
    return ChatLogprobs(content=content)


def legacy_logprobs(
    tokenizer: PreTrainedTokenizerBase, echoed: EncodedPrompt | None,
    prompt_logprobs: Sequence[TokenLogprob | None] | None,
    generated: Sequence[TokenLogprob], generated_offsets: Sequence[int],
) -> CompletionLogprobs:
    """The legacy log-prob table: the `echoed` prompt's tokens (scored by `prompt_logprobs`)
    first, when given, then the `generated` tokens at `generated_offsets` in the text."""
    table = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    if echoed is not None:
        assert prompt_logprobs is not None, "echo with logprobs scores the prompt"
        for token, entry, offset in zip(echoed.ids, prompt_logprobs, echoed.offsets,
                                        strict=True):
            table.tokens.append(token_text(tokenizer, token))
            table.token_logprobs.append(None if entry is None else entry.logprob)
            table.top_logprobs.append(None if entry is None else _top_dict(tokenizer, entry))
            table.text_offset.append(offset)
    for entry, offset in zip(generated, generated_offsets, strict=True):
        table.tokens.append(token_text(tokenizer, entry.token_id))
        table.token_logprobs.append(entry.logprob)
        table.top_logprobs.append(_top_dict(tokenizer, entry))
        table.text_offset.append(offset)
    return table


def _generated_offsets(tokenizer: PreTrainedTokenizerBase, result: SequenceResult,
                       start: int) -> list[int]:
    """Each generated token's offset in the returned text, which starts with `start`
    characters of echoed prompt; tokens after a stop string point at the end of the cut
    text."""
    offsets = prefix_offsets(tokenizer, result.token_ids, skip_special_tokens=True)
    return [start + min(offset, len(result.text)) for offset in offsets]


def _top_dict(tokenizer: PreTrainedTokenizerBase,
              entry: TokenLogprob) -> dict[str, float]:
    top: dict[str, float] = {}
    for token, value in (*entry.top, (entry.token_id, entry.logprob)):
        # Most likely first: of two tokens with the same text, the likelier one is kept.
        top.setdefault(token_text(tokenizer, token), value)
    return top


def _chat_token(tokenizer: PreTrainedTokenizerBase, token: int, logprob: float) -> TopLogprob:
    text = token_text(tokenizer, token)
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


def usage(prompts: Sequence[EncodedPrompt], results: Sequence[SequenceResult]) -> TokenUsage:
    """Tokens of the prompts and of what was generated for them (an EOS included)."""
    return TokenUsage.of(sum(len(p.ids) for p in prompts), sum(len(r.token_ids) for r in results))
