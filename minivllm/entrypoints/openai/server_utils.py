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


def _field_path(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


async def validation_exception_handler(
    request: Request, exc: RequestValidationError
) -> JSONResponse:
    """A body that does not fit the protocol model: 400 naming each bad field."""
    errors = exc.errors()
    messages = [f"{_field_path(tuple(e['loc']))}: {e['msg']}" for e in errors]
    param = _field_path(tuple(errors[0]["loc"])) if errors else None
    error = create_error_response("; ".join(messages) or str(exc), param=param)
    return error_json(error)


async def http_exception_handler(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404 route, 405 method...) in OpenAI's shape."""
    error = ErrorResponse(
        error=ErrorInfo(
            message=str(exc.detail),
            type=HTTPStatus(exc.status_code).phrase,
            code=exc.status_code,
        )
    )
    return error_json(error)


async def exception_handler(request: Request, exc: Exception) -> JSONResponse:
    """Anything a route did not handle: a 500 (``EngineDeadError`` included)."""
    logger.error("unhandled error in %s %s: %r", request.method, request.url.path, exc)
    return error_json(create_error_response(exc))
