"""The OpenAI API's request and response objects, as pydantic models.

Upstream counterpart: ``vllm/entrypoints/openai/engine/protocol.py`` (shared objects),
``.../completion/protocol.py``, ``.../chat_completion/protocol.py``,
``vllm/entrypoints/models/protocol.py`` and ``vllm/entrypoints/serve/tokenize/protocol.py``.
Field names, defaults and JSON shapes are OpenAI's, plus vLLM's extra sampling fields
(``top_k``, ``min_p``, ``repetition_penalty``, ...), so the official ``openai`` client
works unchanged and can send the extras through ``extra_body``.

FastAPI validates a request body against these models, strictly: a value of the wrong
type is a 400 whose message names the field (see
``server_utils.validation_exception_handler``), never coerced (``"5"`` is not 5, ``true``
is not 1, ``2.0`` is not a count), and NaN or an infinity is refused. Values of the right
type but out of range are ``SamplingParams``'s to refuse, so the rules live in one place.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from minivllm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

# What an omitted sampling field means (OpenAI's defaults; vLLM's _DEFAULT_SAMPLING_PARAMS).
_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def random_uuid() -> str:
    """A fresh 32-hex-digit id, the tail of every response id."""
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    """Base of every protocol object: unknown fields are accepted and ignored.

    OpenAI's API tolerates fields it does not know, and clients send some (``user``,
    ``metadata``...). As upstream, they are logged, not refused.
    """

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _log_extra_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            ignored = data.keys() - cls.model_fields.keys()
            if ignored:
                logger.debug("request fields ignored: %s", sorted(ignored))
        return data


class OpenAIRequestModel(OpenAIBaseModel):
    """Base of every request object: strict types, finite numbers.

    Pydantic's default ("lax") mode would turn ``"5"`` into 5, ``true`` into 1 and
    ``2.0`` into 2, so a client's mistake would silently become another request; strict
    mode refuses them, as ``SamplingParams`` does. JSON has no NaN or infinity, but
    Python's parser reads ``NaN`` and ``1e999``: refused too.
    """

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if _has_lone_surrogate(value):
            raise ValueError("must be valid Unicode text, but holds a lone surrogate (\\ud800...)")
        return value


def _has_lone_surrogate(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` holds a string with a lone UTF-16 surrogate.

    ``"\\ud800"`` is valid JSON, and Python reads it into a ``str`` that is no text: the
    tokenizer raises ``TypeError`` on it, and so does the UTF-8 encoding of any response
    that echoes it. Lists of token ids are skipped (their first item is an int), and so
    is anything nested deeper than a request's fields go (content parts' unknown keys).
    """
    if isinstance(value, str):
        if value.isascii():
            return False
        try:
            value.encode("utf-8")  # in C: a long prompt costs microseconds
        except UnicodeEncodeError:
            return True
        return False
    if depth >= 4:
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(v, depth + 1) for v in value.values())
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return any(_has_lone_surrogate(v, depth + 1) for v in value)
    return False


def _one_of(description: str):
    """A validator that replaces the per-member errors of a union with one message.

    A union's errors name each member it tried (``prompt.str``, ``prompt.list[int].0``
    ...): many lines, none of them the rule. This says what the field may be instead.
    """

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"must be {description}") from None

    return WrapValidator(check)


# ---- shared objects ------------------------------------------------------------------


class ErrorInfo(OpenAIBaseModel):
    """The body of an error: what OpenAI's clients turn into an ``APIStatusError``."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """``{"error": {...}}``, returned with the HTTP status in ``error.code``."""

    error: ErrorInfo


class UsageInfo(OpenAIBaseModel):
    """Token counts of one response; ``completion_tokens`` sums over the ``n`` choices."""

    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class StreamOptions(OpenAIRequestModel):
    """``stream_options``: ``include_usage`` adds a final chunk with the usage."""

    include_usage: bool | None = True


class ModelCard(OpenAIBaseModel):
    """One entry of ``GET /v1/models``."""

    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minivllm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    """The response of ``GET /v1/models``."""

    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


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
