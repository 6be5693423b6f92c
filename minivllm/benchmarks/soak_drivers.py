"""The soak test's three ways in: the offline ``LLMEngine``, ``AsyncLLM``, a live server.

Each driver sends the same workload (``soak_workload.py``) through one front end, aborts
the requests the workload marks as that front end's users would (``abort_request``
between steps; a consumer that stops reading or is cancelled; an HTTP stream closed
mid-way), records what each request's client saw (``Observed``), and ends by reading
the engine's state: blocks still held, requests still queued. Checking what was seen
against the reference is ``soak_check.py``'s part.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from minivllm.benchmarks.soak_check import Completion, Observed
from minivllm.benchmarks.soak_workload import SoakRequest


@dataclass
class DriverResult:
    """What a driver saw and the engine's state at the end.

    Attributes:
        observed: Each request's outputs, by workload index.
        leaked_blocks: KV blocks still held by a request once every request ended
            (cached-but-free prefix blocks count as free).
        unfinished: Requests still in the scheduler or the front end at the end.
        stats: The engine's counters (preemptions, prefix-cache hits...).
        server: The server's health and metric checks (server driver only).
    """

    observed: dict[int, Observed]
    leaked_blocks: int
    unfinished: int
    stats: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)


def _stats_dict(stats: Any) -> dict[str, Any]:
    keys = (
        "num_preemptions",
        "num_steps",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "peak_blocks_in_use",
        "num_kv_blocks",
    )
    return {k: getattr(stats, k) for k in keys} if stats is not None else {}


# ---- the offline engine --------------------------------------------------------------


def drive_offline(
    engine: Any,
    workload: list[SoakRequest],
    seed: int,
    max_in_flight: int = 64,
    stall_steps: int = 200,
    deadline: float | None = None,
) -> DriverResult:
    """Feed ``workload`` to an ``LLMEngine`` a few requests per step, aborting the marked
    ones after their number of steps, until every request has ended.

    An engine that goes ``stall_steps`` steps without any output is stuck (a leak can
    leave no block for anyone): the requests left then end with the error "stalled".
    Past ``deadline`` (``time.monotonic()``) no new request is sent; those sent finish.
    """
    rng = random.Random(seed)
    idle_steps = reported = 0
    pending = list(reversed(workload))
    live: dict[str, list] = {}  # request id -> [request, steps left before its abort]
    observed: dict[int, Observed] = {r.index: Observed() for r in workload}
    while pending or live:
        if deadline is not None and time.monotonic() > deadline:
            pending.clear()
        if (len(workload) - len(pending)) // 1000 > reported:
            reported = (len(workload) - len(pending)) // 1000
            print(f"soak: {1000 * reported} requests sent", flush=True)
        arrivals = rng.randint(0, 4) if live else 1
        for _ in range(arrivals):
            if not pending or len(live) >= max_in_flight:
                break
            r = pending.pop()
            rid = engine.add_request({"prompt_token_ids": r.prompt_token_ids}, r.params)
            live[rid] = [r, r.abort_after]
        _abort_due(engine, live, observed)
        if not live:
            continue
        outputs = engine.step()
        idle_steps = 0 if outputs else idle_steps + 1
        if idle_steps > stall_steps:
            _give_up(engine, live, observed, pending)
            break
        for out in outputs:
            entry = live.get(out.request_id)
            if entry is None:
                continue
            observed[entry[0].index].add(out, entry[0].params.output_kind)
            if out.finished:
                del live[out.request_id]
        for entry in live.values():
            if entry[1] is not None:
                entry[1] -= 1
    core = engine.engine_core.engine_core
    kv = core.kv_cache_manager
    unfinished = core.scheduler.get_num_unfinished_requests() + len(
        engine.output_processor.request_states
    )
    return DriverResult(
        observed,
        leaked_blocks=kv.num_blocks - kv.num_free_blocks,
        unfinished=unfinished + len(kv.req_to_blocks),
        stats=_stats_dict(core.scheduler.make_stats()),
    )


def _give_up(
    engine: Any, live: dict[str, list], observed: dict[int, Observed], pending: list
) -> None:
    engine.abort_request(list(live))
    for r in [entry[0] for entry in live.values()] + pending:
        observed[r.index].error = "stalled: the engine made no progress"
    live.clear()
    pending.clear()


def _abort_due(engine: Any, live: dict[str, list], observed: dict[int, Observed]) -> None:
    due = [rid for rid, (_, left) in live.items() if left is not None and left <= 0]
    if due:
        engine.abort_request(due)
        for rid in due:
            observed[live.pop(rid)[0].index].aborted = True


# ---- AsyncLLM ------------------------------------------------------------------------


async def drive_async(
    llm: Any, workload: list[SoakRequest], max_in_flight: int = 64, deadline: float | None = None
) -> DriverResult:
    """Stream every request of ``workload`` through ``AsyncLLM.generate`` concurrently.

    A marked request's consumer gives up after its number of outputs: even indices leave
    the ``async for`` and close the stream; odd ones have their task cancelled while it
    waits for the next output (what the server does when a client disconnects).
    ``abort_after == 0`` cancels the task as soon as it has started, which may be while
    the request is still being added.
    """
    observed: dict[int, Observed] = {r.index: Observed() for r in workload}

    async def consume(r: SoakRequest, reached: asyncio.Event) -> None:
        obs = observed[r.index]
        gen = llm.generate({"prompt_token_ids": r.prompt_token_ids}, r.params, f"soak-{r.index}")
        try:
            count = 0
            async for out in gen:
                obs.add(out, r.params.output_kind)
                count += 1
                if r.abort_after is not None and count >= r.abort_after:
                    reached.set()
                    if r.index % 2 == 0:
                        break
        finally:
            await gen.aclose()

    await _run_all(workload, observed, consume, max_in_flight, deadline=deadline)
    stats = await _settled_stats(llm)
    leaked = round(stats.kv_cache_usage * stats.num_kv_blocks) if stats else -1
    unfinished = (stats.num_running_reqs + stats.num_waiting_reqs) if stats else -1
    unfinished += len(llm.output_processor.request_states)
    return DriverResult(observed, leaked, unfinished, _stats_dict(stats))


async def _run_all(
    workload: list[SoakRequest],
    observed: dict[int, Observed],
    consume: Any,
    max_in_flight: int,
    stall_s: float = 60.0,
    deadline: float | None = None,
) -> None:
    """Start each request's ``consume(request, reached)`` at its arrival time, at most
    ``max_in_flight`` at once; cancel the odd marked ones once ``reached`` is set or
    ``abort_after`` times 20 ms have passed (at once for ``abort_after == 0``). A request
    that ends without finishing is aborted; one that raises records the error. When no
    client receives anything for ``stall_s`` seconds the engine is stuck (a leak can
    leave no block for anyone): every request not ended then ends with the error
    "stalled" instead of the run hanging. Past ``deadline`` (``time.monotonic()``) no
    new request starts."""
    gate = asyncio.Semaphore(max_in_flight)
    running: set[asyncio.Task] = set()
    stalled = False

    async def one(r: SoakRequest, start: float) -> None:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        async with gate:
            obs = observed[r.index]
            if deadline is not None and time.monotonic() > deadline:
                return
            if stalled:
                obs.error = "stalled: the engine made no progress"
                return
            reached = asyncio.Event()
            task = asyncio.ensure_future(consume(r, reached))
            running.add(task)
            if r.abort_after is not None and r.index % 2 == 1:
                if r.abort_after > 0:
                    waiter = asyncio.ensure_future(reached.wait())
                    # Or after a while: a FINAL_ONLY stream has one output, at its end.
                    await asyncio.wait(
                        {task, waiter},
                        timeout=0.02 * r.abort_after,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    waiter.cancel()
                else:
                    await asyncio.sleep(0)
                task.cancel()
            (result,) = await asyncio.gather(task, return_exceptions=True)
            running.discard(task)
            if stalled and not obs.finished:
                obs.error = "stalled: the engine made no progress"
            if isinstance(result, Exception) and obs.error is None:
                obs.error = f"{type(result).__name__}: {result}"
            obs.aborted = not obs.finished and obs.error is None

    async def watchdog() -> None:
        nonlocal stalled
        last, last_change = -1, time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            progress = sum(
                len(c.text) + len(c.token_ids or ()) + o.finished
                for o in observed.values()
                for c in o.completions.values()
            )
            if progress != last or not running:
                last, last_change = progress, time.monotonic()
            elif time.monotonic() - last_change > stall_s:
                stalled = True
                for task in running:
                    task.cancel()

    t0, starts = time.monotonic(), []
    for r in workload:
        t0 += r.arrival_delay_s
        starts.append(t0)
    guard = asyncio.ensure_future(watchdog())
    try:
        await asyncio.gather(*(one(r, s) for r, s in zip(workload, starts)))
    finally:
        guard.cancel()


async def _settled_stats(llm: Any, timeout_s: float = 30.0) -> Any:
    """The core's latest counters once it reports an empty pool and queue (it sends
    fresh ones after each abort and each step), or the last seen after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = llm.scheduler_stats
        if s is not None and s.kv_cache_usage == 0 and not s.num_running_reqs + s.num_waiting_reqs:
            break
        await asyncio.sleep(0.05)
    return llm.scheduler_stats


