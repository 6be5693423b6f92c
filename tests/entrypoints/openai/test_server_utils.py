"""Error objects, the validation handler and the API-key middleware, on a small app."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from starlette.exceptions import HTTPException

from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from minivllm.entrypoints.openai.server_utils import (
    AuthenticationMiddleware,
    http_exception_handler,
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
    app.add_exception_handler(HTTPException, http_exception_handler)
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


# What the schema fuzzer (test_fuzz.py) found accepted by coercion, or refused with a
# message that named no field; each must be a 400 naming the field.
@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": "p", "max_tokens": "5"}, "max_tokens", "valid integer"),
        ({"prompt": "p", "n": True}, "n", "valid integer"),
        ({"prompt": "p", "n": 2.0}, "n", "valid integer"),
        ({"prompt": "p", "seed": 1.5}, "seed", "valid integer"),
        ({"prompt": "p", "temperature": "0.5"}, "temperature", "valid number"),
        ({"prompt": "p", "stream": 1}, "stream", "valid boolean"),
        (
            {"prompt": "p", "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
            "bool",
        ),
        ({"prompt": [5.7, 6]}, "prompt", "a list of token ids"),
        ({"prompt": ["a", 6]}, "prompt", "a list of strings"),
        ({"prompt": [[1], [[2]]]}, "prompt", "lists of token ids"),
        ({"prompt": None}, "prompt", "must be a string"),
        ({"prompt": "p", "stop": [5]}, "stop", "list of strings"),
        ({"prompt": "p", "stop_token_ids": 5}, "stop_token_ids", "valid list"),
        ({"prompt": "p", "stop_token_ids": [True]}, "stop_token_ids[0]", "valid integer"),
        # Valid JSON escapes that are no text: the tokenizer raised TypeError (a 500).
        ({"prompt": "\ud800"}, "prompt", "lone surrogate"),
        ({"prompt": ["ok", "a\udfffb"]}, "prompt", "lone surrogate"),
        ({"prompt": "p", "model": "m\udc00"}, "model", "lone surrogate"),
    ],
)
def test_no_silent_coercion(client: TestClient, body: dict, param: str, words: str) -> None:
    # json.dumps escapes a lone surrogate (httpx's json= would fail to encode it).
    headers = {**AUTH, "Content-Type": "application/json"}
    r = client.post("/v1/completions", content=json.dumps(body), headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param.split("[")[0])
    assert words in error["message"]
    assert "list[int]" not in error["message"]  # no union-member names in the message


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_inf_are_refused(client: TestClient, value: str) -> None:
    # Not JSON, but Python's parser (and so FastAPI) reads them.
    body = '{"prompt": "p", "temperature": ' + value + "}"
    headers = {**AUTH, "Content-Type": "application/json"}
    r = client.post("/v1/completions", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert "finite" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("content", "content_type"),
    [('{"prompt": ', "application/json"), ("prompt=p", "application/x-www-form-urlencoded")],
    ids=["truncated-json", "form"],
)
def test_unreadable_body_names_the_body(client: TestClient, content: str, content_type: str):
    headers = {**AUTH, "Content-Type": content_type}
    r = client.post("/v1/completions", content=content, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "body" and error["message"].startswith("body")


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
