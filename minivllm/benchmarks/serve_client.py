"""The HTTP client of ``minivllm bench serve``: streamed completions sent at planned
arrival times, timed chunk by chunk, from one or several client processes.

Upstream counterpart: ``async_request_openai_completions`` in
``vllm/benchmarks/lib/endpoint_request_func.py`` and the arrival loop of
``vllm/benchmarks/serve.py``.

Why several processes: at saturation the server streams tens of thousands of chunks per
second, and parsing HTTP in Python (h11, under httpx) costs tens of microseconds per
chunk. One client process would then fall behind, and its lag would show up as the
server's latency. The requests are therefore dealt round-robin to ``num_processes``
client processes that share one start time, so arrival times stay those of one Poisson
process.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import queue
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from minivllm.benchmarks.workloads import Workload


@dataclass
class RequestResult:
    """What the client saw of one request (seconds, from its own clock)."""

    prompt_len: int
    expected_output_len: int
    success: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    """``time.perf_counter()`` when the request was sent (one clock for the whole host)."""


@dataclass
class Target:
    """Where and as what the requests go."""

    base_url: str
    endpoint: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


def arrival_times(num: int, rate: float, seed: int) -> list[float]:
    """Start offsets in seconds: a Poisson process of ``rate`` (all 0 for ``inf``)."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    times, t = [], 0.0
    for i in range(num):
        if i:
            t += rng.expovariate(rate)  # exponential gaps
        times.append(t)
    return times


class LiveViewer:
    """One viewer of the live page's stream (``--live-viewer``), in a thread.

    It receives and parses every event of ``GET /v1/live/stream`` as the page would, so
    a run with it measures the engine with one browser attached (docs/live_view.md): the
    core then builds step records and the server sends them.
    """

    def __init__(self, target: Target) -> None:
        self.url = target.base_url.rstrip("/") + "/v1/live/stream"
        self.headers = target.headers
        self.events = self.records = self.bytes = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="LiveViewer", daemon=True)

    def __enter__(self) -> LiveViewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # seen at the next event: the server sends one a second at least
        self._thread.join(timeout=10.0)

    def _watch(self) -> None:
        try:
            with httpx.stream("GET", self.url, headers=self.headers, timeout=60) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.bytes += len(line)
                        self.events += 1
                        self.records += json.loads(line[6:])["record"] is not None
                    if self._stop.is_set():
                        return
        except Exception as exc:  # noqa: BLE001 (reported in the result, never fatal)
            self.error = f"{type(exc).__name__}: {exc}"

    def summary(self) -> dict[str, Any]:
        """What the viewer received: events, those with a step record, bytes, error."""
        return {"events": self.events, "records": self.records, "bytes": self.bytes,
                "error": self.error}


def make_client(target: Target) -> httpx.AsyncClient:
    """An async client with no connection limit (httpx's default of 100 would queue
    requests client-side) and no timeout (a saturated server may take minutes)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=target.base_url, headers=target.headers, timeout=None,
                             limits=limits)


async def stream_completion(
    client: httpx.AsyncClient, target: Target, prompt: list[int], output_len: int
) -> RequestResult:
    """Send one streamed completion and time its chunks.

    A chunk that carries a choice is a token (its text may be empty: a model without a
    tokenizer streams token ids only); the final usage chunk gives the token count.
    """
    result = RequestResult(prompt_len=len(prompt), expected_output_len=output_len)
    payload = {"model": target.model, "prompt": prompt, "max_tokens": output_len,
               "stream": True, "stream_options": {"include_usage": True},
               "ignore_eos": True, "temperature": 0.0}
    num_chunks = 0
    start = last = result.start_time = time.perf_counter()
    try:
        async with client.stream("POST", target.endpoint, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and SSE comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # the server failed mid-stream
                    result.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                    return result
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if num_chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last, num_chunks = now, num_chunks + 1
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.output_tokens = result.output_tokens or num_chunks
    result.latency = last - start
    result.success = num_chunks > 0
    if not result.success:
        result.error = "the stream ended without a token"
    return result


Job = tuple[int, list[int], int, float]  # (index, prompt, output_len, arrival offset)


async def send_jobs(
    client: httpx.AsyncClient, target: Target, jobs: list[Job], start_wall: float,
    max_concurrency: int | None,
) -> tuple[list[tuple[int, RequestResult]], float]:
    """Start each job at ``start_wall`` + its offset (``time.time()`` clock), at most
    ``max_concurrency`` at once; return the results and the wall time of the last finish."""
    limit = asyncio.Semaphore(max_concurrency or max(1, len(jobs)))

    async def one(index: int, prompt: list[int], output_len: int):
        async with limit:
            return index, await stream_completion(client, target, prompt, output_len)

    tasks = []
    for index, prompt, output_len, offset in jobs:
        delay = start_wall + offset - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, prompt, output_len)))
    results = await asyncio.gather(*tasks)
    return list(results), time.time()


def _client_process(target: Target, jobs: list[Job], max_concurrency: int | None,
                    ready: Any, start: Any, out: Any) -> None:
    """One client process: connect, report ready, wait for the shared start time, run."""

    async def main() -> None:
        async with make_client(target) as client:
            ready.put(1)
            start_wall = await asyncio.to_thread(start.get)
            results, end = await send_jobs(client, target, jobs, start_wall, max_concurrency)
        out.put(json.dumps({"results": [(i, asdict(r)) for i, r in results], "end": end}))

    asyncio.run(main())


def run_requests(
    target: Target, workload: Workload, rate: float, max_concurrency: int | None, seed: int,
    num_processes: int = 1,
) -> tuple[list[RequestResult], float]:
    """Send the workload; return its results (in workload order) and the wall seconds
    from the first planned start to the last finish."""
    offsets = arrival_times(len(workload.prompts), rate, seed)
    jobs: list[Job] = list(zip(range(len(offsets)), workload.prompts, workload.output_lens,
                               offsets))
    num_processes = max(1, min(num_processes, len(jobs)))
    if num_processes == 1:
        async def main():
            async with make_client(target) as client:
                start = time.time()
                results, end = await send_jobs(client, target, jobs, start, max_concurrency)
                return results, end - start
        results, seconds = asyncio.run(main())
        return [r for _, r in sorted(results, key=lambda x: x[0])], seconds
    # The concurrency limit is split evenly: the jobs are dealt round-robin.
    share_limit = -(-max_concurrency // num_processes) if max_concurrency else None
    return _run_in_processes(target, jobs, share_limit, num_processes)


def _run_in_processes(target: Target, jobs: list[Job], share_limit: int | None,
                      num_processes: int) -> tuple[list[RequestResult], float]:
    ctx = mp.get_context("spawn")  # no inherited state (CUDA, threads) in the clients
    ready, out = ctx.Queue(), ctx.Queue()
    starts = [ctx.Queue() for _ in range(num_processes)]
    procs = [ctx.Process(target=_client_process, daemon=True,
                         args=(target, jobs[k::num_processes], share_limit, ready, starts[k],
                               out))
             for k in range(num_processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            _get_alive(ready, procs)
        start = time.time() + 0.05
        for q in starts:
            q.put(start)
        shares = [json.loads(_get_alive(out, procs)) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    results = sorted((i, RequestResult(**r)) for share in shares for i, r in share["results"])
    return [r for _, r in results], max(s["end"] for s in shares) - start


def _get_alive(q: Any, procs: list[Any]) -> Any:
    """``q.get()``, but raise if a client process died instead of waiting forever."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"bench serve client process exited with "
                                   f"{dead[0].exitcode}") from None
