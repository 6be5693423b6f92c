"""The second pass of ``bench throughput --step-timeline``: every kernel of a whole run.

One run of the workload under ``torch.profiler`` with CUDA activity only (no host events,
so the host slows down less than under a full trace), reduced to numbers: how long some
kernel was running (the union of the kernels' intervals: kernels that overlap count
once), the GPU's idle time over the span and its gaps by length, the device time per
kernel class (``kernel_class``: attention, GEMM, norm, ...) and the costliest kernels.
``step_timeline`` says which *steps* leave the GPU waiting; this says which *kernels* fill
its time.

Upstream counterpart: the torch profiler of ``vllm bench throughput --profile``
(``TorchProfilerWrapper`` in ``vllm/profiler/wrapper.py``, which writes its trace to
``torch_profiler_dir``, formerly ``VLLM_TORCH_PROFILER_DIR``) leaves the trace to a
viewer; here the whole run's trace is summed up in the benchmark's JSON instead.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minivllm.benchmarks.throughput import generate_workload
from minivllm.benchmarks.workloads import Workload

# The step marker queued before each step of a profiled run when its kernels are to be
# told apart by step (step_kernels.py): ATen's torch.cuda._sleep launches ``spin_kernel``
# (its mangled name carries namespaces and the argument type, so a fragment is matched).
# It is not an engine kernel: the whole-run summary leaves it out.
STEP_MARKER = "spin_kernel"
# Idle gaps between kernels, in microseconds: launch-bound gaps are a few us, a host
# stall between steps hundreds.
IDLE_GAP_EDGES_US = (5, 20, 100, 1000)
TOP_KERNELS = 25

# (class, name fragments), tried in order on the lower-cased kernel name, first match wins.
# Order matters: "fmha_cutlass" is attention before "cutlass" is a GEMM, the fused
# QK-norm + rotary kernel counts as rotary, so "norm" means the layers' RMSNorm alone, and
# the gate/up GEMM with SiLU-and-mul in its epilogue counts as a GEMM, so "activation"
# means the activation's own kernel.
KERNEL_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("unified_attention", "reduce_segments", "flash_fwd", "fmha", "attention")),
    ("rotary", ("qk_norm_rope", "rotary", "rope")),
    ("cache_write", ("reshape_and_cache",)),
    ("sampler", ("gumbel", "argmax", "softmax", "topk", "sort", "exponential", "multinomial")),
    ("gemm", ("nvjet", "gemm", "gemv", "gate_up", "cutlass", "splitkreduce", "xmma", "cublas")),
    ("norm", ("rms_norm", "layer_norm", "norm")),
    ("activation", ("silu", "gelu", "act_and_mul")),
    ("collective", ("nccl", "all_reduce", "allreduce", "all_gather", "allgather")),
    ("copy", ("memcpy", "memset", "copy")),
)


def kernel_class(name: str) -> str:
    """The class of a GPU kernel, from its name (``KERNEL_CLASSES``); ``"other"`` if none."""
    lowered = name.lower()
    for cls, fragments in KERNEL_CLASSES:
        if any(f in lowered for f in fragments):
            return cls
    return "other"


@dataclass(frozen=True)
class KernelEvent:
    """One kernel (or copy) on the GPU, in profiler nanoseconds."""

    name: str
    start_ns: int
    duration_ns: int


def kernel_events(prof: Any) -> list[KernelEvent]:
    """The GPU-side events of a finished ``torch.profiler.profile``."""
    cuda = torch.autograd.DeviceType.CUDA
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None and hasattr(results, "events"):
        return [
            KernelEvent(e.name(), e.start_ns(), e.duration_ns())
            for e in results.events()
            if e.device_type() == cuda and e.duration_ns() > 0
        ]
    # Older or different builds: the FunctionEvent list (microseconds, floats).
    return [
        KernelEvent(e.name, int(e.time_range.start * 1e3), int(e.time_range.elapsed_us() * 1e3))
        for e in prof.events()
        if e.device_type == cuda and e.time_range.elapsed_us() > 0
    ]


def busy_and_gaps(events: Sequence[KernelEvent]) -> tuple[int, int, list[int]]:
    """``(span_ns, busy_ns, gaps_ns)``: the first start to the last end, the length of
    the union of the kernels' intervals (overlapping kernels count once), and each idle
    gap between them."""
    intervals = sorted((e.start_ns, e.start_ns + e.duration_ns) for e in events)
    if not intervals:
        return 0, 0, []
    busy, gaps = 0, []
    cur_start, cur_end = intervals[0]
    for start, end in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    # cur_end is the latest end of all: the last merged run holds it.
    return cur_end - intervals[0][0], busy, gaps


def gap_histogram(
    gaps_ns: Sequence[int], edges_us: Sequence[int] = IDLE_GAP_EDGES_US
) -> list[dict[str, Any]]:
    """Idle gaps by length: rows of ``[min_us, max_us)`` (``max_us`` None: unbounded)
    with their count and total seconds."""
    bounds = [0, *edges_us, None]
    rows = []
    for low, high in zip(bounds, bounds[1:]):
        inside = [g for g in gaps_ns if g >= low * 1000 and (high is None or g < high * 1000)]
        rows.append(
            {"min_us": low, "max_us": high, "count": len(inside), "seconds": sum(inside) / 1e9}
        )
    return rows


def kernels_by_time(events: Iterable[KernelEvent]) -> list[tuple[str, int, int]]:
    """``(name, calls, nanoseconds)`` of each kernel name in ``events``, costliest first."""
    by_name: dict[str, list[int]] = {}
    for e in events:
        calls_ns = by_name.setdefault(e.name, [0, 0])
        calls_ns[0] += 1
        calls_ns[1] += e.duration_ns
    return sorted(((n, c, ns) for n, (c, ns) in by_name.items()), key=lambda t: -t[2])


def top_kernels(events: Iterable[KernelEvent], limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The ``limit`` costliest kernel names of ``events``: calls and seconds of each."""
    # cuBLAS template names run to hundreds of characters; the head identifies them.
    return [
        {"name": name[:120], "calls": c, "seconds": ns / 1e9}
        for name, c, ns in kernels_by_time(events)[:limit]
    ]


