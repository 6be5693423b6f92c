"""The HTTP API fuzzed from its own OpenAPI schema (schemathesis, on hypothesis).

The package's shared ``minivllm serve`` on the demo model (conftest.py; its API key goes
with every request, so each reaches validation); every operation of ``/openapi.json`` gets
requests the schema allows (positive) and requests it refuses (negative: a wrong type,
a missing field, a value out of the schema's bounds, a body that is not JSON...).
Each response must be:

- never a 5xx;
- what the schema documents: a status it lists, its content type, its body schema;
- for a schema-invalid request, a refusal (4xx), not a silent coercion;
- for every 4xx, an OpenAI error object whose ``param`` names a field of the request
  and whose message names that field too.

Deterministic (``derandomize``: the same examples on every run, no example database)
and small (a few examples per operation, at most a few tokens per request), so it is a
regression test of the server's validation, not a search: a bug found once by a long
run becomes a case of its own (``test_server_utils.py``, or ``ODD_BODIES`` below for
inputs a schema-driven generator rarely reaches).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.entrypoints.openai.server_process import API_KEY  # noqa: E402

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Bounds that keep each request cheap; what they cap is still checked by the server
# (max_tokens is capped by the room left in the context, n by SamplingParams).
MAX_TOKENS = 3
MAX_N = 2
EXAMPLES = {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 15}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def _cheap(body: Any) -> None:
    """Cap the request's output, in place, where it is a plain count (kept invalid
    values stay as they are: refusing them is the point)."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if type(value) is int and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "messages" in body and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS  # chat's default is the whole context
    if type(body.get("n")) is int and body["n"] > MAX_N:
        body["n"] = MAX_N


def _top_field(param: str) -> str:
    """``messages[0].role`` -> ``messages``."""
    return re.split(r"[.\[]", param, maxsplit=1)[0]


def check_error_object(response: Any) -> None:
    """Every 4xx is ``{"error": {message, type, param, code}}`` naming the bad field."""
    if not 400 <= response.status_code < 500:
        return
    content_type = response.headers["content-type"]  # schemathesis: a list of values
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type.startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == response.status_code, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    param = error["param"]
    assert isinstance(param, str) and param, f"no field named: {error}"
    assert _top_field(param) in error["message"], f"the message does not name {param}: {error}"


def _fuzz(server: Any, schema: Any, mode: GenerationMode) -> None:
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        ok = operation.definition.raw["responses"].get("200", {}).get("content", {})
        if set(ok) == {"text/event-stream"}:
            continue  # a stream that lasts as long as its client listens: test_live*.py
        sends = bool(operation.body) or any(operation.iter_parameters())
        if mode is GenerationMode.NEGATIVE and not sends:
            continue  # nothing a client sends (GET /health...): no invalid request exists

        @settings(
            max_examples=EXAMPLES[mode],
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
                case.body.pop("model", None)  # omitted: the served model, so it runs
            _cheap(case.body)
            response = case.call(base_url=server.url, headers=AUTH, timeout=60)
            case.validate_response(response, checks=CHECKS)
            try:
                check_error_object(response)
            except AssertionError as exc:  # hypothesis cannot show a Case: say what was sent
                raise AssertionError(f"{exc}\n{case.as_curl_command()}") from None

        run()


def test_schema_valid_requests(server, schema) -> None:
    _fuzz(server, schema, GenerationMode.POSITIVE)


def test_schema_invalid_requests(server, schema) -> None:
    _fuzz(server, schema, GenerationMode.NEGATIVE)


# Inputs a schema-driven generator rarely reaches: each must be a 400 naming the field,
# and the server must go on serving.
ODD_BODIES = [
    ({"prompt": ["a"] * 16385}, "prompt", "16385 sequences"),  # refused before tokenizing
    ({"prompt": ["a"] * 8193, "n": 2, "temperature": 1.0}, "prompt", "16386 sequences"),
    ('{"prompt": ' + "[" * 5000 + "1" + "]" * 5000 + "}", "body", "body"),  # nested too deep
    ('{"prompt": "\\ud800"}', "prompt", "lone surrogate"),  # valid JSON, not text
    ('{"prompt": "p", "stop": ["\\udc00"]}', "stop", "lone surrogate"),
    ('{"prompt": "p", "temperature": NaN}', "temperature", "finite"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [[]]}, "prompt", "empty"),
    ({"prompt": None}, "prompt", "must be a string"),
    ("null", "body", "object"),
    ("[1, 2]", "body", "object"),
]


@pytest.mark.parametrize(("body", "param", "words"), ODD_BODIES)
def test_odd_inputs_are_refused_cleanly(server, body: Any, param: str, words: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(
        server.url + "/v1/completions",
        content=content,
        headers={"Content-Type": "application/json", **AUTH},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    check_error_object(r)
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    ok = httpx.post(
        server.url + "/v1/completions", json={"prompt": "p", "max_tokens": 1}, headers=AUTH
    )
    assert ok.status_code == 200
