"""``benchmarks/step_compare.py``: pairing two runs' steps (synthetic logs), and the
log's wrappers on a real engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm.benchmarks.step_compare import StepLog, compare_steps


def _log(seconds: list[float], tokens: list[int], requests: list[int]) -> SimpleNamespace:
    return SimpleNamespace(seconds=seconds, tokens=tokens, requests=requests)


def test_excess_splits_into_prefill_and_decode_steps() -> None:
    # Step 0 queued a prompt chunk (tokens > requests), steps 1-3 decodes, step 4 nothing.
    tokens, requests = [40, 3, 3, 3, 0], [3, 3, 3, 3, 0]
    slow = _log([0.050, 0.004, 0.009, 0.004, 0.001], tokens, requests)
    fast = _log([0.020, 0.004, 0.004, 0.004, 0.001], tokens, requests)
    out = compare_steps(slow, fast, top=2)
    assert out["same_schedule"] and out["steps"] == [5, 5]
    assert out["prefill_excess_s"] == pytest.approx(0.030)
    assert out["decode_excess_s"] == pytest.approx(0.005)
    assert out["excess_s"] == pytest.approx(0.035)
    assert [s["index"] for s in out["worst_steps"]] == [0, 2]
    assert out["worst_steps"][0] == {"index": 0, "tokens": 40, "requests": 3,
                                     "slow_ms": pytest.approx(50.0),
                                     "fast_ms": pytest.approx(20.0)}


def test_different_schedules_are_flagged_and_paired_up_to_the_shorter() -> None:
    slow = _log([0.01, 0.01, 0.01], [5, 1, 1], [1, 1, 1])
    fast = _log([0.01, 0.02], [5, 2], [1, 2])
    out = compare_steps(slow, fast)
    assert not out["same_schedule"] and out["steps"] == [3, 2]
    assert out["excess_s"] == pytest.approx(-0.01)


def test_step_log_times_each_step_and_unwraps(llm) -> None:
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    with StepLog(llm) as log:
        llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], use_tqdm=False)
    assert len(log.seconds) == len(log.tokens) == len(log.requests) > 1
    assert log.tokens[0] == 4 and log.requests[0] == 1  # the prompt, in the first step
    assert all(t >= 0.0 for t in log.seconds)
    assert "step" not in vars(engine) and "schedule" not in vars(scheduler)
