"""POST /v1/chat/completions' work (`Chat`): the messages rendered by the model's chat
template (a template that refuses them: 400), checked against the limits before and after
tokenising, run on the engine, and answered whole or streamed."""

from __future__ import annotations

import asyncio

from fastapi.responses import Response
from jinja2 import TemplateError

from sieverag.inference.llm.backend_protocol import chat_prompt_text
from sieverag.serving.api.chat.protocol import ChatCompletionRequest
from sieverag.serving.api.endpoint_base import Endpoint
from sieverag.serving.api.openai_format import chat_body
from sieverag.serving.api.streaming import chat_stream
from sieverag.serving.engine.sequence_types import SequenceRequest
from sieverag.serving.engine.tokens import EncodedPrompt, encode_text
from sieverag.serving.refusals import APIError


class Chat(Endpoint):
    """The chat endpoint on the context's engine."""

    async def create(self, body: ChatCompletionRequest) -> Response:
        context = self.context
        context.check_model(body.model)
        prompt, max_tokens = await asyncio.to_thread(self.encode, body)
        request = SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
            stop=body.stop_strings(),
        )
        tokenizer = context.tokenizer
        if body.stream:
            return context.stream(body, chat_stream(
                context.engine, request, prompt, model=body.model, logprobs=body.logprobs,
                include_usage=body.include_usage(), tokenizer=tokenizer))
        (result,) = await context.run_all([request])
        return await context.respond(body, lambda: chat_body(
            body.model, prompt, result, logprobs=body.logprobs, tokenizer=tokenizer))

    def encode(self, body: ChatCompletionRequest) -> tuple[EncodedPrompt, int]:
        """The conversation's prompt and the tokens to generate; run in a worker thread."""
        tokenizer, limits = self.context.tokenizer, self.context.limits
        messages = [message.as_template_message() for message in body.messages]
        try:
            text = chat_prompt_text(tokenizer, messages)
        except (TemplateError, ValueError) as exc:
            raise APIError(400, f"the model's chat template refused the messages: {exc}",
                           param="messages") from exc
        requested = body.token_limit()
        # Without max_tokens, the prompt must still leave room for one token.
        limits.check_before_encoding(text, requested or 1, "messages")
        # The rendered template holds its own special tokens (as HFBackend renders it).
        prompt = encode_text(tokenizer, text, add_special_tokens=False)
        max_tokens = limits.chat_max_tokens(requested, len(prompt.ids))
        limits.check_encoded(prompt, max_tokens, "messages")
        return prompt, max_tokens
