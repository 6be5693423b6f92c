"""What every ``serving_*`` class shares: the engine, the model check, prompts and errors.

Upstream counterpart: ``vllm/entrypoints/openai/engine/serving.py`` (``OpenAIServing``)
and ``vllm/entrypoints/utils.py`` (``create_error_response``). Every failure a client
can cause becomes an ``ErrorResponse`` with an HTTP status here, before the engine sees
the request: a bad field or a prompt too long is a 400 naming the field, an unknown
model a 404. A dead engine core is a 500.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from minivllm.engine.exceptions import EngineDeadError, EngineGenerateError
from minivllm.entrypoints.chat_utils import render_chat_prompt
from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels

# Logprobs can be -inf, which JSON cannot carry; OpenAI's floor, as upstream.
MIN_LOGPROB = -9999.0

_SAMPLING_FIELD = re.compile(r"SamplingParams\.(\w+)")


class VLLMValidationError(ValueError):
    """A request value the server refuses, with the request field it came from.

    Upstream counterpart: ``vllm.exceptions.VLLMValidationError``.
    """

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


def create_error_response(
    message: str | Exception,
    err_type: str = "BadRequestError",
    status_code: HTTPStatus = HTTPStatus.BAD_REQUEST,
    param: str | None = None,
) -> ErrorResponse:
    """An OpenAI error object; an exception picks its own status.

    ``ValueError`` (the engine's and ``SamplingParams``' way of refusing input) is a 400,
    with ``param`` taken from the ``SamplingParams.<field>`` the message names;
    ``EngineDeadError`` and ``EngineGenerateError`` are 500s; anything else unexpected
    is a 500 too.
    """
    if isinstance(message, Exception):
        exc = message
        message = str(exc)
        if isinstance(exc, (EngineDeadError, EngineGenerateError)):
            err_type, status_code = "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
        elif isinstance(exc, VLLMValidationError):
            param = exc.parameter
        elif isinstance(exc, (ValueError, TypeError, OverflowError)):
            match = _SAMPLING_FIELD.search(message)
            param = match.group(1) if match else param
        else:
            err_type, status_code = "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
            message = f"{type(exc).__name__}: {message}"
    return ErrorResponse(
        error=ErrorInfo(message=message, type=err_type, param=param, code=int(status_code))
    )


def decoded_token(token_id: int, logprob: Any, tokenizer: Any) -> str:
    """A candidate token's text: the detokenizer's when it has one, else decoded here."""
    if logprob.decoded_token is not None:
        return logprob.decoded_token
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id])


class OpenAIServing:
    """Base of the serving classes: holds the engine client and the served models.

    Args:
        engine_client: The ``AsyncLLM`` (anything with its ``generate``, ``abort``,
            ``tokenizer`` and ``vllm_config``).
        models: The served model names (``GET /v1/models`` and the model check).
    """

    def __init__(self, engine_client: Any, models: OpenAIServingModels) -> None:
        self.engine_client = engine_client
        self.models = models
        self.max_model_len: int = engine_client.vllm_config.model_config.max_model_len
        self.vocab_size: int = engine_client.vllm_config.model_config.hf_config.vocab_size

    @property
    def tokenizer(self) -> Any:
        """The engine's Hugging Face tokenizer (None for a model folder without one)."""
        return self.engine_client.tokenizer

    def create_error_response(self, message: str | Exception, **kwargs: Any) -> ErrorResponse:
        """See ``create_error_response``."""
        return create_error_response(message, **kwargs)

    async def _check_model(self, model: str | None) -> ErrorResponse | None:
        """404 unless ``model`` is omitted or one of the served names."""
        return await self.models.check_model(model)

    def _tokenize_prompt_input(self, prompt: str | list[int]) -> dict[str, Any]:
        """One prompt as the engine takes it, text and token ids (tokenized here, once)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise VLLMValidationError(
                    "this model has no tokenizer: send 'prompt' as token ids", "prompt"
                )
            return {"prompt": prompt, "prompt_token_ids": self.tokenizer.encode(prompt)}
        return {"prompt_token_ids": list(prompt)}

    def _render_chat(self, messages: list[Any], add_generation_prompt: bool) -> dict[str, Any]:
        """The chat rendered by the model's template into one prompt; any refusal (a part
        that is not text, a template that raised) is a 400 naming ``messages``."""
        try:
            return render_chat_prompt(
                self.tokenizer, messages, add_generation_prompt=add_generation_prompt
            )
        except VLLMValidationError:
            raise
        except ValueError as exc:
            raise VLLMValidationError(str(exc), "messages") from exc

    def _validate_token_ids(self, token_ids: list[int], field: str) -> None:
        """400 naming the first id outside the vocabulary (the engine would refuse it
        too, but its message names a request id, not the field)."""
        for i, token_id in enumerate(token_ids):
            if not 0 <= token_id < self.vocab_size:
                raise VLLMValidationError(
                    f"{field}[{i}] = {token_id} is outside the vocabulary [0, {self.vocab_size})",
                    field,
                )

    def _validate_prompt_len(self, token_ids: list[int], field: str) -> None:
        """400 for an empty prompt, an id outside the vocabulary, or a prompt that
        leaves no room to generate."""
        if not token_ids:
            raise VLLMValidationError(f"'{field}' is empty", field)
        self._validate_token_ids(token_ids, field)
        if len(token_ids) >= self.max_model_len:
            raise VLLMValidationError(
                f"'{field}' has {len(token_ids)} tokens, but this model's maximum context "
                f"length is {self.max_model_len} tokens, which leaves no room for output; "
                f"shorten the {field}",
                field,
            )


def clamp_logprob(logprob: float) -> float:
    """``max(logprob, MIN_LOGPROB)``: a JSON-safe logprob."""
    return max(logprob, MIN_LOGPROB)
