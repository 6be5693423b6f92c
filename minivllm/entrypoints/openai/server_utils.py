"""Authentication and error handlers of the API server.

Upstream counterpart: ``vllm/entrypoints/openai/server_utils.py``
(``AuthenticationMiddleware``, ``validation_exception_handler``,
``http_exception_handler``, ``engine_error_handler``, ``exception_handler``). Every
error leaves the server as an OpenAI error object, ``{"error": {"message", "type",
"param", "code"}}`` with the HTTP status in ``code``, which the ``openai`` client turns
into its ``BadRequestError``, ``AuthenticationError``, ``NotFoundError``... classes.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from minivllm.entrypoints.openai.serving_engine import create_error_response

logger = logging.getLogger(__name__)

# Only the API proper needs the key; /health, /metrics, /version, /tokenize stay open,
# as upstream (a load balancer's probe or a Prometheus scraper has no key).
GUARDED_PREFIX = ("/v1",)


def documented(ok: type | None = None, stream: bool = False) -> dict[int | str, Any]:
    """What a route answers, for ``/openapi.json``: its 200 body (JSON, or server-sent
    events), and an OpenAI error object for every 4xx and 500.

    Declaring ``4XX`` also drops FastAPI's default 422 entry: this server answers a body
    that does not fit the request model with a 400 error object (``validation_exception_handler``).
    """
    success: dict[str, Any] = {"model": ok} if ok is not None else {}
    if stream:
        # No schema, as upstream: the events carry JSON chunks and a final "[DONE]".
        success["content"] = {"text/event-stream": {}}
    return {200: success, "4XX": {"model": ErrorResponse}, 500: {"model": ErrorResponse}}


def error_json(error: ErrorResponse) -> JSONResponse:
    """An ``ErrorResponse`` as a response with its own status."""
    return JSONResponse(error.model_dump(), status_code=error.error.code)


class AuthenticationMiddleware:
    """Refuse ``/v1/...`` requests without ``Authorization: Bearer <api key>`` (401).

    A plain ASGI middleware, so a streaming response passes through untouched. Keys are
    compared as SHA-256 digests with ``secrets.compare_digest``: the time taken does
    not tell how many leading characters of a guess were right.
    """

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.api_tokens = [hashlib.sha256(t.encode()).digest() for t in tokens]

    def verify_token(self, headers: Headers) -> bool:
        """Whether the request carries one of the keys as a bearer token."""
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        # No early exit: every key is compared.
        return any([secrets.compare_digest(digest, t) for t in self.api_tokens])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path.startswith(GUARDED_PREFIX) and not self.verify_token(Headers(scope=scope)):
            error = create_error_response(
                "Unauthorized: send the server's API key as 'Authorization: Bearer <key>'",
                err_type="AuthenticationError",
                status_code=HTTPStatus.UNAUTHORIZED,
            )
            await error_json(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _is_field_name(part: Any) -> bool:
    """Whether a part of an error's ``loc`` names a request field, not a union member.

    Pydantic names the member a union error came from (``TokenizeChatRequest``,
    ``list[int]``, ``function-wrap[check()]``): request fields are snake_case words.
    """
    return isinstance(part, int) or (
        isinstance(part, str) and part.isidentifier() and part == part.lower()
    )


def _field_path(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role`` (``("query", "watch")``
    -> ``watch``)."""
    path = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if not _is_field_name(part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _error_message(error: dict[str, Any]) -> str:
    """One pydantic error as ``field: what is wrong``."""
    if error["type"] == "json_invalid":
        # loc is ("body", <character offset>): the body as a whole is the bad field.
        return f"body: not valid JSON ({error.get('ctx', {}).get('error', error['msg'])})"
    return f"{_field_path(tuple(error['loc']))}: {error['msg'].removeprefix('Value error, ')}"


async def validation_exception_handler(
    request: Request, exc: RequestValidationError
) -> JSONResponse:
    """A body that does not fit the protocol model: 400 naming each bad field.

    Upstream answers the same 400 (FastAPI's default would be a 422 with its own
    shape, which the ``openai`` client cannot read as an error object).
    """
    errors = exc.errors()
    # dict.fromkeys: the members of a union may repeat one complaint; keep it once.
    messages = list(dict.fromkeys(_error_message(e) for e in errors))
    if errors and errors[0]["type"] != "json_invalid":
        param = _field_path(tuple(errors[0]["loc"]))
    else:
        param = "body"
    error = create_error_response("; ".join(messages) or str(exc), param=param)
    return error_json(error)


async def http_exception_handler(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404 route, 405 method...) in OpenAI's shape.

    A 400 here is FastAPI's: a body it could not read at all (not JSON, a form...), so
    the bad field is the body.
    """
    body_error = exc.status_code == HTTPStatus.BAD_REQUEST
    error = ErrorResponse(
        error=ErrorInfo(
            message=f"body: {exc.detail}" if body_error else str(exc.detail),
            type=HTTPStatus(exc.status_code).phrase,
            param="body" if body_error else None,
            code=exc.status_code,
        )
    )
    return error_json(error)


async def exception_handler(request: Request, exc: Exception) -> JSONResponse:
    """Anything a route did not handle: a 500 (``EngineDeadError`` included)."""
    logger.error("unhandled error in %s %s: %r", request.method, request.url.path, exc)
    return error_json(create_error_response(exc))
