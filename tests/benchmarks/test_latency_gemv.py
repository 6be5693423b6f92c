"""``python -m minivllm.benchmarks.latency_gemv``: sides, environments and ratios.

The children (``minivllm bench latency``, GPU-sized) are replaced by a stand-in that
records each child's environment and writes a result whose time per token depends on
it, so the test checks what the runner does with them, not a timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minivllm.benchmarks import latency_gemv
from minivllm.model_executor.layers.norm_linear import NORM_GEMV_ENV
from minivllm.model_executor.layers.qk_norm_rope import FUSED_QK_NORM_ROPE_ENV
from minivllm.model_executor.layers.utils import GEMV_MAX_M_ENV, PDL_ENV


def test_sides_get_only_their_switches_and_ratios_use_the_baseline(tmp_path, monkeypatch):
    seen: list[dict[str, str]] = []

    def fake_run(cmd, env, check, timeout):
        seen.append({k: env[k] for k in latency_gemv.SWITCHES if k in env})
        tpot = (
            1.2
            + 0.2 * (env.get(FUSED_QK_NORM_ROPE_ENV) == "0")
            + 0.1 * (env.get(NORM_GEMV_ENV) == "0")
        )
        output = Path(cmd[cmd.index("--output") + 1])
        output.write_text(
            json.dumps(
                {
                    "median_tpot_ms": tpot,
                    "median_ttft_ms": 2.0,
                    "profile": {"device_busy_ms_per_step": tpot},
                }
            )
        )

    monkeypatch.setattr(latency_gemv.subprocess, "run", fake_run)
    # Switches set in the caller's shell must not leak into a side that does not set them.
    monkeypatch.setenv(GEMV_MAX_M_ENV, "0")
    monkeypatch.setenv(PDL_ENV, "1")
    out = tmp_path / "latency.json"
    args = ["--baseline", "on_unfused", "--sides", "on_qk_fused", "on", "--rounds", "2"]
    latency_gemv.main([*args, "--output", str(out), "--", "--model", str(tmp_path)])
    unfused = {FUSED_QK_NORM_ROPE_ENV: "0", NORM_GEMV_ENV: "0"}
    qk_fused = {NORM_GEMV_ENV: "0"}
    assert seen == [unfused, qk_fused, {}] * 2  # alternating, baseline first
    result = json.loads(out.read_text())
    assert result["baseline"] == "on_unfused"
    assert list(result["runs"]) == ["on_unfused", "on_qk_fused", "on"]
    assert result["on_unfused_median_tpot_ms"] == pytest.approx(1.5)
    assert result["tpot_on_unfused_over_on"] == pytest.approx(1.5 / 1.2)
    assert result["tpot_on_unfused_over_on_qk_fused"] == pytest.approx(1.5 / 1.3)
    assert result["side_env"] == {"on_unfused": unfused, "on_qk_fused": qk_fused, "on": {}}