def summarize_kernels(events: Sequence[KernelEvent]) -> dict[str, Any]:
    """Busy and idle time, idle gaps, device time per class and the top kernels."""
    span, busy, gaps = busy_and_gaps(events)
    classes: dict[str, int] = {}
    for e in events:
        cls = kernel_class(e.name)
        classes[cls] = classes.get(cls, 0) + e.duration_ns
    return {
        "num_kernels": len(events),
        "span_s": span / 1e9,
        "busy_s": busy / 1e9,
        "idle_s": (span - busy) / 1e9,
        "idle_gaps": gap_histogram(gaps),
        "classes_s": {c: ns / 1e9 for c, ns in sorted(classes.items(), key=lambda kv: -kv[1])},
        "top_kernels": top_kernels(events),
    }


def profile_kernels(
    llm: Any, workload: Workload, temperature: float, timeline: Any = None
) -> tuple[dict[str, Any], list[KernelEvent]]:
    """Pass 2: run ``workload`` once under ``torch.profiler`` (CUDA activity only: no host
    events, so the host slows down less); returns the summary of its kernels and the raw
    events (for ``step_kernels.kernels_by_step``). With ``timeline`` (a ``StepTimeline``
    that marks each step), the run is recorded inside it and its steps are resolved."""
    from torch.profiler import ProfilerActivity, profile

    recording = timeline if timeline is not None else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, recording:
        seconds = generate_workload(llm, workload, temperature)
        run_end = time.perf_counter()
    events = kernel_events(prof)
    engine = [e for e in events if STEP_MARKER not in e.name]
    if timeline is not None:
        timeline.resolve(run_end)
    return {"wall_s": seconds, **summarize_kernels(engine)}, events
