"""Each step's kernels by class (``step_kernels.py``): synthetic profiles with a marker
before each step, and the marker hook of the step timeline on a real CPU engine."""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.step_kernels import (
    IDLE,
    class_seconds,
    kernels_by_step,
    split_steps,
)
from minivllm.benchmarks.step_timeline import StepTimeline, StepTiming
from minivllm.benchmarks.step_timeline_kernels import (
    STEP_MARKER,
    KernelEvent,
    summarize_kernels,
)
from minivllm.benchmarks.throughput import generate_workload
from minivllm.benchmarks.workloads import Workload

MARKER = f"void at::cuda::(anonymous namespace)::{STEP_MARKER}(long)"
KV_BYTES, BANDWIDTH = 4096, 4e12


def _profile(steps: list[list[tuple[str, int]]], gap_ns: int = 0) -> list[KernelEvent]:
    """A marker, then each named kernel back to back (durations in ns), step after step;
    ``gap_ns`` of idle after every kernel."""
    events, t = [], 1_000
    for kernels in steps:
        events.append(KernelEvent(MARKER, t, 1))
        t += 1 + gap_ns
        for name, dur in kernels:
            events.append(KernelEvent(name, t, dur))
            t += dur + gap_ns
    return events


def test_split_steps_drops_the_markers_and_what_comes_before_the_first() -> None:
    events = [KernelEvent("warmup_gemm", 0, 5), *_profile([[("a", 10)], [("b", 20), ("c", 5)]])]
    steps = split_steps(reversed(events))  # order of arrival does not matter: start does
    assert [[e.name for e in s] for s in steps] == [["a"], ["b", "c"]]


def test_class_seconds_sums_each_class_and_the_idle_time_of_each_step() -> None:
    events = _profile(
        [[("nvjet_gemm", 400), ("rms_norm_kernel", 100)], [("kernel_unified_attention", 300)]],
        gap_ns=50,
    )
    markers = [e.start_ns for e in events if STEP_MARKER in e.name]
    end = max(e.start_ns + e.duration_ns for e in events)
    per_class = class_seconds(split_steps(events), markers, end)
    assert per_class["gemm"] == [400e-9, 0.0]
    assert per_class["norm"] == [100e-9, 0.0]
    assert per_class["attention"] == [0.0, 300e-9]
    # Step 1: marker (1 ns) + 50 gap, gemm, 50, norm, 50 -> the next marker: 151 ns idle.
    assert per_class[IDLE] == [pytest.approx(151e-9), pytest.approx(51e-9)]


def _steps(n_decode: int) -> list[StepTiming]:
    prompt = [StepTiming(0.0, 4, 2048, True, 2048)]
    return prompt + [
        StepTiming(0.0, b, b, False, b * (100 + 7 * i))
        for i, b in enumerate(range(1, n_decode + 1))
    ]


def test_kernels_by_step_splits_the_kinds_and_fits_each_class() -> None:
    steps = _steps(12)
    profile = [[("nvjet_big_gemm", 30_000), ("kernel_unified_attention", 9_000)]]
    for s in steps[1:]:
        kv_ns = round(s.context_tokens * KV_BYTES / BANDWIDTH * 1e9)
        profile.append(
            [("nvjet_gemm", 1_000 + 2 * s.num_reqs), ("kernel_unified_attention", 500 + kv_ns)]
        )
    out = kernels_by_step(steps, _profile(profile), KV_BYTES, BANDWIDTH)
    assert out["steps"] == 13 and out["marker"] == STEP_MARKER
    mixed, decode = out["by_kind"]["mixed"], out["by_kind"]["decode"]
    assert mixed["steps"] == 1 and mixed["classes_s"]["gemm"] == pytest.approx(30e-6)
    assert mixed["top_kernels"][0] == {"name": "nvjet_big_gemm", "calls": 1, "seconds": 30e-6}
    assert decode["steps"] == 12 and decode["classes_s"]["gemm"] == pytest.approx(
        sum(1e-6 + 2e-9 * s.num_reqs for s in steps[1:])
    )
    fit = out["decode_cost_by_class"]["classes"]
    assert fit["gemm"]["fixed_ms_per_step"] == pytest.approx(1e-3, abs=1e-6)
    assert fit["gemm"]["per_sequence_us"] == pytest.approx(2e-3, abs=1e-5)
    assert fit["attention"]["kv_time_factor"] == pytest.approx(1.0, abs=1e-3)
    assert len(out["per_step"]["gemm"]) == 13
    json.dumps(out)


def test_kernels_by_step_refuses_a_profile_whose_markers_do_not_match() -> None:
    events = _profile([[("a", 10)], [("b", 10)]])
    out = kernels_by_step(_steps(2), events, KV_BYTES, BANDWIDTH)
    assert out == {"skipped": "2 step markers in the profile for 3 steps"}
    assert kernels_by_step([], []) == {"skipped": "no steps were recorded"}
    # Without the roofline's terms there is no fit, but the split is made.
    assert "decode_cost_by_class" not in kernels_by_step(_steps(1), events)


def test_the_whole_run_summary_leaves_the_markers_out() -> None:
    events = [e for e in _profile([[("a", 10)], [("b", 10)]]) if STEP_MARKER not in e.name]
    assert summarize_kernels(events)["num_kernels"] == 2


def test_the_step_timeline_calls_its_hook_before_each_step_is_queued(llm) -> None:
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.model_runner
    queued_before: list[int] = []
    execute = runner.execute_model_async
    calls = []

    def counting(scheduler_output):
        calls.append(len(queued_before))
        return execute(scheduler_output)

    runner.execute_model_async = counting
    try:
        timeline = StepTimeline(core, before_execute=lambda: queued_before.append(1))
        wl = Workload(prompts=[[5, 6, 7], [8] * 6], output_lens=[4, 2])
        with timeline:
            generate_workload(llm, wl, 0.0)
    finally:
        del runner.execute_model_async
    # Once per step, and each time before that step reached the runner.
    assert len(queued_before) == len(timeline.steps) > 0
    assert calls[: len(timeline.steps)] == list(range(1, len(timeline.steps) + 1))


def test_the_summary_prints_the_fixed_cost_by_class(capsys) -> None:
    from minivllm.benchmarks.step_timeline import print_summary

    steps = _steps(12)
    profile = [[("nvjet_big_gemm", 30_000)]]
    profile += [[("nvjet_gemm", 1_000 + 2 * s.num_reqs)] for s in steps[1:]]
    kernels = {"busy_s": 1.0, "span_s": 1.0, "classes_s": {"gemm": 1.0}}
    kernels["by_step"] = kernels_by_step(steps, _profile(profile), KV_BYTES, BANDWIDTH)
    totals = {"steps": 13, "mixed_steps": 1, "wall_s": 1.0, "gpu_s": None, "gap_s": None}
    print_summary({"totals": totals, "kinds": [], "kernels": kernels})
    out = capsys.readouterr().out
    assert "decode step fixed cost by class (ms, profiled run): gemm 0.001" in out
