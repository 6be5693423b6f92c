"""How much timed runs of one build spread, and whether the host caused it:
``bench throughput --repeats N``.

The same engine runs the ``temperature=0.6`` workload ``N`` more times. The GPU's work is
identical in every run (EOS is ignored, so every request produces its fixed number of
tokens and every step has the same shape), so whatever spreads the wall clock is either
the GPU's clocks or the host. Each run records, besides its seconds:

- ``host_busy_s``: the step loop's own time, ``LLMEngine.step`` minus the time the engine
  core blocked in ``get_output()`` waiting for the GPU. With async scheduling the host
  hides behind the GPU while its work per step is shorter than the GPU's; a run whose busy
  time approaches its wall time was limited by the host.
- ``other_threads_cpu_s``: CPU seconds used meanwhile by every other thread of the
  process (Linux ``/proc/self/task``; null elsewhere). This is how a torch thread pool
  spinning beside the step loop shows up (Benchmarks, eighth round).
- ``gc_s`` and ``gc_collections``: the pauses of Python's cyclic garbage collector during
  the run, and how many collections of each generation there were. A collection of the
  oldest generation walks every tracked object of the process (a few hundred thousand
  once torch, triton and transformers are imported), and it runs inside the step loop.
- ``minor_page_faults``: pages the process touched for the first time during the run
  (``getrusage``; null where the ``resource`` module is missing). Each is a trip into the
  kernel on the step loop's thread; a process's first run pays thousands that later runs
  do not (Benchmarks, twelfth round).

Upstream's ``vllm bench throughput`` times one run; this is minivllm's own instrument.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

from minivllm.benchmarks.host import time_calls
from minivllm.benchmarks.throughput import SAMPLED_TEMPERATURE, generate_workload
from minivllm.benchmarks.workloads import Workload


class HostBusy:
    """While the ``with`` block runs, add up ``LLMEngine.step`` time and, of it, the time
    spent waiting in the step handles' ``get_output()`` (single rank, in-process core)."""

    def __init__(self, llm: Any) -> None:
        self.engine = llm.llm_engine
        self.runner = self.engine.engine_core.engine_core.model_executor.model_runner
        self.totals = {"step": 0.0, "wait": 0.0}

    def __enter__(self) -> HostBusy:
        time_calls(self.engine, "step", self.totals, "step")
        execute = self.runner.execute_model_async

        def execute_and_time_the_wait(scheduler_output: Any) -> Any:
            handle = execute(scheduler_output)
            time_calls(handle, "get_output", self.totals, "wait")
            return handle

        self.runner.execute_model_async = execute_and_time_the_wait
        return self

    def __exit__(self, *exc: object) -> None:
        # The wrappers are instance attributes: deleting them uncovers the methods.
        del self.engine.step
        del self.runner.execute_model_async

    @property
    def step_s(self) -> float:
        """Host seconds in ``LLMEngine.step``."""
        return self.totals["step"]

    @property
    def wait_s(self) -> float:
        """Of those, seconds blocked in ``get_output()`` until the GPU had the tokens."""
        return self.totals["wait"]

    @property
    def busy_s(self) -> float:
        """Host seconds in the step loop that were not spent waiting for the GPU."""
        return self.step_s - self.wait_s


class GcPauses:
    """While the ``with`` block runs, add up the garbage collector's pauses (through
    ``gc.callbacks``) and count its collections by generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def thread_cpu_seconds() -> dict[int, float] | None:
    """CPU seconds (user + system) of every thread of this process, by thread id; None
    where ``/proc/self/task`` does not exist."""
    task_dir = "/proc/self/task"
    if not os.path.isdir(task_dir):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                raw = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        # Fields after the name in parentheses (which may hold spaces): utime, stime
        # are fields 14 and 15 of the line, 12 and 13 after it.
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def _other_threads(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    if before is None or after is None:
        return None
    main = os.getpid()  # the kernel's id of the main thread, which runs the step loop
    return sum(cpu - before.get(tid, 0.0) for tid, cpu in after.items() if tid != main)


def minor_page_faults() -> int | None:
    """The process's minor page faults so far (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # not Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def page_faults_since(before: int | None) -> int | None:
    """Minor page faults since ``before`` (a :func:`minor_page_faults` reading)."""
    now = minor_page_faults()
    return None if before is None or now is None else now - before


def one_run(llm: Any, workload: Workload, max_tokens_per_s: float | None) -> dict[str, Any]:
    """One timed ``temperature=0.6`` run with its host figures."""
    before, faults = thread_cpu_seconds(), minor_page_faults()
    with HostBusy(llm) as busy, GcPauses() as pauses:
        seconds = generate_workload(llm, workload, SAMPLED_TEMPERATURE)
    run = {
        "seconds": seconds,
        "output_tokens_per_s": workload.num_output_tokens / seconds,
        "host_busy_s": busy.busy_s,
        "host_wait_s": busy.wait_s,
        "other_threads_cpu_s": _other_threads(before, thread_cpu_seconds()),
        "gc_s": pauses.seconds,
        "gc_collections": pauses.collections,
        "minor_page_faults": page_faults_since(faults),
    }
    if max_tokens_per_s:
        run["fraction_of_roofline"] = run["output_tokens_per_s"] / max_tokens_per_s
    return run


def run_repeats(
    llm: Any, workload: Workload, repeats: int, max_tokens_per_s: float | None = None
) -> dict[str, Any]:
    """``repeats`` timed runs on ``llm`` and the spread of their seconds."""
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    runs = [one_run(llm, workload, max_tokens_per_s) for _ in range(repeats)]
    seconds = [r["seconds"] for r in runs]
    summary = {"min_s": min(seconds), "median_s": statistics.median(seconds),
               "max_s": max(seconds)}  # fmt: skip
    if max_tokens_per_s:
        best, worst = min(seconds), max(seconds)
        summary["best_fraction_of_roofline"] = workload.num_output_tokens / best / max_tokens_per_s
        summary["worst_fraction_of_roofline"] = (
            workload.num_output_tokens / worst / max_tokens_per_s
        )
    return {"temperature": SAMPLED_TEMPERATURE, "runs": runs, **summary}


def print_repeats(repeats: dict[str, Any]) -> None:
    """One line per run, then the spread."""
    for i, run in enumerate(repeats["runs"], 1):
        threads = run["other_threads_cpu_s"]
        print(f"repeat {i}: {run['seconds']:.3f} s, {run['output_tokens_per_s']:.0f} tok/s, "
              f"host busy {run['host_busy_s']:.2f} s, other threads "
              f"{'n/a' if threads is None else f'{threads:.2f} CPU-s'}, gc "
              f"{1e3 * run['gc_s']:.1f} ms {run['gc_collections']}, minor page faults "
              f"{run['minor_page_faults']}", flush=True)
    print(f"repeats: {repeats['min_s']:.3f} / {repeats['median_s']:.3f} / "
          f"{repeats['max_s']:.3f} s (min / median / max)", flush=True)
