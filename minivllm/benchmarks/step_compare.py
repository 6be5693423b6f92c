"""Where a slower run of the same workload lost its time, step by step.

``bench throughput --cold`` finds the first timed run of a fresh process slower than the
second. Both runs schedule the same steps in the same order (EOS is ignored, so every
request runs to its fixed length, and the scheduler is deterministic), so their
``LLMEngine.step`` calls can be paired by index: step ``i`` of one run did the same work
as step ``i`` of the other, and the difference of their durations is time the first run
spent on something else (a kernel compiled or loaded on first use, a CUDA graph's first
replay, the caching allocator growing, a garbage collection).

``StepLog`` records, for one run, each step's host seconds, of them the seconds spent
queuing the step's work on the device (``execute_model_async``: building the batch,
launching the graph or the eager kernels, the LM head and the sampler) and waiting for a
step's tokens (``get_output``), and how many tokens and requests the scheduler put in the
step it queued during that call (0 for a call that queued none). ``compare_steps`` pairs
two logs and sums the excess over prefill steps (more tokens than requests: a prompt chunk
is in them) and decode steps, and over launching and waiting, with the steps that lost
the most. Excess in launching points at the host (something done the first time on the
way to the device: a kernel chosen or loaded); excess in waiting at the device.
"""

from __future__ import annotations

import time
from typing import Any

from minivllm.benchmarks.host import time_calls


class StepLog:
    """While the ``with`` block runs, time every ``LLMEngine.step`` of ``llm`` and note
    the size of the step its scheduler queued (single rank, in-process engine core)."""

    def __init__(self, llm: Any) -> None:
        self.engine = llm.llm_engine
        core = self.engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.runner = core.model_executor.model_runner
        self.seconds: list[float] = []
        self.launch: list[float] = []  # of each step's seconds, in execute_model_async
        self.wait: list[float] = []  # and in get_output
        self.tokens: list[int] = []
        self.requests: list[int] = []
        self._current = {"tokens": 0, "requests": 0, "launch": 0.0, "wait": 0.0}
        self._replaced: dict[tuple[Any, str], Any] = {}

    def __enter__(self) -> StepLog:
        schedule, step = self.scheduler.schedule, self.engine.step
        execute = self.runner.execute_model_async
        current = self._current

        def logged_schedule() -> Any:
            out = schedule()
            current["tokens"], current["requests"] = (
                out.total_num_scheduled_tokens, len(out.scheduled))  # fmt: skip
            return out

        def logged_execute(scheduler_output: Any) -> Any:
            t0 = time.perf_counter()
            handle = execute(scheduler_output)
            current["launch"] += time.perf_counter() - t0
            time_calls(handle, "get_output", current, "wait")
            return handle

        def logged_step() -> Any:
            current.update(tokens=0, requests=0, launch=0.0, wait=0.0)
            t0 = time.perf_counter()
            try:
                return step()
            finally:
                self.seconds.append(time.perf_counter() - t0)
                self.launch.append(current["launch"])
                self.wait.append(current["wait"])
                self.tokens.append(current["tokens"])
                self.requests.append(current["requests"])

        self._replace(self.scheduler, "schedule", logged_schedule)
        self._replace(self.runner, "execute_model_async", logged_execute)
        self._replace(self.engine, "step", logged_step)
        return self

    @property
    def busy_s(self) -> float:
        """Seconds in ``LLMEngine.step`` not spent waiting for the device (``HostBusy``'s
        figure, from the same calls)."""
        return sum(self.seconds) - sum(self.wait)

    def __exit__(self, *exc: object) -> None:
        # Put back what was there: another instrument's wrapper (HostBusy wraps the same
        # step), or nothing, which uncovers the method.
        for (obj, name), previous in self._replaced.items():
            if previous is None:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)

    def _replace(self, obj: Any, name: str, wrapper: Any) -> None:
        self._replaced[(obj, name)] = vars(obj).get(name)
        setattr(obj, name, wrapper)


def compare_steps(slow: StepLog, fast: StepLog, top: int = 8) -> dict[str, Any]:
    """Pair the steps of two runs of one workload and say where ``slow`` lost time.

    Returns the total excess seconds (``slow`` minus ``fast`` over the paired steps), its
    split between prefill and decode steps (by what ``slow``'s step queued) and the part
    of it spent launching and waiting, and the ``top`` steps with the largest excess.
    ``same_schedule`` is False when the runs queued different step sizes, in which case
    the pairing means little.
    """
    n = min(len(slow.seconds), len(fast.seconds))
    excess = [slow.seconds[i] - fast.seconds[i] for i in range(n)]
    prefill = [slow.tokens[i] > slow.requests[i] for i in range(n)]
    worst = sorted(range(n), key=lambda i: excess[i], reverse=True)[:top]
    return {
        "steps": [len(slow.seconds), len(fast.seconds)],
        "same_schedule": slow.tokens == fast.tokens,
        "excess_s": sum(excess),
        "prefill_excess_s": sum(e for e, p in zip(excess, prefill, strict=True) if p),
        "decode_excess_s": sum(e for e, p in zip(excess, prefill, strict=True) if not p),
        "launch_excess_s": sum(slow.launch[:n]) - sum(fast.launch[:n]),
        "wait_excess_s": sum(slow.wait[:n]) - sum(fast.wait[:n]),
        "worst_steps": [
            {"index": i, "tokens": slow.tokens[i], "requests": slow.requests[i],
             "slow_ms": 1e3 * slow.seconds[i], "fast_ms": 1e3 * fast.seconds[i],
             "slow_launch_ms": 1e3 * slow.launch[i], "fast_launch_ms": 1e3 * fast.launch[i],
             "slow_wait_ms": 1e3 * slow.wait[i], "fast_wait_ms": 1e3 * fast.wait[i]}
            for i in worst
        ],  # fmt: skip
    }
