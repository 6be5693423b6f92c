"""The live view's JSON: /v1/live and /v1/live/stream against the engine's own counters,
and recording that follows the viewers (on while one watches, off when the last leaves).

One ``minivllm serve --no-playground`` on the demo model serves every test here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.entrypoints.openai.server_process import ENGINE_ARGS, RemoteOpenAIServer

WAIT_S = 30.0


@pytest.fixture(scope="module")
def server() -> Iterator[RemoteOpenAIServer]:
    with RemoteOpenAIServer(extra_args=["--no-playground"]) as remote:
        yield remote


def live(server: RemoteOpenAIServer, watch: bool = False) -> dict:
    response = httpx.get(f"{server.url}/v1/live", params={"watch": watch}, timeout=30)
    response.raise_for_status()
    return response.json()


def wait_until(server: RemoteOpenAIServer, done, what: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not done(state := live(server)):
        if time.monotonic() > deadline:
            pytest.fail(f"never {what}: {state}")
        time.sleep(0.05)
    return state


def sse_events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line.removeprefix("data: "))


def complete(server: RemoteOpenAIServer, prompts: list[str], max_tokens: int) -> dict:
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": prompts, "max_tokens": max_tokens, "ignore_eos": True},
        timeout=120,
    )
    response.raise_for_status()
    return response.json()


def check_record(record: dict) -> None:
    """What a record says about the pool adds up, and agrees with the engine's rules."""
    n, tables = record["num_blocks"], record["kv_tables"]
    assert n == ENGINE_ARGS["num_kv_blocks"]
    assert list(tables) == [rid for rid in record["running"] if rid in tables]
    held = [b for table in tables.values() for b in table]
    assert len(set(held)) == record["num_used_blocks"] == n - record["num_free_blocks"]
    shared = sorted(b for b in set(held) if held.count(b) > 1)
    assert record["kv_shared"] == shared
    cached_free = record["kv_cached_free"]
    assert len(cached_free) == record["num_cached_free_blocks"] <= record["num_cached_blocks"]
    assert not set(cached_free) & set(held)
    assert record["num_scheduled_tokens"] <= record["token_budget"]
    assert record["num_scheduled_tokens"] == sum(
        s["num_prefill_tokens"] + s["num_decode_tokens"] + s["num_draft_tokens"]
        for s in record["scheduled"]
    )
    bs = record["block_size"]
    for s in record["scheduled"]:
        # A request holds exactly the blocks its computed plus scheduled tokens need.
        tokens = (
            s["num_computed_tokens"]
            + s["num_prefill_tokens"]
            + s["num_decode_tokens"]
            + s["num_draft_tokens"]
        )
        assert (
            s["num_accepted_tokens"] is None
            or 0 <= s["num_accepted_tokens"] <= (s["num_draft_tokens"])
        )
        assert s["num_blocks"] == len(tables[s["request_id"]]) == -(-tokens // bs), s


def test_page_and_static_files(server: RemoteOpenAIServer) -> None:
    page = httpx.get(server.url + "/", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert '<script src="/static/live.js">' in page.text
    for name in ("live.js", "live.css"):
        assert httpx.get(f"{server.url}/static/{name}", timeout=10).status_code == 200
    for name in ("index.html", "nope.js"):
        missing = httpx.get(f"{server.url}/static/{name}", timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "name"
    # A path out of the folder is no static file either (no route even matches it).
    assert httpx.get(f"{server.url}/static/..%2Fopenai%2Flive.py", timeout=10).status_code == 404


def test_recording_follows_viewers_and_records_match_the_engine(
    server: RemoteOpenAIServer,
) -> None:
    state = live(server)
    assert state["playground"] is False  # --no-playground
    assert state["recording"] is False and state["viewers"] == 0 and state["record"] is None

    records = []
    with httpx.stream("GET", f"{server.url}/v1/live/stream", timeout=60) as stream:
        events = sse_events(stream)
        first = next(events)["record"]  # the core's state the moment recording began
        assert first is not None and first["scheduled"] == [] and first["num_used_blocks"] == 0
        assert live(server)["recording"] is True and live(server)["viewers"] == 1
        answer = complete(server, ["And God said, Let there be light"] * 4, max_tokens=48)
        for event in events:
            if event["record"] is not None:
                records.append(event["record"])
                check_record(records[-1])
                if records[-1]["scheduled"] == [] and records[-1]["finished"]:
                    break  # the idle pool after the last request finished
    # The stream is closed: recording goes off with the last viewer.
    state = wait_until(server, lambda s: not s["recording"] and s["viewers"] == 0, "off")

    assert max(len(r["scheduled"]) for r in records) >= 2
    assert sum(len(r["finished"]) for r in records) == 4
    idle, stats = records[-1], state["stats"]
    assert idle == state["record"]
    assert idle["step"] == stats["num_steps"] and idle["num_blocks"] == stats["num_kv_blocks"]
    assert idle["running"] == [] and stats["num_running_reqs"] == 0
    assert idle["num_used_blocks"] == round(stats["kv_cache_usage"] * idle["num_blocks"]) == 0
    assert idle["num_cached_blocks"] > 0  # the prompts' full blocks stay cached
    # The rolling metrics saw every generated token of the request.
    metrics = state["metrics"]
    assert metrics["num_generation_tokens"] == answer["usage"]["completion_tokens"] == 4 * 48
    assert metrics["ttft_ms"]["count"] == 4 and metrics["itl_ms"]["count"] == 4 * 47
    assert metrics["tokens_per_s"] == pytest.approx(192 / metrics["window_s"])

    # Nobody watches: the engine makes no records (the latest one stays as it was).
    complete(server, ["In the beginning"], max_tokens=8)
    assert live(server)["record"] == idle

    # A poll watches too: it turns recording on and answers with a fresh record.
    state = live(server, watch=True)
    assert state["recording"] is True and state["viewers"] == 1
    assert state["record"]["timestamp"] > idle["timestamp"]
    assert state["record"]["step"] == state["stats"]["num_steps"] == idle["step"] + 8


def test_live_stat_logger_window() -> None:
    from minivllm.entrypoints.openai.live import LiveStatLogger
    from minivllm.metrics.stats import IterationStats

    now = [1000.0]
    logger = LiveStatLogger(window_s=10.0, clock=lambda: now[0])
    for _ in range(20):  # one step a second, 100 ITLs of 1..100 ms each
        stats = IterationStats(iteration_timestamp=now[0])
        stats.num_generation_tokens = 101
        stats.time_to_first_tokens_iter = [0.5]
        stats.inter_token_latencies_iter = [i / 1000 for i in range(1, 101)]
        logger.record(None, stats)
        now[0] += 1.0
    snap = logger.snapshot()
    # Only the steps of the last ten seconds count, exactly; quantiles from a sample.
    assert snap["num_generation_tokens"] == 10 * 101 and snap["tokens_per_s"] == 101
    assert snap["ttft_ms"]["count"] == 10 and snap["ttft_ms"]["p50"] == pytest.approx(500)
    assert snap["itl_ms"]["count"] == 1000
    assert snap["itl_ms"]["mean"] == pytest.approx(50.5)
    assert 25 <= snap["itl_ms"]["p50"] <= 75 and snap["itl_ms"]["p90"] >= 75
    now[0] += 60.0  # idle for a minute: nothing left in the window
    snap = logger.snapshot()
    assert snap["num_generation_tokens"] == 0 and snap["itl_ms"]["p50"] is None
