"""``python -m minivllm.benchmarks.spec_profile``: its per-step reduction of the profiler's
events and its argument checks (the profile itself needs a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from minivllm.benchmarks.spec_profile import _check_args, _per_step, build_arg_parser


def _event(name: str, start: float, end: float, device: str = "CPU", parent=None):
    return SimpleNamespace(
        name=name,
        device_type=SimpleNamespace(name=device),
        time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start),
        cpu_parent=parent,
    )


def test_events_reduce_to_per_step_counts_and_times() -> None:
    top = _event("aten::copy_", 0, 10)
    events = [
        top,
        _event("aten::empty", 1, 2, parent=top),  # nested: not a call of the Python code
        _event("cudaMemcpyAsync", 2, 4, parent=top),
        _event("aten::argmax", 10, 20),
        _event("cudaLaunchKernel", 11, 12),
        _event("cudaGraphLaunch", 20, 40),
        _event("kernel", 12, 30, device="CUDA"),
        _event("Memcpy DtoD", 30, 34, device="CUDA"),
    ]
    per_step = _per_step(events, steps=2)
    assert per_step == {
        "kernel_launches": 0.5,
        "graph_launches": 0.5,
        "copies": 0.5,
        "tensor_ops": 1.0,
        "wall_us": 20.0,
        "gpu_us": 11.0,
    }


def test_real_profiler_events_have_what_the_reduction_reads() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = torch.ones(4)
        (x + 1)[1:].sum()
    per_step = _per_step(prof.events(), steps=1)
    assert per_step["tensor_ops"] >= 4 and per_step["gpu_us"] == 0 and per_step["wall_us"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--k", "0"], "--k must be >= 1"),
        (["--prompt-file", "/nonexistent/kjv.txt"], "--prompt-file"),
        (["--output-len", "40", "--profile-steps", "30"], "--output-len must exceed"),
    ],
)
def test_bad_arguments_name_the_flag(argv, message) -> None:
    args = build_arg_parser().parse_args(["--model", "m", "--draft-model", "d", *argv])
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        _check_args(args)
