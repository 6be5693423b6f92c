"""``minivllm serve`` end to end: the official ``openai`` client against a live server.

The package's shared server (conftest.py) serves most tests; its outputs are compared
with ``LLM.generate`` / ``LLM.chat`` run in this process with the same engine arguments.
The engine-kill test starts a short-lived server of its own; the Ctrl-C test stops the
shared one, after every other test of the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minivllm import LLM, SamplingParams
from minivllm.demo import demo_model_path
from tests.entrypoints.openai.server_process import (
    API_KEY,
    ENGINE_ARGS,
    RemoteOpenAIServer,
    pid_alive,
)
from tests.entrypoints.openai.server_process import SERVED_MODEL_NAME as MODEL

PROMPTS = ["In the beginning", "And God said", "Love is", "The LORD is my shepherd"]
CHAT = [{"role": "user", "content": "Who made the heaven and the earth?"}]


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # --api-key API_KEY --served-model-name MODEL


@pytest.fixture(scope="module")
def llm():
    return LLM(str(demo_model_path()), **ENGINE_ARGS)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def metrics(server) -> dict[str, float]:
    """``/metrics`` parsed with prometheus_client's parser: sample name+labels -> value."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_models_health_version(server, client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


def test_completions_equal_llm_generate(client, llm) -> None:
    offline = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=24, temperature=0)
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert [c.text for c in resp.choices] == [o.outputs[0].text for o in offline]
    assert [c.finish_reason for c in resp.choices] == [o.outputs[0].finish_reason for o in offline]
    assert resp.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline)
    assert resp.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in offline)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_streamed_completion_joins_to_the_full_text(client, llm) -> None:
    [offline] = llm.generate(PROMPTS[0], greedy(40, ignore_eos=True), use_tqdm=False)
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) > 5  # really streamed, not one chunk at the end
    assert "".join(pieces) == offline.outputs[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 40
    assert chunks[-1].usage.prompt_tokens == len(offline.prompt_token_ids)


def test_chat_equals_llm_chat_streamed_and_not(client, llm) -> None:
    [offline] = llm.chat(CHAT, greedy(32), use_tqdm=False)
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=32, temperature=0)
    assert resp.id.startswith("chatcmpl-")
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == offline.outputs[0].text
    assert resp.choices[0].finish_reason == offline.outputs[0].finish_reason
    assert resp.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert resp.usage.completion_tokens == len(offline.outputs[0].token_ids)
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=32, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == offline.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == offline.outputs[0].finish_reason


def test_n2_seed_and_stop_behave_as_offline(client, llm) -> None:
    params = SamplingParams(n=2, temperature=0.9, seed=7, max_tokens=20)
    [offline] = llm.generate(PROMPTS[1], params, use_tqdm=False)
    resp = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], n=2, temperature=0.9, seed=7, max_tokens=20
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert [c.text for c in resp.choices] == [o.text for o in offline.outputs]
    # Streamed: each sample's chunks carry its index and join to the same texts.
    texts = ["", ""]
    for chunk in client.completions.create(
        model=MODEL, prompt=PROMPTS[1], n=2, temperature=0.9, seed=7, max_tokens=20, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [o.text for o in offline.outputs]
    # A stop string: the text ends before it, finish_reason "stop", as offline.
    [offline_stop] = llm.generate(PROMPTS[0], greedy(40, stop=[","]), use_tqdm=False)
    resp = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[","]
    )
    assert resp.choices[0].text == offline_stop.outputs[0].text
    assert resp.choices[0].finish_reason == offline_stop.outputs[0].finish_reason == "stop"


def test_logprobs_as_offline(client, llm) -> None:
    [offline] = llm.generate(PROMPTS[0], greedy(8, logprobs=3), use_tqdm=False)
    out = offline.outputs[0]
    resp = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(out.token_ids)
    for i, token_id in enumerate(out.token_ids):
        # Same tokens; the logprobs come from differently shaped batches (the server's
        # prefill may share a step with another test's request), so the float32 sums run
        # in another order: equal to ~1e-5, not bit for bit.
        assert lp.token_logprobs[i] == pytest.approx(out.logprobs[i][token_id].logprob, abs=1e-3)
        assert len(lp.top_logprobs[i]) == 3  # greedy: the chosen token is the top-1
    assert resp.choices[0].finish_reason == "length"  # (an EOS token has text, "<|eos|>")
    assert "".join(lp.tokens) == resp.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)


def test_64_concurrent_streams(server, llm) -> None:
    prompts = [
        f"{PROMPTS[i % 4]} {word}" for i, word in enumerate(("and", "of", "the", "unto") * 16)
    ]
    assert len(prompts) == 64
    offline = llm.generate(prompts, greedy(12), use_tqdm=False)
    before = metrics(server)

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def burst() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120
        ) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(burst()) == [o.outputs[0].text for o in offline]
    after = metrics(server)

    def delta(key: str) -> float:
        return after[key] - before[key]

    # The counters match what was sent and received.
    assert delta("vllm:prompt_tokens_total{}") == sum(len(o.prompt_token_ids) for o in offline)
    assert delta("vllm:generation_tokens_total{}") == sum(
        len(o.outputs[0].token_ids) for o in offline
    )
    finished = [f"vllm:request_success_total{{finished_reason={r}}}" for r in ("stop", "length")]
    assert sum(delta(k) for k in finished) == 64
    # A step counts the prompt tokens of the requests that got their first token in it and
    # one token per request that advanced. Each prompt is at most 8 tokens, so one request
    # alone never makes a step of more than 9: steps above 16 tokens served several
    # requests at once.
    assert all(len(o.prompt_token_ids) <= 8 for o in offline)
    le16 = "vllm:iteration_tokens_total_bucket{le=16.0}"
    assert delta("vllm:iteration_tokens_total_count{}") - delta(le16) > 0


