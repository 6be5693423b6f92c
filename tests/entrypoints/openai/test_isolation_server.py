"""``minivllm serve``: a request that fails inside the engine gets a 500, alone.

The server runs a poisoned tiny model as in ``tests/engine/test_isolation.py``: the
embedding of one token is NaN, and that token is the one ``MID`` generates fifth, so
``MID`` fails mid-stream (its sixth step reads the poisoned token; five steps leave the
server ample time to send the first chunk) and a prompt holding the token fails at
once. Sent together with good requests: the failed ones get an OpenAI error object
(HTTP 500), or, already streaming, an error event and ``[DONE]``; the good ones get the
completions they get alone, and the server stays healthy.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from minivllm import LLM, SamplingParams
from tests.engine.test_isolation import ARGS, GOOD, poisoned_model
from tests.entrypoints.openai import server_process
from tests.entrypoints.openai.server_process import RemoteOpenAIServer
from tests.tiny_models import add_tiny_tokenizer, make_tiny_model

pytestmark = pytest.mark.timeout(300)

MID = [70, 71, 72, 73]
BODY = {"model": "tiny", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


def _fifth_token_of_mid(tmp_path) -> int:
    """The token ``MID`` generates fifth on the clean model; used by no good request."""
    llm = LLM(str(make_tiny_model("llama", tmp_path)), **ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in [MID, *GOOD]], params, use_tqdm=False)
    mid = outs[0].outputs[0].token_ids
    used = {t for o in outs[1:] for t in [*o.prompt_token_ids, *o.outputs[0].token_ids]}
    assert mid[4] not in used | set(MID) | set(mid[:4])
    return mid[4]


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> int:
    return _fifth_token_of_mid(tmp_path_factory.mktemp("clean"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, poisoned: int):
    path = add_tiny_tokenizer(poisoned_model(tmp_path_factory.mktemp("poisoned"), poisoned))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server_process, "demo_model_path", lambda: path)
        with RemoteOpenAIServer(["--served-model-name", "tiny"]) as srv:
            yield srv


async def _complete(client: httpx.AsyncClient, prompt: list[int]) -> httpx.Response:
    return await client.post("/v1/completions", json={**BODY, "prompt": prompt})


async def _stream(client: httpx.AsyncClient, prompt: list[int]) -> list[str]:
    body = {**BODY, "prompt": prompt, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines() if line.startswith("data: ")]


def test_only_the_failed_requests_get_an_error(server, poisoned: int) -> None:
    bad = [21, poisoned, 22]

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            together = await asyncio.gather(
                _complete(client, MID),
                _stream(client, MID),
                _complete(client, bad),
                client.post("/v1/completions", json={**BODY, "prompt": bad, "stream": True}),
                *(_complete(client, p) for p in GOOD),
            )
            alone = [await _complete(client, p) for p in GOOD]
            health = await client.get("/health")
            return together, alone, health

    (mid, mid_stream, bad_now, bad_stream, *good), alone, health = asyncio.run(run())
    for response in (mid, bad_now, bad_stream):  # failed before any text was sent
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "InternalServerError" and error["code"] == 500
        assert "not finite" in error["message"]
    # Streaming already: the text so far, then the error as an event, then the end.
    assert "choices" in json.loads(mid_stream[0].removeprefix("data: "))
    assert mid_stream[-1] == "data: [DONE]"
    event = json.loads(mid_stream[-2].removeprefix("data: "))
    assert event["error"]["code"] == 500 and "not finite" in event["error"]["message"]
    for response, solo in zip(good, alone):
        assert response.status_code == 200 and solo.status_code == 200
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["text"] == solo.json()["choices"][0]["text"]
    assert health.status_code == 200
