"""The live view: a page at ``/`` that watches the engine, and the JSON it reads.

No upstream counterpart: vLLM serves Prometheus metrics at ``/metrics`` for dashboards
(``vllm/v1/metrics/loggers.py``), nothing per step. Here the engine core's step records
(``minivllm.core.step_record``) reach the browser:

* ``GET /`` is the page (``minivllm/entrypoints/static/``: plain HTML, CSS and one
  script; no build step, nothing fetched from the network);
* ``GET /v1/live`` is the latest record with rolling TTFT, ITL and tokens/s, as JSON
  (a notebook can read it: docs/live_view.md describes every field);
* ``GET /v1/live/stream`` pushes the same JSON as server-sent events, one per record.

Records cost the engine core a little, so it makes them only while someone watches:
each open stream holds recording on, and so does a poll of ``/v1/live`` for
``POLL_LEASE_S`` seconds after it; when the last viewer leaves, the core is told to stop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from minivllm.core.sched_output import SchedulerStats
from minivllm.entrypoints.openai.server_utils import documented, error_json
from minivllm.entrypoints.openai.serving_engine import create_error_response
from minivllm.metrics.loggers import StatLoggerBase
from minivllm.metrics.stats import IterationStats

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
# Seconds of engine steps the rolling TTFT, ITL and tokens/s cover.
WINDOW_S = 10.0
# A poll of /v1/live keeps recording on this long (the page polls nothing: it streams).
POLL_LEASE_S = 10.0
# A stream with no new record sends the metrics alone this often, so they stay fresh.
HEARTBEAT_S = 1.0
# How long a poll waits for the first record after turning recording on.
FIRST_RECORD_WAIT_S = 2.0
# Values of one step that a latency's quantiles sample (its count and mean take all).
_SAMPLES_PER_STEP = 4

router = APIRouter()


class _Window:
    """One latency over the window: exact count and sum, quantiles from a sample.

    At full batch a step has hundreds of ITLs and ten seconds hold a thousand steps;
    sorting all of them for every event would cost the event loop, which serves every
    stream, more than the figures are worth. So each step gives at most
    ``_SAMPLES_PER_STEP`` evenly spaced values to the quantiles, and all to the mean.
    """

    def __init__(self) -> None:
        # (time.time(), sample, count, sum) per step with values.
        self.steps: deque[tuple[float, list[float], int, float]] = deque()
        self.count = 0
        self.total = 0.0

    def add(self, timestamp: float, values: list[float]) -> None:
        if not values:
            return
        stride = -(-len(values) // _SAMPLES_PER_STEP)
        total = sum(values)
        self.steps.append((timestamp, values[::stride], len(values), total))
        self.count += len(values)
        self.total += total

    def drop_before(self, cutoff: float) -> None:
        while self.steps and self.steps[0][0] < cutoff:
            _, _, count, total = self.steps.popleft()
            self.count -= count
            self.total -= total

    def summary_ms(self) -> dict[str, float | int | None]:
        if not self.count:
            return {"count": 0, "mean": None, "p50": None, "p90": None}
        ms = sorted(v * 1000 for _, sample, _, _ in self.steps for v in sample)
        return {
            "count": self.count,
            "mean": 1000 * self.total / self.count,
            "p50": ms[len(ms) // 2],
            "p90": ms[min(len(ms) - 1, int(len(ms) * 0.9))],
        }


class LiveStatLogger(StatLoggerBase):
    """Rolling TTFT, ITL and output tokens/s over the last ``window_s`` seconds.

    It is one more stat logger beside the Prometheus one: the same per-step
    ``IterationStats`` feed both, so the page and ``/metrics`` never disagree about
    what happened, only about the span (a window here, totals there). Counts and means
    are exact; p50 and p90 come from a sample of each step (see ``_Window``).
    """

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self.clock = clock  # the same clock as IterationStats.iteration_timestamp
        self._ttft = _Window()
        self._itl = _Window()
        self._tokens: deque[tuple[float, int]] = deque()  # (time.time(), tokens) per step
        self._num_tokens = 0

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        """Keep the step's latencies and token count (steps without tokens are skipped)."""
        if iteration_stats is None or not iteration_stats.num_generation_tokens:
            return
        now = iteration_stats.iteration_timestamp
        self._ttft.add(now, iteration_stats.time_to_first_tokens_iter)
        self._itl.add(now, iteration_stats.inter_token_latencies_iter)
        self._tokens.append((now, iteration_stats.num_generation_tokens))
        self._num_tokens += iteration_stats.num_generation_tokens
        self._drop_old(self.clock())

    def _drop_old(self, now: float) -> None:
        cutoff = now - self.window_s
        self._ttft.drop_before(cutoff)
        self._itl.drop_before(cutoff)
        while self._tokens and self._tokens[0][0] < cutoff:
            self._num_tokens -= self._tokens.popleft()[1]

    def snapshot(self) -> dict[str, Any]:
        """The window's figures: see docs/live_view.md ("metrics")."""
        self._drop_old(self.clock())
        return {
            "window_s": self.window_s,
            "ttft_ms": self._ttft.summary_ms(),
            "itl_ms": self._itl.summary_ms(),
            "num_generation_tokens": self._num_tokens,
            "tokens_per_s": self._num_tokens / self.window_s,
        }