def post(server, path: str, body: dict, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def assert_still_serving(client) -> None:
    resp = client.completions.create(model=MODEL, prompt="Love is", max_tokens=2)
    assert resp.usage.completion_tokens >= 1


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"model": MODEL, "prompt": "x", "max_tokens": "many"}, 400, "max_tokens", "integer"),
        ({"model": MODEL, "prompt": "x", "top_p": 7}, 400, "top_p", "top_p"),
        ({"model": MODEL, "prompt": "x " * 400}, 400, "prompt", "maximum context length"),
        ({"model": MODEL, "prompt": [5, 99999]}, 400, None, "99999"),
        ({"model": "gpt-4", "prompt": "x"}, 404, "model", "gpt-4"),
    ],
    ids=["wrong-type", "out-of-range", "too-long", "bad-token-id", "unknown-model"],
)
def test_errors_then_still_serving(server, client, body, status, param, words) -> None:
    for stream in (False, True):
        r = post(server, "/v1/completions", {**body, "stream": stream})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == status and words in error["message"]
        if param is not None:
            assert error["param"] == param
    assert_still_serving(client)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": [{"role": "user", "content": "x " * 400}]}, "messages", "maximum context"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role", "Field required"),
        ({"messages": CHAT, "top_logprobs": 2}, "body", "top_logprobs needs logprobs"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "text"),
    ],
    ids=["too-long", "no-role", "top-logprobs-alone", "image-part"],
)
def test_chat_errors_then_still_serving(server, client, body, param, words) -> None:
    r = post(server, "/v1/chat/completions", {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["param"] == param
    assert_still_serving(client)


def test_auth(server, client) -> None:
    for key in (None, "sk-wrong"):
        r = post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=key)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "AuthenticationError"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    # /health and /metrics stay open, as upstream.
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    assert_still_serving(client)


def test_tokenize_detokenize(server, llm) -> None:
    tok = llm.get_tokenizer()
    r = post(server, "/tokenize", {"prompt": "In the beginning"}).json()
    assert r["tokens"] == tok.encode("In the beginning") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == ENGINE_ARGS["max_model_len"]
    chat = post(server, "/tokenize", {"messages": CHAT}).json()
    [offline] = llm.chat(CHAT, greedy(1), use_tqdm=False)
    assert chat["tokens"] == offline.prompt_token_ids
    assert post(server, "/detokenize", {"tokens": r["tokens"]}).json() == {
        "prompt": "In the beginning"
    }
    bad = post(server, "/detokenize", {"tokens": [1, 10**6]})
    assert bad.status_code == 400 and "tokens[1]" in bad.json()["error"]["message"]


def _usage(server) -> tuple[float, float]:
    m = metrics(server)
    return m["vllm:kv_cache_usage_perc{}"], m["vllm:num_requests_running{}"]


def _wait_idle(server, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _usage(server) != (0.0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _usage(server) == (0.0, 0.0)


LONG = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 200, "ignore_eos": True}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_disconnect_mid_stream_frees_the_kv_blocks(server, client) -> None:
    assert_still_serving(client)
    _wait_idle(server)
    generated = metrics(server)["vllm:generation_tokens_total{}"]
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={**LONG, "stream": True},
        headers=AUTH,
        timeout=60,
    ) as r:
        lines = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(json.loads(line[6:]))
            if len(lines) == 3:
                mid_stream = _usage(server)  # (leaving the loop closes the connection)
                break
    assert lines[-1]["choices"][0]["finish_reason"] is None  # cut mid-stream
    assert mid_stream[0] > 0.0 and mid_stream[1] == 1.0
    _wait_idle(server)
    # Aborted, not run to its end.
    assert metrics(server)["vllm:generation_tokens_total{}"] - generated < 200


def test_disconnect_while_waiting_for_a_full_response_aborts(server) -> None:
    _wait_idle(server)
    generated = metrics(server)["vllm:generation_tokens_total{}"]

    async def give_up_once_running() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            request = asyncio.ensure_future(
                http.post(server.url + "/v1/completions", json=LONG, headers=AUTH)
            )
            while _usage(server)[1] != 1.0:
                assert not request.done(), "the request finished before it was seen running"
                await asyncio.sleep(0.01)
            request.cancel()  # closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                await request

    asyncio.run(give_up_once_running())
    _wait_idle(server)
    assert metrics(server)["vllm:generation_tokens_total{}"] - generated < 200


def test_dead_engine_core_is_a_500_and_health_503() -> None:
    with RemoteOpenAIServer() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        model = str(demo_model_path())  # no --served-model-name: the model's path
        assert client.completions.create(model=model, prompt="Love is", max_tokens=2)
        os.kill(srv.engine_core_pid(), signal.SIGKILL)
        start = time.monotonic()
        deadline = start + 15
        while httpx.get(srv.url + "/health").status_code != 503:
            assert time.monotonic() < deadline, "/health never reported the dead engine"
            time.sleep(0.2)
        for stream in (False, True):
            r = httpx.post(
                srv.url + "/v1/completions",
                timeout=30,
                json={"prompt": "Love is", "max_tokens": 2, "stream": stream},
            )
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "InternalServerError"
        assert time.monotonic() - start < 30
        # SIGTERM still stops the server whose engine is gone.
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(30)


@pytest.mark.stops_shared_server
def test_sigint_stops_server_and_engine_core(server) -> None:
    """Last in the package: it stops the shared server (as Ctrl-C in a terminal would)."""
    core = server.engine_core_pid()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(30) == 0
    deadline = time.monotonic() + 10
    while pid_alive(core) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(core), f"engine core {core} outlived the server"
    assert "Traceback" not in server.logs(), server.logs()
