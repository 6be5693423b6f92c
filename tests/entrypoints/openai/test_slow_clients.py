"""Clients that misbehave at the socket level: they stall mid-body, never read their
stream, or open and drop connections by the hundred. None of them may slow the others
into timeouts, hold KV blocks once they are gone, or leave the server unhealthy.

Why it holds (docs/api_server.md, "Validation and robustness"): uvicorn serves each
connection in its own task, so a body that never arrives parks only its own
``receive()``; the engine's output handler puts each step's outputs into per-request
collectors that merge and never block, so a stream that nobody reads stalls only its
own ``send()``; a closed connection cancels its route, which aborts its requests.

The timeouts below only turn a hang into a failure; nothing here measures speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.openai.server_process import RemoteOpenAIServer

PROMPT = "In the beginning"
# A stream long enough to fill the socket buffers of a client that does not read:
# 5 alternatives per token make each chunk a few hundred bytes.
LONG_STREAM = {"prompt": PROMPT, "max_tokens": 480, "ignore_eos": True, "logprobs": 5}


@pytest.fixture(scope="module")
def server():
    with RemoteOpenAIServer(["--max-model-len", "512"]) as srv:
        yield srv


def metrics(server) -> dict[str, float]:
    """``/metrics`` as ``name{labels}`` -> value (the model_name label left out)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def ended(server) -> float:
    """Requests that ran to a stop condition or their length."""
    m = metrics(server)
    return sum(m[f"vllm:request_success_total{{finished_reason={r}}}"] for r in ("stop", "length"))


def aborted(server) -> float:
    """Requests aborted, a client's leaving included."""
    return metrics(server)["vllm:request_success_total{finished_reason=abort}"]


def generated(server) -> float:
    return metrics(server)["vllm:generation_tokens_total{}"]


def busy(server) -> tuple[float, float]:
    """(KV cache usage, running requests): (0, 0) when the pool is full and idle."""
    m = metrics(server)
    return m["vllm:kv_cache_usage_perc{}"], m["vllm:num_requests_running{}"]


def wait_idle(server, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while busy(server) != (0.0, 0.0):
        assert time.monotonic() < deadline, f"still busy: {busy(server)}"
        time.sleep(0.05)


def num_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(server, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:  # before connect: it sets the window the server may fill
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    return sock


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a killed client would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def request_bytes(body: dict | bytes, content_length: int | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    length = len(data) if content_length is None else content_length
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    return head.encode() + data


async def stream_text(http: httpx.AsyncClient, server) -> tuple[str, int]:
    """One greedy stream of 16 tokens: its text and its completion-token count."""
    body = {
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, tokens = "", 0
    async with http.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    text += chunk["choices"][0]["text"]
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return text, tokens


async def serve_others(server, n: int = 8) -> tuple[list[str], int]:
    """``n`` streaming clients at once; each must finish (60 s: a hang, not a speed).
    Their texts and the tokens they generated in all."""
    async with httpx.AsyncClient(timeout=60) as http:
        results = await asyncio.gather(*(stream_text(http, server) for _ in range(n)))
    return [text for text, _ in results], sum(tokens for _, tokens in results)


def test_stalled_bodies_do_not_block_others(server) -> None:
    wait_idle(server)
    full = json.dumps({"prompt": PROMPT, "max_tokens": 4}).encode()
    half = connect(server)  # headers and part of the body, then nothing
    half.sendall(request_bytes(full[: len(full) // 2], content_length=len(full)))
    headers_only = connect(server)  # the headers promise a body that never comes
    headers_only.sendall(request_bytes(b"", content_length=len(full)))
    try:
        texts, _ = asyncio.run(serve_others(server))
        assert len(set(texts)) == 1 and texts[0]  # greedy: all the same, none empty
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        # The stalled one completes once the rest of its body arrives.
        half.sendall(full[len(full) // 2 :])
        status_line = half.recv(4096).split(b"\r\n", 1)[0]
        assert status_line == b"HTTP/1.1 200 OK", status_line
    finally:
        half.close()
        reset(headers_only)
    wait_idle(server)


def test_a_stream_nobody_reads_stalls_only_itself(server) -> None:
    wait_idle(server)
    ended_before, aborted_before = ended(server), aborted(server)
    generated_before = generated(server)
    stuck = connect(server, rcvbuf=1024)
    stuck.sendall(request_bytes({**LONG_STREAM, "stream": True}))
    try:
        deadline = time.monotonic() + 30
        while busy(server)[1] < 1:  # it runs; its client reads nothing from now on
            assert time.monotonic() < deadline
            time.sleep(0.02)
        texts, others = asyncio.run(serve_others(server))
        assert len(set(texts)) == 1 and texts[0]
        # Typically still generating: the engine kept going, nobody waited for the client.
        # Far from its end (64 tokens left are 64 steps, the abort takes one), so the
        # reset below must abort it rather than race its last token.
        stuck_tokens = generated(server) - generated_before - others
        far_from_done = busy(server)[1] == 1 and stuck_tokens < LONG_STREAM["max_tokens"] - 64
    finally:
        reset(stuck)
    wait_idle(server)
    stuck_tokens = generated(server) - generated_before - others
    ran_out = stuck_tokens == LONG_STREAM["max_tokens"]
    assert ended(server) - ended_before == 8 + ran_out
    assert aborted(server) - aborted_before == (not ran_out)
    if far_from_done:  # the stuck client left first: its request was aborted, not run out
        assert not ran_out
    assert asyncio.run(serve_others(server, 1))[0][0]


def test_many_connections_opened_and_dropped(server) -> None:
    wait_idle(server)
    fds = num_fds(server.proc.pid)
    stream = request_bytes({**LONG_STREAM, "stream": True})
    full = request_bytes({**LONG_STREAM, "max_tokens": 64})
    socks = []
    for i in range(150):
        sock = connect(server)
        kind = i % 5
        if kind == 1:
            sock.sendall(stream)
        elif kind == 2:
            sock.sendall(full)
        elif kind == 3:
            sock.sendall(stream[: len(stream) // 3])
        elif kind == 4:
            sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        socks.append(sock)
    time.sleep(0.5)  # let the requests reach the engine, so dropping them aborts
    for i, sock in enumerate(socks):
        if i % 2:
            reset(sock)
        else:
            sock.close()
    wait_idle(server)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert asyncio.run(serve_others(server, 2))[0][0]
    # Every connection is closed on the server's side too (a few fds of slack: uvicorn
    # may hold a listening or wakeup descriptor it opened meanwhile).
    deadline = time.monotonic() + 10
    while num_fds(server.proc.pid) > fds + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert num_fds(server.proc.pid) <= fds + 4
