"""Error objects, the validation handler and the API-key middleware, on a small app."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient

from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from minivllm.entrypoints.openai.server_utils import (
    AuthenticationMiddleware,
    validation_exception_handler,
)
from minivllm.entrypoints.openai.serving_engine import (
    VLLMValidationError,
    create_error_response,
)
from minivllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict:
        return {"ok": request.prompt}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest) -> dict:
        return {"ok": len(request.messages)}

    @app.get("/health")
    async def health() -> dict:
        return {}

    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    app.add_middleware(AuthenticationMiddleware, tokens=["sk-good"])
    return TestClient(app)


AUTH = {"Authorization": "Bearer sk-good"}


def test_bad_field_is_400_naming_the_field(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "p", "max_tokens": "x"}, headers=AUTH)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and error["code"] == 400
    assert error["message"].startswith("max_tokens: ")
    assert error["type"] == "BadRequestError"


def test_nested_field_path(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "a"}, {"content": "no role"}]}
    r = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[1].role"


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer sk-bad"}, {"Authorization": "sk-good"}]
)
def test_v1_routes_need_the_key(client: TestClient, headers: dict) -> None:
    r = client.post("/v1/completions", json={"prompt": "p"}, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "AuthenticationError"
    assert client.post("/v1/completions", json={"prompt": "p"}, headers=AUTH).json() == {"ok": "p"}


def test_health_stays_open(client: TestClient) -> None:
    assert client.get("/health").status_code == 200


def test_sampling_params_errors_name_their_param() -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(top_p=3.0)
    error = create_error_response(info.value).error
    assert (error.code, error.param) == (400, "top_p")
    assert "top_p" in error.message


def test_error_statuses() -> None:
    assert create_error_response(VLLMValidationError("long", "prompt")).error.param == "prompt"
    dead = create_error_response(EngineDeadError()).error
    assert (dead.code, dead.type) == (500, "InternalServerError")
    assert create_error_response(RuntimeError("boom")).error.code == 500
