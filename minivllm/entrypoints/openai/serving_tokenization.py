"""``POST /tokenize`` and ``POST /detokenize``: the server's tokenizer, over HTTP.

Upstream counterpart: ``vllm/entrypoints/serve/tokenize/serving.py``
(``OpenAIServingTokenization``). Not part of OpenAI's API but of vLLM's: a client can
count a prompt's tokens against ``max_model_len`` before sending it, or see exactly what
a chat template produced, with the same tokenizer the engine uses.
"""

from __future__ import annotations

from minivllm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from minivllm.entrypoints.openai.serving_engine import OpenAIServing, VLLMValidationError


class OpenAIServingTokenization(OpenAIServing):
    """Tokenize prompts or chats, detokenize ids."""

    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse | ErrorResponse:
        """Token ids of a prompt, or of a conversation rendered by the chat template."""
        if (error := await self._check_model(request.model)) is not None:
            return error
        try:
            if self.tokenizer is None:
                raise VLLMValidationError("this model has no tokenizer")
            if isinstance(request, TokenizeChatRequest):
                prompt = self._render_chat(request.messages, request.add_generation_prompt)
                tokens = prompt["prompt_token_ids"]
            else:
                tokens = self.tokenizer.encode(
                    request.prompt, add_special_tokens=request.add_special_tokens
                )
        except ValueError as exc:
            return self.create_error_response(exc)
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens)

    async def create_detokenize(
        self, request: DetokenizeRequest
    ) -> DetokenizeResponse | ErrorResponse:
        """The text of token ids; an id outside the vocabulary is a 400 naming it."""
        if (error := await self._check_model(request.model)) is not None:
            return error
        try:
            self._validate_token_ids(request.tokens, "tokens")
            if self.tokenizer is None:
                raise VLLMValidationError("this model has no tokenizer", "tokens")
        except ValueError as exc:
            return self.create_error_response(exc)
        return DetokenizeResponse(prompt=self.tokenizer.decode(request.tokens))