class LiveHub:
    """The live view's state: the stat logger, the viewers, the polling lease.

    Args:
        engine: The ``AsyncLLM`` (its ``step_records()``, ``latest_step_record`` and
            ``acquire/release_step_records``).
        playground: Whether the page may send requests (prompt box, burst button).
    """

    def __init__(self, engine: Any, playground: bool = True) -> None:
        self.engine = engine
        self.playground = playground
        self.stats = LiveStatLogger()
        engine.stat_loggers.append(self.stats)
        self.num_streams = 0
        self._lease_until = 0.0
        self._lease_task: asyncio.Task | None = None

    def state(self, record: Any) -> dict[str, Any]:
        """The object of ``/v1/live`` and of each stream event (the record and the stats
        as structs: ``msgspec.json`` encodes them in C, several times faster than
        ``json`` on a pool of 100k blocks, and the event loop serves every stream)."""
        stats = self.engine.scheduler_stats
        return {
            "model": self.engine.model_name,
            "playground": self.playground,
            "recording": self.engine.step_records_on,
            "viewers": self.num_streams + (self._lease_task is not None),
            "record": record,
            "metrics": self.stats.snapshot(),
            "stats": stats,
        }

    async def poll(self, watch: bool) -> dict[str, Any]:
        """``/v1/live``: hold recording on for a while (``watch``) and return the state."""
        if watch and not self.engine.errored:  # a dead engine makes no records
            self._lease_until = time.monotonic() + POLL_LEASE_S
            if self._lease_task is None:  # set before any await: concurrent polls share it
                before = self.engine.latest_step_record
                self._lease_task = asyncio.get_running_loop().create_task(self._lease())
                await self._wait_for_record_after(before)
        return self.state(self.engine.latest_step_record)

    async def _wait_for_record_after(self, before: Any) -> None:
        # The core answers a start with a record of its state; wait for it, briefly.
        deadline = time.monotonic() + FIRST_RECORD_WAIT_S
        while self.engine.latest_step_record is before and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _lease(self) -> None:
        """Hold recording on until ``_lease_until`` (which later polls push back)."""
        try:
            await self.engine.acquire_step_records()
        except Exception:  # the engine died meanwhile: nothing to hold
            self._lease_task = None
            return
        # Cancelled only when the server stops: then there is nothing left to release.
        while (left := self._lease_until - time.monotonic()) > 0:
            await asyncio.sleep(left)
        self._lease_task = None
        self.engine.release_step_records()

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """``/v1/live/stream``: one server-sent event per record, metrics alone when the
        engine is idle; recording stays on until the client goes away."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=2)
        self.num_streams += 1
        pump = asyncio.get_running_loop().create_task(self._pump(queue))
        first = True
        try:
            while True:
                try:
                    record = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                except asyncio.TimeoutError:
                    # No news. A first event still shows the pool: if another viewer had
                    # recording on already, an idle core sends no record of its own.
                    record = self.engine.latest_step_record if first else None
                first = False
                if pump.done():  # the engine failed: end the stream
                    return
                yield b"data: " + msgspec.json.encode(self.state(record)) + b"\n\n"
        finally:
            self.num_streams -= 1
            pump.cancel()

    async def _pump(self, queue: asyncio.Queue) -> None:
        async for record in self.engine.step_records():
            if queue.full():
                queue.get_nowait()  # a slow browser skips records, never the engine
            queue.put_nowait(record)


@router.get("/", include_in_schema=False)
async def live_page() -> Response:
    """The live view page."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/static/{name}", include_in_schema=False)
async def live_static(name: str) -> Response:
    """The page's script and style sheet (only files shipped in the package)."""
    files = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in (".js", ".css")}
    if name not in files:
        error = create_error_response(
            f"no static file {name!r}", "NotFoundError", HTTPStatus.NOT_FOUND, param="name"
        )
        return error_json(error)
    return FileResponse(files[name])


@router.get("/v1/live", responses=documented())
async def live_state(raw_request: Request, watch: bool = True) -> Response:
    """The latest step record, rolling TTFT/ITL/tokens-per-second and the engine's
    counters. ``watch=false`` reads without turning recording on."""
    hub: LiveHub = raw_request.app.state.live
    return Response(msgspec.json.encode(await hub.poll(watch)), media_type="application/json")


@router.get("/v1/live/stream", response_class=StreamingResponse, responses=documented(stream=True))
async def live_stream(raw_request: Request) -> Response:
    """The same JSON as ``/v1/live`` as server-sent events, one per step record."""
    hub: LiveHub = raw_request.app.state.live
    return StreamingResponse(
        hub.stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def attach_live_view(app: FastAPI, engine_client: Any, playground: bool = True) -> None:
    """Add the page and the live endpoints to ``app`` (``minivllm serve`` always does;
    ``--no-playground`` makes the page read-only)."""
    app.state.live = LiveHub(engine_client, playground)
    app.include_router(router)
