"""The soak test through ``minivllm serve``: start it, stream at it, check it at the end.

The clients are the official ``openai`` package's ``AsyncOpenAI`` (a test dependency:
``pip install openai``), streaming concurrently and disconnecting at random
(``soak_drivers.drive_server``). The server runs in its own process group, which is
always stopped, whatever happens.

At the end the server must still be healthy (``/health`` 200), its ``/metrics`` must
show an empty KV pool and no request running or waiting (the pool's usage times its
size is the number of leaked blocks), and its finished-request counters must agree with
what the clients saw: every sample a client saw finish with ``stop`` or ``length`` is
counted, and the only extra ones are samples of requests whose client left while they
were finishing; no request failed with ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from minivllm.benchmarks.soak_check import Observed
from minivllm.benchmarks.soak_drivers import DriverResult, drive_server
from minivllm.benchmarks.soak_workload import SoakRequest

MODEL_NAME = "soak"


def read_metrics(url: str) -> dict[str, float]:
    """``/metrics`` parsed: ``name{labels}`` (model name left out) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _success(m: dict[str, float], reason: str) -> float:
    return m.get(f"vllm:request_success_total{{finished_reason={reason}}}", 0.0)


def settled_metrics(url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """The server's metrics once no request runs or waits and the pool is empty (the
    last read after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = read_metrics(url)
        idle = (
            m.get("vllm:kv_cache_usage_perc{}") == 0.0
            and m.get("vllm:num_requests_running{}") == 0.0
            and m.get("vllm:num_requests_waiting{}") == 0.0
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def server_checks(
    url: str,
    before: dict[str, float],
    workload: list[SoakRequest],
    observed: dict[int, Observed],
    num_kv_blocks: int,
) -> DriverResult:
    """Health, idle pool and queue, and counters against what the clients saw."""
    after = settled_metrics(url)
    health = httpx.get(url + "/health", timeout=30).status_code
    seen = {
        reason: sum(
            c.finish_reason == reason for o in observed.values() for c in o.completions.values()
        )
        for reason in ("stop", "length")
    }
    counted = {
        reason: _success(after, reason) - _success(before, reason)
        for reason in ("stop", "length", "abort", "error")
    }
    # Samples of requests whose client left: the server may have finished them.
    unseen = sum(r.params.n for r in workload if observed[r.index].aborted)
    extra = counted["stop"] + counted["length"] - seen["stop"] - seen["length"]
    usage = after.get("vllm:kv_cache_usage_perc{}", -1.0)
    checks = {
        "health_200": health == 200,
        "no_request_running_or_waiting": after.get("vllm:num_requests_running{}") == 0.0
        and after.get("vllm:num_requests_waiting{}") == 0.0,
        "finished_counters_agree": counted["stop"] >= seen["stop"]
        and counted["length"] >= seen["length"]
        and 0 <= extra <= unseen,
        "no_error_finish": counted["error"] == 0,
    }
    unfinished = int(
        after.get("vllm:num_requests_running{}", 0) + after.get("vllm:num_requests_waiting{}", 0)
    )
    stats = {
        key: int(after.get(f"vllm:{name}_total{{}}", 0) - before.get(f"vllm:{name}_total{{}}", 0))
        for key, name in (
            ("num_preemptions", "num_preemptions"),
            ("prefix_cache_hits", "prefix_cache_hits"),
            ("prefix_cache_queries", "prefix_cache_queries"),
        )
    }
    server = {
        "health_status": health,
        "success_counted": counted,
        "finishes_seen": seen,
        "checks": checks,
    }
    return DriverResult(observed, round(usage * num_kv_blocks), unfinished, stats, server)


async def soak_server(
    url: str,
    workload: list[SoakRequest],
    num_kv_blocks: int,
    max_in_flight: int = 64,
    model: str = MODEL_NAME,
    api_key: str = "none",
    deadline: float | None = None,
) -> DriverResult:
    """Run ``workload`` against the server at ``url`` and check it afterwards."""
    import openai

    before = read_metrics(url)
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=600
    ) as client:
        observed = await drive_server(client, model, workload, max_in_flight, deadline)
    return await asyncio.to_thread(server_checks, url, before, workload, observed, num_kv_blocks)


@contextlib.contextmanager
def serve(model: str, engine_kwargs: dict[str, Any], timeout_s: float = 300.0) -> Iterator[str]:
    """``minivllm serve`` on a free local port for the ``with`` block; yields its URL.

    The server runs in a session of its own, so stopping it takes its engine core along.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [
        sys.executable,
        "-m",
        "minivllm.cli",
        "serve",
        model,
        "--port",
        str(port),
        "--served-model-name",
        MODEL_NAME,
        "--uvicorn-log-level",
        "warning",
    ]
    for name, value in engine_kwargs.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    url = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("w+", prefix="minivllm-soak-", suffix=".log") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
        )
        try:
            _wait_healthy(url, proc, timeout_s, Path(log.name))
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"minivllm serve exited ({proc.returncode}):\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"minivllm serve was not healthy in {timeout_s} s:\n{log.read_text()}")


def run_server_soak(
    model: str,
    engine_kwargs: dict[str, Any],
    workload: list[SoakRequest],
    max_in_flight: int,
    max_seconds: float | None = None,
) -> DriverResult:
    """Start a server with ``engine_kwargs``, soak it (sending no new request after
    ``max_seconds``), stop it."""
    try:
        import openai  # noqa: F401
    except ImportError as exc:
        raise ValueError("--engine server needs the openai package: pip install openai") from exc
    with serve(model, engine_kwargs) as url:
        deadline = time.monotonic() + max_seconds if max_seconds else None
        return asyncio.run(
            soak_server(
                url, workload, engine_kwargs["num_kv_blocks"], max_in_flight, deadline=deadline
            )
        )
