"""Each step's kernels, by class: the ``kernels.by_step`` section of ``bench throughput
--step-timeline``.

The profiler pass (``step_timeline_kernels.py``) says which kernels fill a whole run; the
first pass (``step_timeline.py``) says what each step costs the GPU. This joins the two:
during the profiled run, the step timeline's runner wrapper queues a *marker* before
each step's kernels, a one-thread kernel that does nothing (``torch.cuda._sleep(0)``,
ATen's ``spin_kernel``: no compilation, and no engine kernel has that name). On one CUDA
stream the kernels run in the order they were queued, so everything that starts between
one marker and the next belongs to one step, even with async scheduling, where the host
queues a step before the previous one has run. With each step's kernels and the
scheduler's record of the step (its batch, its context, mixed or decode):

* ``by_kind``: the kernel seconds of each class in the decode steps and in the mixed
  (prompt) steps, and each kind's costliest kernels: what a prompt step spends its time
  on, which the whole-run totals hide among the decode steps;
* ``decode_cost_by_class``: the decode cost fit (``step_cost_model.py``) done on each
  class's kernel time per step, so the fixed cost per step splits into GEMMs, attention,
  norms, ... and the idle time between a step's kernels.

Upstream has no such tool; its profiler trace (``vllm bench throughput --profile``) shows
the same per-step kernels to a person scrolling a viewer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minivllm.benchmarks.step_cost_model import fit_decode_cost_by_class
from minivllm.benchmarks.step_timeline_kernels import (
    STEP_MARKER,
    KernelEvent,
    busy_and_gaps,
    kernel_class,
    top_kernels,
)

# The pseudo-class of a step's time on the GPU that no kernel of it fills: from its marker
# to the next step's marker, minus the union of its kernels.
IDLE = "idle"
TOP_KERNELS_PER_KIND = 12


def launch_step_marker() -> None:
    """Queue the step marker on the current CUDA stream (a kernel that spins 0 cycles)."""
    torch.cuda._sleep(0)


def split_steps(events: Sequence[KernelEvent]) -> list[list[KernelEvent]]:
    """The events after each marker, up to the next one, in start order (the markers
    themselves left out); events before the first marker belong to no step and are
    dropped."""
    steps: list[list[KernelEvent]] = []
    for e in sorted(events, key=lambda e: e.start_ns):
        if STEP_MARKER in e.name:
            steps.append([])
        elif steps:
            steps[-1].append(e)
    return steps


def class_seconds(
    step_events: Sequence[Sequence[KernelEvent]], marker_starts: Sequence[int], end_ns: int
) -> dict[str, list[float]]:
    """Per class, each step's kernel seconds; ``IDLE``: the step's span (its marker to the
    next one's, the last to ``end_ns``) minus the union of its kernels. Classes a step
    lacks are 0 there."""
    per_class: dict[str, list[float]] = {}
    n = len(step_events)
    for i, events in enumerate(step_events):
        for e in events:
            per_class.setdefault(kernel_class(e.name), [0.0] * n)[i] += e.duration_ns / 1e9
        stop = marker_starts[i + 1] if i + 1 < n else end_ns
        busy_ns = busy_and_gaps(events)[1]  # the union of its kernels' intervals
        idle = (stop - marker_starts[i] - busy_ns) / 1e9
        per_class.setdefault(IDLE, [0.0] * n)[i] = max(idle, 0.0)
    return per_class


def kernels_by_step(
    steps: Sequence[Any],
    events: Sequence[KernelEvent],
    kv_bytes_per_token: int | None = None,
    copy_bandwidth: float | None = None,
) -> dict[str, Any]:
    """Attribute ``events`` (a profiled run with a marker before each step) to ``steps``
    (that run's ``StepTiming``s, in order); with the roofline's ``kv_bytes_per_token``
    and ``copy_bandwidth``, also fit the decode cost per class. ``{"skipped": why}``
    when the markers do not match the steps one to one."""
    if not steps:
        return {"skipped": "no steps were recorded"}
    markers = sorted(e.start_ns for e in events if STEP_MARKER in e.name)
    if len(markers) != len(steps):
        return {"skipped": f"{len(markers)} step markers in the profile for {len(steps)} "
                           "steps"}  # fmt: skip
    step_events = split_steps(events)
    end_ns = max(e.start_ns + e.duration_ns for e in events)
    per_class = class_seconds(step_events, markers, end_ns)
    by_kind: dict[str, Any] = {}
    for kind in ("decode", "mixed"):
        idx = [i for i, s in enumerate(steps) if s.mixed == (kind == "mixed")]
        classes = {c: sum(v[i] for i in idx) for c, v in per_class.items()}
        by_kind[kind] = {
            "steps": len(idx),
            "classes_s": dict(sorted(classes.items(), key=lambda kv: -kv[1])),
            "top_kernels": top_kernels(
                (e for i in idx for e in step_events[i]), TOP_KERNELS_PER_KIND
            ),
        }
    out: dict[str, Any] = {"marker": STEP_MARKER, "steps": len(steps), "by_kind": by_kind}
    if kv_bytes_per_token is not None and copy_bandwidth is not None:
        out["decode_cost_by_class"] = fit_decode_cost_by_class(
            steps, per_class, kv_bytes_per_token, copy_bandwidth
        )
    out["per_step"] = {c: [round(x, 7) for x in v] for c, v in sorted(per_class.items())}
    return out
