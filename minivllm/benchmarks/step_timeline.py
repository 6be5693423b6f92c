"""Where a whole throughput run's time goes, step by step: ``bench throughput --step-timeline``.

``profile_full_batch`` (``--profile-dir``) traces eight decode steps at the full batch;
this looks at every step of one whole run of the workload, in two passes on the engine the
timed runs used:

1. **Per step, no profiler.** The engine core's ``Scheduler.schedule`` and the model
   runner's ``execute_model_async`` are wrapped for one run (and put back afterwards). Each
   step records when it was scheduled, its batch and tokens, and whether it is a *mixed*
   step (some request runs more than one new token: a prompt or a chunk of one) or a
   *decode* step; the runner's wrapper records a CUDA event before and after queuing the
   step and the host seconds the call took. From those: the GPU time of each step, the
   GPU's idle gap before the next one, the host time between two ``schedule`` calls and
   the host time spent queuing. Steps are summed by kind and batch size (``BATCH_EDGES``).
2. **Kernels, under ``torch.profiler``.** A second run with CUDA activity only: the time
   some kernel was running, the idle time over the span and its gaps by length, the
   device time per kernel class and the 25 costliest kernels (``step_timeline_kernels``).
   A marker queued before each step of this run splits its kernels by step
   (``step_kernels.py``): each class's seconds in decode and in prompt steps, and the
   decode cost fit below done per kernel class.

The first pass says *which steps* leave the GPU waiting on the host; the second *which
kernels* fill the GPU's time. Given the workload's roofline, the first pass's decode steps
are also fitted to a cost model (``step_cost_model.py``: a fixed cost per step, a cost per
sequence, and the KV read against the copy bandwidth), which says how much of the gap to
the roofline each part holds. On the CPU (tests, ``--allow-cpu``) there are no CUDA events:
the first pass records host times only, with every GPU field null, and the second is
skipped; the JSON says so in ``gpu_timing`` and ``kernels.skipped``.

Upstream has no such tool. The closest are ``vllm bench throughput --profile`` with the
torch profiler (``--profiler-config.profiler=torch`` and ``torch_profiler_dir``, formerly
``VLLM_TORCH_PROFILER_DIR``; ``TorchProfilerWrapper`` in ``vllm/profiler/wrapper.py``),
whose trace of the whole run is read in a viewer, and ``--collect-detailed-traces``
(``vllm/config/observability.py``: model forward and execute times as OpenTelemetry
spans). Here both views are reduced to numbers in the benchmark's own JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minivllm.benchmarks.roofline import Roofline
from minivllm.benchmarks.step_cost_model import fit_decode_cost
from minivllm.benchmarks.step_kernels import kernels_by_step, launch_step_marker
from minivllm.benchmarks.step_timeline_kernels import profile_kernels
from minivllm.benchmarks.throughput import SAMPLED_TEMPERATURE, generate_workload
from minivllm.benchmarks.workloads import Workload

# Batch-size buckets: a step of n requests goes to the first edge >= n, or above the last.
BATCH_EDGES = (1, 8, 16, 64, 128, 256)
CPU_TIMING = "none: the model runs on the CPU, where CUDA events do not exist; host times only"
CPU_KERNELS = "the model runs on the CPU: no CUDA kernels to profile"


# ---- pass 1: every step, unprofiled -----------------------------------------------------


@dataclass
class StepTiming:
    """One engine step as the wrappers saw it; GPU fields are None without CUDA events."""

    scheduled_at: float  # host perf_counter() when schedule() returned
    num_reqs: int
    num_tokens: int
    mixed: bool = False  # some request ran more than one new token (a prompt or a chunk)
    # Every sequence's length after the step (its context, new tokens included): the KV
    # the step's attention reads, for the decode cost fit (step_cost_model.py).
    context_tokens: int = 0
    execute_s: float | None = None  # host seconds inside execute_model_async
    host_s: float | None = None  # host seconds from this schedule() to the next
    # GPU seconds between the events around the step. The start event fires once the GPU
    # has finished the steps before, so this is the step's time on the GPU, including any
    # moment the GPU idles because the host is still launching the step's kernels
    # (compare execute_s; the profiler pass gives the time kernels really ran).
    gpu_s: float | None = None
    gap_s: float | None = None  # GPU idle seconds before the next step's start event
    events: tuple[Any, Any] | None = None  # the two CUDA events, until resolved
    # The step's ScheduledRequests, until resolved: ``mixed`` and ``context_tokens`` are
    # read from them after the run, so that no pass over the requests is timed with it.
    scheduled: Sequence[Any] | None = None


def is_mixed(scheduled: Sequence[Any]) -> bool:
    """True when some request runs more than one token that is not a draft (a prefill)."""
    return any(s.num_scheduled_tokens - len(s.spec_token_ids) > 1 for s in scheduled)


def context_tokens(scheduled: Sequence[Any]) -> int:
    """The step's sequences' lengths summed, each with the tokens it runs now."""
    return sum(s.num_computed_tokens + s.num_scheduled_tokens for s in scheduled)


def patch_attribute(obj: Any, name: str, wrapper: Callable) -> Callable[[], None]:
    """Shadow ``obj.name`` with an instance attribute; return what undoes it exactly."""
    had_own = name in vars(obj)
    own = vars(obj).get(name)
    setattr(obj, name, wrapper)

    def restore() -> None:
        if had_own:
            setattr(obj, name, own)
        else:
            delattr(obj, name)  # the class's method shows through again

    return restore


class StepTimeline:
    """Record every step of the engine core ``core`` while the ``with`` block runs.

    Only the in-process engine core of a single-rank engine can be reached this way
    (``core.model_executor.model_runner``). ``before_execute``, if given, is called right
    before each step is queued (the profiled pass queues its step marker there, see
    ``step_kernels.py``).
    """

    def __init__(self, core: Any, before_execute: Callable[[], None] | None = None) -> None:
        self.scheduler = core.scheduler
        self.runner = core.model_executor.model_runner
        self.before_execute = before_execute
        # CUDA events exist only where the model runs on a GPU.
        self.use_events = self.runner.device.type == "cuda"
        self.steps: list[StepTiming] = []
        self._restore: list[Callable[[], None]] = []

    def __enter__(self) -> StepTimeline:
        schedule = self.scheduler.schedule
        execute = self.runner.execute_model_async

        def timed_schedule() -> Any:
            out = schedule()
            if not out.scheduled:
                # Nothing to run (with async scheduling: every request's last token is
                # in flight); the scheduler does not count it as a step, nor do we.
                return out
            self.steps.append(
                StepTiming(
                    time.perf_counter(),
                    len(out.scheduled),
                    out.total_num_scheduled_tokens,
                    scheduled=out.scheduled,  # mixed and context_tokens: at resolve
                )
            )
            return out

        def timed_execute(scheduler_output: Any) -> Any:
            if not scheduler_output.scheduled:
                return execute(scheduler_output)
            if self.before_execute is not None:
                self.before_execute()
            start = self._event()
            t0 = time.perf_counter()
            handle = execute(scheduler_output)
            host = time.perf_counter() - t0
            end = self._event()
            # The core queues each step right after scheduling it: it is the last record.
            step = self.steps[-1]
            step.execute_s = host
            step.events = (start, end) if start is not None else None
            return handle

        self._restore = [
            patch_attribute(self.scheduler, "schedule", timed_schedule),
            patch_attribute(self.runner, "execute_model_async", timed_execute),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for restore in self._restore:
            restore()
        self._restore = []

    def _event(self) -> Any:
        if not self.use_events:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def resolve(self, run_end: float) -> list[StepTiming]:
        """Fill the intervals once the run is over (``run_end``: perf_counter() then)."""
        if self.use_events:
            torch.cuda.synchronize()  # elapsed_time needs both events completed
        steps = self.steps
        for i, step in enumerate(steps):
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            # The last step's host interval runs to the end of the run.
            step.host_s = (nxt.scheduled_at if nxt else run_end) - step.scheduled_at
            if step.events is not None:
                start, end = step.events
                step.gpu_s = start.elapsed_time(end) / 1e3
                if nxt is not None and nxt.events is not None:
                    # Nothing but host work separates the two: the GPU waited this long.
                    step.gap_s = end.elapsed_time(nxt.events[0]) / 1e3
            step.events = None
            if step.scheduled is not None:
                # Counts taken when scheduled; drafts filled in later keep their number.
                step.mixed = is_mixed(step.scheduled)
                step.context_tokens = context_tokens(step.scheduled)
                step.scheduled = None
        return steps


def bucket_edges(num_reqs: int, edges: Sequence[int] = BATCH_EDGES) -> tuple[int, int | None]:
    """The batch bucket ``(batch_min, batch_max)`` of a step of ``num_reqs`` >= 1
    requests; ``batch_max`` None above the last edge."""
    low = 1
    for edge in edges:
        if num_reqs <= edge:
            return low, edge
        low = edge + 1
    return low, None


def _sum_mean(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    return sum(known), sum(known) / len(known)


def step_stats(steps: Sequence[StepTiming]) -> dict[str, Any]:
    """Steps, tokens and the sum and mean of each interval over ``steps`` (None: unknown)."""
    tokens = sum(s.num_tokens for s in steps)
    out: dict[str, Any] = {
        "steps": len(steps),
        "tokens": tokens,
        "tokens_per_step": tokens / len(steps) if steps else None,
    }
    for field in ("gpu_s", "gap_s", "host_s", "execute_s"):
        total, mean = _sum_mean(getattr(s, field) for s in steps)
        out[field] = total
        out[field[:-2] + "_mean_s"] = mean
    return out


def aggregate(steps: Sequence[StepTiming], edges: Sequence[int] = BATCH_EDGES) -> dict[str, Any]:
    """Per-kind totals and per-(kind, batch bucket) rows; only non-empty buckets appear."""
    kinds = []
    buckets = []
    for kind in ("decode", "mixed"):
        of_kind = [s for s in steps if s.mixed == (kind == "mixed")]
        kinds.append({"kind": kind, **step_stats(of_kind)})
        groups: dict[tuple[int, int | None], list[StepTiming]] = {}
        for s in of_kind:
            groups.setdefault(bucket_edges(s.num_reqs, edges), []).append(s)
        for (low, high), group in sorted(groups.items()):
            buckets.append({"kind": kind, "batch_min": low, "batch_max": high, **step_stats(group)})
    return {"kinds": kinds, "buckets": buckets}


def per_step_columns(steps: Sequence[StepTiming]) -> dict[str, list]:
    """Every step, one list per field (compact JSON for plotting a timeline)."""
    t0 = steps[0].scheduled_at if steps else 0.0
    return {
        "scheduled_at_s": [round(s.scheduled_at - t0, 6) for s in steps],
        "num_reqs": [s.num_reqs for s in steps],
        "num_tokens": [s.num_tokens for s in steps],
        "mixed": [s.mixed for s in steps],
        "context_tokens": [s.context_tokens for s in steps],
        **{
            f: [None if getattr(s, f) is None else round(getattr(s, f), 7) for s in steps]
            for f in ("gpu_s", "gap_s", "host_s", "execute_s")
        },
    }


def time_steps(
    llm: Any, workload: Workload, temperature: float, roofline: Roofline | None = None
) -> dict[str, Any]:
    """Pass 1: run ``workload`` once with every step recorded; the engine is unchanged after.
    With the workload's ``roofline``, the decode steps' GPU times are also fitted
    (``decode_cost``, see ``step_cost_model.py``)."""
    core = llm.llm_engine.engine_core.engine_core
    timeline = StepTimeline(core)
    with timeline:
        seconds = generate_workload(llm, workload, temperature)
        run_end = time.perf_counter()
    steps = timeline.resolve(run_end)
    totals = {"wall_s": seconds, "steps": len(steps), "mixed_steps": sum(s.mixed for s in steps)}
    for field in ("gpu_s", "gap_s", "host_s", "execute_s"):
        totals[field] = _sum_mean(getattr(s, field) for s in steps)[0]
    out = {
        "gpu_timing": "cuda events" if timeline.use_events else CPU_TIMING,
        "batch_edges": list(BATCH_EDGES),
        "totals": totals,
        **aggregate(steps),
    }
    if roofline is not None:
        out["decode_cost"] = fit_decode_cost(
            steps, roofline.kv_bytes_per_token, roofline.weight_bytes, roofline.copy_bandwidth
        )
    out["per_step"] = per_step_columns(steps)
    return out


# ---- the command's entry point ----------------------------------------------------------


def run_step_timeline(
    llm: Any,
    workload: Workload,
    temperature: float = SAMPLED_TEMPERATURE,
    roofline: Roofline | None = None,
) -> dict[str, Any]:
    """Both passes on ``llm`` (single rank, in-process), as ``result["step_timeline"]``;
    ``roofline`` (the workload's) adds the decode cost fit."""
    out: dict[str, Any] = {
        "temperature": temperature,
        **time_steps(llm, workload, temperature, roofline),
    }
    core = llm.llm_engine.engine_core.engine_core
    if core.model_executor.model_runner.device.type == "cuda":
        # The profiled run is recorded step by step too, a marker queued before each
        # step, so that its kernels can be told apart by step (step_kernels.py).
        marked = StepTimeline(core, before_execute=launch_step_marker)
        out["kernels"], events = profile_kernels(llm, workload, temperature, marked)
        out["kernels"]["by_step"] = kernels_by_step(
            marked.steps,
            events,
            *(() if roofline is None else (roofline.kv_bytes_per_token, roofline.copy_bandwidth)),
        )
    else:
        out["kernels"] = {"skipped": CPU_KERNELS}
    print_summary(out)
    return out


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}"


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}"