# ---- a live server -------------------------------------------------------------------


def openai_kwargs(r: SoakRequest, model: str) -> dict[str, Any]:
    """The ``completions.create`` arguments of a request (vLLM's extras in extra_body)."""
    p = r.params
    extra = dict(
        top_k=p.top_k,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        min_tokens=p.min_tokens,
        ignore_eos=p.ignore_eos,
        stop_token_ids=p.stop_token_ids,
        include_stop_str_in_output=p.include_stop_str_in_output,
    )
    return dict(
        model=model,
        prompt=r.prompt_token_ids,
        stream=True,
        n=p.n,
        temperature=p.temperature,
        top_p=p.top_p,
        max_tokens=p.max_tokens,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        seed=p.seed,
        stop=p.stop,
        logprobs=p.logprobs,
        extra_body=extra,
    )


async def drive_server(
    client: Any,
    model: str,
    workload: list[SoakRequest],
    max_in_flight: int = 64,
    deadline: float | None = None,
) -> dict[int, Observed]:
    """Stream every request through ``client`` (an ``openai.AsyncOpenAI``) concurrently.

    A marked request's client disconnects after its number of chunks: even indices
    close the stream, odd ones are cancelled while they wait for the next chunk.
    Returns what each client saw (text only: the completions API sends no token ids).
    """
    observed: dict[int, Observed] = {r.index: Observed() for r in workload}

    async def consume(r: SoakRequest, reached: asyncio.Event) -> None:
        obs = observed[r.index]
        stream = await client.completions.create(**openai_kwargs(r, model))
        try:
            count = 0
            async for chunk in stream:
                for c in chunk.choices:
                    seen = obs.completions.setdefault(c.index, Completion(None, ""))
                    seen.text += c.text
                    seen.finish_reason = c.finish_reason or seen.finish_reason
                count += 1
                if r.abort_after is not None and count >= r.abort_after:
                    reached.set()
                    if r.index % 2 == 0:
                        return
            obs.finished = True
        finally:
            await stream.close()

    await _run_all(workload, observed, consume, max_in_flight, deadline=deadline)
    return observed
