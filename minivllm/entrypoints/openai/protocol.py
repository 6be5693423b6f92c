"""The OpenAI API's request and response objects, as pydantic models, one group per route.

Upstream counterpart: ``vllm/entrypoints/openai/completion/protocol.py``,
``.../chat_completion/protocol.py`` and ``vllm/entrypoints/serve/tokenize/protocol.py``.
Field names, defaults and JSON shapes are OpenAI's, plus vLLM's extra sampling fields
(``top_k``, ``min_p``, ``repetition_penalty``, ...), so the official ``openai`` client
works unchanged and can send the extras through ``extra_body``.

What every object shares (the strict base of every request, errors, usage, the model
list) is in ``engine_protocol``, upstream's ``.../engine/protocol.py``; its public names
can still be imported from here.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

# Moved to engine_protocol.py; "X as X" re-exports them for code that imports them from here.
from minivllm.entrypoints.openai.engine_protocol import ErrorInfo as ErrorInfo
from minivllm.entrypoints.openai.engine_protocol import ErrorResponse as ErrorResponse
from minivllm.entrypoints.openai.engine_protocol import ModelCard as ModelCard
from minivllm.entrypoints.openai.engine_protocol import ModelList as ModelList
from minivllm.entrypoints.openai.engine_protocol import (
    OpenAIBaseModel,
    OpenAIRequestModel,
    StreamOptions,
    UsageInfo,
    _one_of,
    random_uuid,
)
from minivllm.sampling_params import RequestOutputKind, SamplingParams

# What an omitted sampling field means (OpenAI's defaults; vLLM's _DEFAULT_SAMPLING_PARAMS).
_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


class _SamplingRequest(OpenAIRequestModel):
    """Fields the completions and chat requests share, with vLLM's extras."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Annotated[str | list[str] | None, _one_of("a string or a list of strings")] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # vLLM's extra sampling parameters (the openai client sends them via extra_body).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def _build_sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        def pick(name: str) -> Any:
            value = getattr(self, name)
            return _DEFAULTS[name] if value is None else value

        return SamplingParams(
            n=self.n,
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=pick("top_k"),
            min_p=pick("min_p"),
            repetition_penalty=pick("repetition_penalty"),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            # A stream sends each step's new tokens; a full response needs only the end.
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )


def get_max_tokens(requested: int | None, max_model_len: int, prompt_len: int) -> int:
    """The request's output budget: what it asked for, capped by the room left in the context.

    Omitted, it is all of that room, as upstream's ``get_max_tokens``.
    """
    room = max_model_len - prompt_len
    return room if requested is None else min(requested, room)


# ---- /v1/completions -----------------------------------------------------------------


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: one prompt (text or token ids) or a list of them."""

    prompt: Annotated[
        str | list[str] | list[int] | list[list[int]],
        _one_of(
            "a string, a list of strings, a list of token ids (integers) or a list of "
            "lists of token ids"
        ),
    ]
    max_tokens: int | None = Field(default=16, ge=1)
    # At most 20 alternatives, as chat's top_logprobs and upstream's default max_logprobs:
    # the engine would return up to the whole vocabulary per token otherwise.
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    def to_sampling_params(self, max_model_len: int, prompt_len: int) -> SamplingParams:
        """The engine's parameters for one of this request's prompts."""
        max_tokens = get_max_tokens(self.max_tokens, max_model_len, prompt_len)
        return self._build_sampling_params(max_tokens, self.logprobs)


class CompletionLogProbs(OpenAIBaseModel):
    """The completions API's logprobs: four lists with one entry per token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    """One sample of one prompt in a full completions response."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(OpenAIBaseModel):
    """The full (non-streaming) completions response."""

    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class CompletionResponseStreamChoice(OpenAIBaseModel):
    """One sample's new text in one streamed chunk."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    """One server-sent event of a streamed completion."""

    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None


# ---- /v1/chat/completions ------------------------------------------------------------


class ChatCompletionMessageParam(OpenAIRequestModel):
    """One message of a conversation: a role and text (or a list of text parts)."""

    role: str
    content: Annotated[
        str | list[dict[str, Any]] | None, _one_of("a string or a list of content parts")
    ] = None
    name: str | None = None


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatCompletionMessageParam] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # vLLM's extra: end the prompt with the assistant's turn marker (default) or not.
    add_generation_prompt: bool = True

    def to_sampling_params(self, max_model_len: int, prompt_len: int) -> SamplingParams:
        """The engine's parameters; ``max_completion_tokens`` wins over ``max_tokens``."""
        requested = self.max_completion_tokens or self.max_tokens
        max_tokens = get_max_tokens(requested, max_model_len, prompt_len)
        # OpenAI: top_logprobs counts alternatives and needs logprobs=true.
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._build_sampling_params(max_tokens, logprobs)

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self


class ChatMessage(OpenAIBaseModel):
    """The assistant's message in a full chat response."""

    role: str
    content: str | None = None


class DeltaMessage(OpenAIBaseModel):
    """The new part of the assistant's message in one streamed chunk."""

    role: str | None = None
    content: str | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    """One candidate token: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    """One generated token with the ``top_logprobs`` most likely alternatives."""

    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    """The chat API's logprobs: one entry per generated token."""

    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    """One sample in a full chat response."""

    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    """The full (non-streaming) chat response."""

    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    """One sample's delta in one streamed chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None


# ---- /tokenize and /detokenize (vLLM's own routes) ----------------------------------


class TokenizeCompletionRequest(OpenAIRequestModel):
    """``POST /tokenize`` with a prompt."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(OpenAIRequestModel):
    """``POST /tokenize`` with chat messages, rendered by the chat template first."""

    model: str | None = None
    messages: list[ChatCompletionMessageParam] = Field(min_length=1)
    add_generation_prompt: bool = True


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    """The token ids of a prompt, their count and the model's context length."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIRequestModel):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    """The text of the token ids."""

    prompt: str
