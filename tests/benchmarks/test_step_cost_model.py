"""The decode cost fit of ``bench throughput --step-timeline`` (``step_cost_model.py``) on
synthetic steps whose GPU times follow known coefficients."""

from __future__ import annotations

import random

import pytest

from minivllm.benchmarks.step_cost_model import (
    MIN_DECODE_STEPS,
    RANK_DEFICIENT,
    fit_decode_cost,
    fit_decode_cost_by_class,
)
from minivllm.benchmarks.step_timeline import StepTiming

KV_BYTES, WEIGHT_BYTES, BANDWIDTH = 4096, 10**9, 4e12
FIXED, PER_SEQ, KV_FACTOR = 1.4e-3, 0.9e-6, 1.05


def _decode_steps(n: int, noise: float = 0.0, seed: int = 0) -> list[StepTiming]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        reqs = rng.randint(1, 256)
        context = reqs * rng.randint(100, 2000)
        gpu = FIXED + PER_SEQ * reqs + KV_FACTOR * context * KV_BYTES / BANDWIDTH
        steps.append(StepTiming(0.0, reqs, reqs, False, context, gpu_s=gpu + rng.gauss(0, noise)))
    return steps


def test_the_fit_recovers_the_coefficients_and_splits_the_run() -> None:
    steps = _decode_steps(200)
    cost = fit_decode_cost(steps, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    assert cost["decode_steps"] == 200
    assert cost["fixed_ms_per_step"] == pytest.approx(FIXED * 1e3, rel=1e-6)
    assert cost["per_sequence_us"] == pytest.approx(PER_SEQ * 1e6, rel=1e-6)
    assert cost["kv_time_factor"] == pytest.approx(KV_FACTOR, rel=1e-6)
    assert cost["r_squared"] == pytest.approx(1.0) and cost["residual_rms_ms"] < 1e-9
    assert cost["outlier_steps"] == 0
    totals = cost["totals_s"]
    assert totals["fixed"] + totals["per_sequence"] + totals["kv"] == pytest.approx(totals["gpu"])
    assert totals["unexplained"] == pytest.approx(0.0, abs=1e-12)
    assert totals["kv"] == pytest.approx(KV_FACTOR * totals["kv_at_copy_bandwidth"])
    weights = WEIGHT_BYTES / BANDWIDTH
    assert cost["weights_ms_per_step_at_copy_bandwidth"] == pytest.approx(weights * 1e3)
    assert totals["weights_at_copy_bandwidth"] == pytest.approx(weights * 200)
    assert totals["fixed_over_weights"] == pytest.approx((FIXED - weights) * 200)


def test_mixed_steps_and_steps_without_gpu_times_are_left_out() -> None:
    steps = _decode_steps(50)
    extra = [
        StepTiming(0.0, 30, 16384, True, 16384, gpu_s=0.035),  # a prefill step
        StepTiming(0.0, 64, 64, False, 64_000, gpu_s=None),  # no CUDA event
    ]
    clean = fit_decode_cost(steps, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    fitted = fit_decode_cost(steps + extra, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    assert fitted == clean


def test_noise_shows_in_the_residual_not_in_the_totals() -> None:
    cost = fit_decode_cost(_decode_steps(400, noise=5e-5), KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    assert cost["residual_rms_ms"] == pytest.approx(0.05, rel=0.2)
    assert cost["fixed_ms_per_step"] == pytest.approx(FIXED * 1e3, rel=0.02)
    # Gaussian noise leaves few steps beyond three standard deviations, and their time
    # off the line is all that goes unexplained.
    assert cost["outlier_steps"] <= 8
    totals = cost["totals_s"]
    assert abs(totals["unexplained"]) < 8 * 3.5 * 5e-5
    parts = totals["fixed"] + totals["per_sequence"] + totals["kv"] + totals["unexplained"]
    assert parts == pytest.approx(totals["gpu"])


def test_steps_stretched_by_the_host_are_left_out_of_the_fit() -> None:
    steps = _decode_steps(400, noise=2e-5, seed=1)
    stretched = steps[::40]  # ten steps that waited 2 ms for their launches
    for s in stretched:
        s.gpu_s += 2e-3
    plain = fit_decode_cost(steps, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    # The stretched steps, and the odd step of the noise's tails.
    assert len(stretched) <= plain["outlier_steps"] <= len(stretched) + 8
    assert plain["fixed_ms_per_step"] == pytest.approx(FIXED * 1e3, rel=0.02)
    assert plain["per_sequence_us"] == pytest.approx(PER_SEQ * 1e6, rel=0.1)
    assert plain["kv_time_factor"] == pytest.approx(KV_FACTOR, rel=0.01)
    # The waiting is reported, not spread over the coefficients.
    assert plain["totals_s"]["unexplained"] == pytest.approx(len(stretched) * 2e-3, rel=0.05)
    totals = plain["totals_s"]
    parts = totals["fixed"] + totals["per_sequence"] + totals["kv"] + totals["unexplained"]
    assert parts == pytest.approx(totals["gpu"])


def test_steps_that_cannot_support_a_fit_are_skipped_with_the_reason() -> None:
    few = fit_decode_cost(_decode_steps(MIN_DECODE_STEPS - 1), KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    assert "at least" in few["skipped"]
    cpu = [StepTiming(0.0, 4, 4, False, 400) for _ in range(20)]  # host times only
    assert "0 decode steps" in fit_decode_cost(cpu, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)["skipped"]
    # The same batch and context every step: three coefficients, one distinct point.
    flat = [StepTiming(0.0, 8, 8, False, 8000, gpu_s=1e-3) for _ in range(20)]
    assert "vary" in fit_decode_cost(flat, KV_BYTES, WEIGHT_BYTES, BANDWIDTH)["skipped"]


def test_the_fit_by_class_recovers_each_class_and_adds_up_to_the_sum() -> None:
    # Two classes with their own coefficients; the second is fixed-cost only.
    steps = _decode_steps(120)
    gemm = [1.0e-3 + 0.2e-6 * s.num_reqs for s in steps]
    attention = [0.3e-3 + KV_FACTOR * s.context_tokens * KV_BYTES / BANDWIDTH for s in steps]
    mixed = StepTiming(0.0, 30, 16384, True, 16384)  # a prompt step: not fitted
    fit = fit_decode_cost_by_class(
        [*steps, mixed],
        {"gemm": [*gemm, 0.04], "attention": [*attention, 0.01]},
        KV_BYTES,
        BANDWIDTH,
    )
    assert fit["decode_steps"] == 120 and fit["outlier_steps"] == 0
    g, a, total = fit["classes"]["gemm"], fit["classes"]["attention"], fit["total"]
    assert g["fixed_ms_per_step"] == pytest.approx(1.0) and g["per_sequence_us"] == pytest.approx(
        0.2
    )
    assert g["kv_time_factor"] == pytest.approx(0.0, abs=1e-9)
    assert a["fixed_ms_per_step"] == pytest.approx(0.3) and a["kv_time_factor"] == pytest.approx(
        KV_FACTOR
    )
    for key in ("fixed_ms_per_step", "per_sequence_us", "kv_time_factor", "seconds"):
        assert g[key] + a[key] == pytest.approx(total[key], abs=1e-9)
    assert g["seconds"] == pytest.approx(sum(gemm))  # the decode steps' seconds only


def test_the_fit_by_class_leaves_out_the_steps_the_sum_finds_outlying() -> None:
    steps = _decode_steps(100)
    idle = [0.0] * 100
    for i in (3, 40, 77):
        idle[i] = 5e-3  # the GPU waited inside these steps: only the idle class shows it
    gemm = [1.0e-3 + 0.5e-6 * s.num_reqs for s in steps]
    fit = fit_decode_cost_by_class(steps, {"gemm": gemm, "idle": idle}, KV_BYTES, BANDWIDTH)
    assert fit["outlier_steps"] == 3
    assert fit["classes"]["idle"]["fixed_ms_per_step"] == pytest.approx(0.0, abs=1e-9)
    assert fit["classes"]["idle"]["seconds"] == pytest.approx(15e-3)
    assert fit["classes"]["gemm"]["per_sequence_us"] == pytest.approx(0.5)


def test_the_fit_by_class_says_why_it_is_skipped() -> None:
    few = _decode_steps(MIN_DECODE_STEPS - 1)
    fit = fit_decode_cost_by_class(few, {"gemm": [1e-3] * len(few)}, KV_BYTES, BANDWIDTH)
    assert fit == {"skipped": f"{MIN_DECODE_STEPS - 1} decode steps (at least "
                              f"{MIN_DECODE_STEPS} are needed)"}  # fmt: skip
    same = [StepTiming(0.0, 8, 8, False, 8000) for _ in range(20)]
    fit = fit_decode_cost_by_class(same, {"gemm": [1e-3] * 20}, KV_BYTES, BANDWIDTH)
    assert fit == {"skipped": RANK_DEFICIENT}
