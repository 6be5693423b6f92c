"""What every protocol object shares: the base models, errors, usage and the model list.

Upstream counterpart: ``vllm/entrypoints/openai/engine/protocol.py`` (``OpenAIBaseModel``,
``ErrorInfo``, ``ErrorResponse``, ``UsageInfo``, ``StreamOptions``, ``ModelCard``,
``ModelList``) and ``vllm/utils`` (``random_uuid``). The request and response objects of
each route, built on these, are in ``protocol``.

FastAPI validates a request body against the models, strictly: a value of the wrong
type is a 400 whose message names the field (see
``server_utils.validation_exception_handler``), never coerced (``"5"`` is not 5, ``true``
is not 1, ``2.0`` is not a count), and NaN or an infinity is refused. Values of the right
type but out of range are ``SamplingParams``'s to refuse, so the rules live in one place.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

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

logger = logging.getLogger(__name__)


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
