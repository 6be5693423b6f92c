"""``bench throughput --cold`` and the sampled run (CPU, tiny model: shape, not speed)."""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.throughput_cold import allocator_delta, compiled_kernels, more_or_less
from minivllm.cli import main
from tests.benchmarks.test_bench_smoke import COMMON, qwen3_dir  # noqa: F401 - fixture

WORKLOAD = ["--num-requests", "3", "--input-len-range", "4", "12", "--output-len-range", "2", "5"]


def test_throughput_reports_greedy_and_sampled(qwen3_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "t.json"
    main(["bench", "throughput", "--model", qwen3_dir, *WORKLOAD, "--output", str(out), *COMMON])
    mini = json.loads(out.read_text())["minivllm"]
    assert mini["sampled"]["temperature"] == 0.6
    assert mini["sampled"]["output_tokens_per_s"] > 0
    assert mini["sampled"]["fraction_of_roofline"] > 0
    # Start-up (LLM(...) to ready) is timed; device memory and graphs need CUDA.
    assert mini["startup_s"] > 0 and mini["device_memory"] is None
    assert mini["cuda_graph_gib"] is None


def test_cold_runs_two_fresh_processes_on_one_new_cache(qwen3_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "cold.json"
    main(["bench", "throughput", "--cold", "--model", qwen3_dir, *WORKLOAD, "--output", str(out),
          *COMMON])
    result = json.loads(out.read_text())
    assert "--cold" in result["command"]
    for start in ("cold", "warm"):
        assert result[start]["startup_s"] > 0
        for run in ("first_run", "second_run", "greedy_run"):
            assert result[start][run]["output_tokens_per_s"] > 0
    assert result["cold"]["first_run"]["temperature"] == 0.6
    assert result["cold"]["greedy_run"]["temperature"] == 0.0
    assert result["first_over_second"] > 0
    for start in ("cold", "warm"):
        child = result[start]
        for run in ("first_run", "second_run", "greedy_run"):
            # The parent gave the child an empty cache folder: a count, never None.
            assert child[run]["kernels_compiled"] >= 0
            assert len(child[run]["compiled"]) == child[run]["kernels_compiled"]
            assert child[run]["allocator"] is None  # no CUDA here
            assert 0.0 <= child[run]["host_busy_s"] <= child[run]["seconds"]
            assert child[run]["gc_s"] >= 0.0
            assert child[run]["minor_page_faults"] >= 0  # Linux, as CI
        steps = child["first_vs_second_steps"]
        # Same workload, same deterministic schedule: the two runs pair step by step.
        assert steps["same_schedule"] and steps["steps"][0] == steps["steps"][1] > 0
        assert steps["excess_s"] == pytest.approx(
            steps["prefill_excess_s"] + steps["decode_excess_s"])
        assert any(s["tokens"] > s["requests"] for s in steps["worst_steps"]) or (
            steps["prefill_excess_s"] == 0.0)


def test_a_difference_reads_as_more_or_less() -> None:
    assert more_or_less(0.0324) == "32 ms more"
    assert more_or_less(-0.0036) == "4 ms less"
    assert more_or_less(-0.0004) == "0 ms more"  # rounds to nothing: no "-0"


def test_allocator_delta_subtracts_per_counter() -> None:
    before = {"num_device_alloc": 3, "num_device_free": 1, "num_alloc_retries": 0}
    after = {"num_device_alloc": 5, "num_device_free": 4, "num_alloc_retries": 1}
    assert allocator_delta(before, after) == {
        "num_device_alloc": 2, "num_device_free": 3, "num_alloc_retries": 1}
    assert allocator_delta(None, after) is None and allocator_delta(before, None) is None


def test_compiled_kernels_are_named_from_their_cache_entries(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for entry, files in (
        ("AB12", ["kernel_unified_attention.json", "kernel_unified_attention.cubin"]),
        ("CD34", ["__grp__skinny_gemm_kernel.json", "skinny_gemm_kernel.json"]),
    ):
        (tmp_path / entry).mkdir()
        for name in files:
            (tmp_path / entry / name).write_text("{}")
    (tmp_path / "stray-file").write_text("")
    assert compiled_kernels({"CD34", "AB12", "stray-file"}) == [
        "kernel_unified_attention", "skinny_gemm_kernel"]
