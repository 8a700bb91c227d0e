"""POST /v1/completions' work (`Completions`): prompts (texts or token ids) checked against
the limits before they are tokenised, run on the engine, and answered whole or streamed, with
log-probs (`logprobs`) of the generated tokens and, with `echo`, of the prompt's."""

from __future__ import annotations

import asyncio

from fastapi.responses import Response

from sieverag.serving.api.completions.protocol import CompletionRequest
from sieverag.serving.api.endpoint_base import Endpoint
from sieverag.serving.api.openai_format import completion_body
from sieverag.serving.api.streaming import completion_stream
from sieverag.serving.engine.sequence_types import SequenceRequest
from sieverag.serving.engine.tokens import EncodedPrompt, encode_ids, encode_text


class Completions(Endpoint):
    """The completions endpoint on the context's engine."""

    async def create(self, body: CompletionRequest) -> Response:
        context = self.context
        context.check_model(body.model)
        texts_or_ids = body.prompts()
        context.limits.check_count(texts_or_ids)
        for prompt in texts_or_ids:
            context.limits.check_before_encoding(prompt, body.max_tokens, "prompt")
        prompts = await asyncio.to_thread(self.encode, texts_or_ids, body.max_tokens)
        requests = [SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=body.max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=body.logprobs or 0,
            prompt_logprobs=body.echo and body.logprobs is not None, stop=body.stop_strings(),
        ) for prompt in prompts]
        tokenizer = context.tokenizer
        if body.stream:
            return context.stream(body, completion_stream(
                context.engine, requests, prompts, model=body.model, echo=body.echo,
                logprobs=body.logprobs, include_usage=body.include_usage(),
                tokenizer=tokenizer))
        results = await context.run_all(requests)
        return await context.respond(body, lambda: completion_body(
            body.model, prompts, results, echo=body.echo, logprobs=body.logprobs,
            tokenizer=tokenizer))

    def encode(self, prompts: list[str | list[int]], max_tokens: int) -> list[EncodedPrompt]:
        """The prompts tokenised (texts) or decoded (ids), each checked once encoded; run in
        a worker thread."""
        tokenizer, limits = self.context.tokenizer, self.context.limits
        encoded = [encode_text(tokenizer, prompt, add_special_tokens=True)
                   if isinstance(prompt, str) else encode_ids(tokenizer, prompt)
                   for prompt in prompts]
        for prompt in encoded:
            limits.check_encoded(prompt, max_tokens, "prompt")
        return encoded