def print_summary(timeline: dict[str, Any]) -> None:
    """A few lines of what the JSON holds."""
    t = timeline["totals"]
    print(
        f"step timeline: {t['steps']} steps ({t['mixed_steps']} mixed) in {t['wall_s']:.2f} s;"
        f" GPU in steps {_s(t['gpu_s'])} s, GPU idle between steps {_s(t['gap_s'])} s",
        flush=True,
    )
    for k in timeline["kinds"]:
        print(
            f"  {k['kind']:6s} {k['steps']:5d} steps: per step host {_ms(k['host_mean_s'])} ms"
            f" (queuing {_ms(k['execute_mean_s'])}), GPU {_ms(k['gpu_mean_s'])} ms,"
            f" idle after {_ms(k['gap_mean_s'])} ms",
            flush=True,
        )
    cost = timeline.get("decode_cost")
    if cost is not None and "skipped" not in cost:
        print(
            f"  decode step fit: {cost['fixed_ms_per_step']:.3f} ms fixed (weights at copy"
            f" bandwidth {cost['weights_ms_per_step_at_copy_bandwidth']:.3f}),"
            f" {cost['per_sequence_us']:.2f} us per sequence, KV at"
            f" {cost['kv_time_factor']:.2f}x its copy time",
            flush=True,
        )
    kernels = timeline["kernels"]
    if "skipped" in kernels:
        print(f"  kernels: skipped ({kernels['skipped']})", flush=True)
        return
    classes = ", ".join(f"{c} {s:.3f}" for c, s in kernels["classes_s"].items())
    print(
        f"  kernels: busy {kernels['busy_s']:.3f} s of a {kernels['span_s']:.3f} s span;"
        f" by class (s): {classes}",
        flush=True,
    )
    by_class = kernels.get("by_step", {}).get("decode_cost_by_class", {}).get("classes")
    if by_class:
        fixed = ", ".join(f"{c} {v['fixed_ms_per_step']:.3f}" for c, v in by_class.items())
        print(f"  decode step fixed cost by class (ms, profiled run): {fixed}", flush=True)
