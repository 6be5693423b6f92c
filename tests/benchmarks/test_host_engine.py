"""``bench host --engine``: the real engine's decode steps timed phase by phase (here on the
CPU with the demo model; on a GPU each step's device time comes with them)."""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.host_engine import PHASES, PhaseTimers
from minivllm.cli import main
from minivllm.demo import demo_model_path
from minivllm.worker.async_utils import AsyncOutput


def test_bench_host_engine_times_every_phase(tmp_path) -> None:
    out = tmp_path / "host_engine.json"
    args = ["bench", "host", "--engine", "--model", str(demo_model_path()), "--batch-sizes",
            "1", "3", "--prompt-len", "12", "--steps", "4", "--output", str(out)]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "engine" and result["device"] == "cpu"
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        p = row["phases_ms_per_step"]
        assert set(p) == {label for label, _, _ in PHASES}
        assert all(v > 0 for v in p.values()), p
        # Sub-phases run inside their phase.
        inside = sum(v for k, v in p.items() if k.startswith("execute."))
        assert inside <= p["execute"]
        assert p["process_step.wait"] + p["process_step.update"] <= p["process_step"]
        assert 0 < row["host_busy_ms_per_step"] <= row["wall_ms_per_step"]
        assert row["gpu_ms_median"] is None  # no CUDA events on the CPU


def test_phase_timers_restore_what_they_wrapped(llm) -> None:
    timers = PhaseTimers(llm)
    runner, model = timers.targets["runner"], timers.targets["model"]
    sampler, get_output = runner.sampler, AsyncOutput.get_output
    with timers:
        assert runner.sampler is not sampler and AsyncOutput.get_output is not get_output
    assert runner.sampler is sampler and AsyncOutput.get_output is get_output
    assert "_prepare_inputs" not in vars(runner) and "compute_logits" not in vars(model)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--batch-sizes", "4", "0"], "--batch-sizes must all be >= 1"),
     (["--temperature", "-1"], "--temperature must be >= 0")],
)  # fmt: skip
def test_bench_host_refuses_bad_engine_arguments(flags, message, capsys) -> None:
    assert main(["bench", "host", "--engine", *flags]) == 2
    assert message in capsys.readouterr().err
