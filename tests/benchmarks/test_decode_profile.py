"""``bench throughput --decode-profile``: decode steps of fixed batches under the profiler
(on the CPU there are no GPU kernels: the engine side and the arithmetic are checked)."""

from __future__ import annotations

import pytest

from minivllm.benchmarks.decode_profile import (
    DECODE_PROFILE_STEPS,
    run_decode_profiles,
    summarize_steps,
)
from minivllm.benchmarks.step_timeline_kernels import KernelEvent
from minivllm.cli import main


def test_each_batch_is_profiled_while_all_its_requests_decode(llm, capsys) -> None:
    rows = run_decode_profiles(llm, [3, 1], context=20, temperature=0.6)
    assert [(r["batch"], r["running"], r["context"]) for r in rows] == [(3, 3, 20), (1, 1, 20)]
    assert all(r["steps"] == DECODE_PROFILE_STEPS for r in rows)
    # The rest of each batch was aborted: the engine is ready for the next one.
    assert not llm.llm_engine.has_unfinished_requests()
    assert "decode B=3:" in capsys.readouterr().out


def test_summary_is_per_step_by_class_and_by_kernel() -> None:
    events = [
        KernelEvent("kernel_unified_attention", 0, 30_000),
        KernelEvent("kernel_unified_attention", 50_000, 34_000),
        KernelEvent("nvjet_sm90_tst_64x32", 90_000, 6_000),
        KernelEvent("rms_norm_kernel", 100_000, 2_000),
    ]
    out = summarize_steps(events, steps=2)
    assert out["kernels_per_step"] == 2.0
    assert out["device_us_per_step"] == pytest.approx(36.0)
    assert out["classes_us_per_step"] == pytest.approx(
        {"attention": 32.0, "gemm": 3.0, "norm": 1.0})
    assert list(out["classes_us_per_step"]) == ["attention", "gemm", "norm"]  # costliest first
    top = out["top_kernels"][0]
    assert top["name"] == "kernel_unified_attention"
    assert (top["calls_per_step"], top["us_per_call"], top["us_per_step"]) == (1.0, 32.0, 32.0)


def test_bad_sizes_fail_before_anything_loads(tmp_path, capsys) -> None:
    for flags, shown in ((["--decode-profile", "0"], "[0]"),
                         (["--decode-profile", "8", "--decode-profile-context", "0"], "and 0")):
        code = main(["bench", "throughput", "--allow-cpu", *flags,
                     "--model", str(tmp_path / "none")])  # fmt: skip
        assert code == 2
        err = capsys.readouterr().err
        assert "--decode-profile sizes and --decode-profile-context must be >= 1" in err
        assert shown in err
