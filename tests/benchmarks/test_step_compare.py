"""``benchmarks/step_compare.py``: pairing two runs' steps (synthetic logs), and the
log's wrappers on a real engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm.benchmarks.step_compare import StepLog, compare_steps


def _log(
    seconds: list[float], tokens: list[int], requests: list[int],
    launch: list[float] | None = None, wait: list[float] | None = None,
) -> SimpleNamespace:  # fmt: skip
    zeros = [0.0] * len(seconds)
    return SimpleNamespace(seconds=seconds, tokens=tokens, requests=requests,
                           launch=launch or zeros, wait=wait or zeros)  # fmt: skip


def test_excess_splits_into_prefill_and_decode_steps() -> None:
    # Step 0 queued a prompt chunk (tokens > requests), steps 1-3 decodes, step 4 nothing.
    tokens, requests = [40, 3, 3, 3, 0], [3, 3, 3, 3, 0]
    # The prefill step lost its time launching; decode step 2 waiting for the device.
    slow = _log([0.050, 0.004, 0.009, 0.004, 0.001], tokens, requests,
                launch=[0.040, 0.001, 0.001, 0.001, 0.0], wait=[0.005, 0.002, 0.007, 0.002, 0.0])
    fast = _log([0.020, 0.004, 0.004, 0.004, 0.001], tokens, requests,
                launch=[0.010, 0.001, 0.001, 0.001, 0.0], wait=[0.005, 0.002, 0.002, 0.002, 0.0])
    out = compare_steps(slow, fast, top=2)
    assert out["same_schedule"] and out["steps"] == [5, 5]
    assert out["prefill_excess_s"] == pytest.approx(0.030)
    assert out["decode_excess_s"] == pytest.approx(0.005)
    assert out["excess_s"] == pytest.approx(0.035)
    assert out["launch_excess_s"] == pytest.approx(0.030)
    assert out["wait_excess_s"] == pytest.approx(0.005)
    assert [s["index"] for s in out["worst_steps"]] == [0, 2]
    assert out["worst_steps"][0] == {
        "index": 0, "tokens": 40, "requests": 3,
        "slow_ms": pytest.approx(50.0), "fast_ms": pytest.approx(20.0),
        "slow_launch_ms": pytest.approx(40.0), "fast_launch_ms": pytest.approx(10.0),
        "slow_wait_ms": pytest.approx(5.0), "fast_wait_ms": pytest.approx(5.0),
    }  # fmt: skip


def test_different_schedules_are_flagged_and_paired_up_to_the_shorter() -> None:
    slow = _log([0.01, 0.01, 0.01], [5, 1, 1], [1, 1, 1])
    fast = _log([0.01, 0.02], [5, 2], [1, 2])
    out = compare_steps(slow, fast)
    assert not out["same_schedule"] and out["steps"] == [3, 2]
    assert out["excess_s"] == pytest.approx(-0.01)


def test_step_log_times_each_step_and_unwraps(llm) -> None:
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    runner = core.model_executor.model_runner
    with StepLog(llm) as log:
        llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], use_tqdm=False)
    n = len(log.seconds)
    assert n == len(log.tokens) == len(log.requests) == len(log.launch) == len(log.wait) > 1
    assert log.tokens[0] == 4 and log.requests[0] == 1  # the prompt, in the first step
    assert log.launch[0] > 0.0  # the first call queued the prompt's step
    for total, launch, wait in zip(log.seconds, log.launch, log.wait, strict=True):
        assert 0.0 <= launch + wait <= total
    assert sum(log.wait) > 0.0  # some call waited for a step's tokens
    assert "step" not in vars(engine) and "schedule" not in vars(core.scheduler)
    assert "execute_model_async" not in vars(runner)


def test_step_log_nests_inside_host_busy(llm) -> None:
    """``bench throughput --cold`` runs both: each puts back what it found."""
    from minivllm.benchmarks.throughput_repeats import HostBusy

    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.model_runner
    with HostBusy(llm) as busy, StepLog(llm) as log:
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], use_tqdm=False)
    # StepLog wraps HostBusy's wrappers: it saw the same calls, timed from outside.
    assert 0.0 < busy.step_s <= sum(log.seconds)
    assert 0.0 < busy.wait_s <= sum(log.wait)
    assert "step" not in vars(engine) and "execute_model_async" not in vars(runner)
