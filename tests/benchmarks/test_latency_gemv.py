"""``python -m minivllm.benchmarks.latency_gemv``: sides, environments and ratios.

The children (``minivllm bench latency``, GPU-sized) are replaced by a stand-in that
records each child's environment and writes a result whose time per token depends on
it, so the test checks what the runner does with them, not a timing.
"""

from __future__ import annotations

import json
from pathlib import Path

from minivllm.benchmarks import latency_gemv
from minivllm.model_executor.layers.linear import GEMV_MAX_M_ENV
from minivllm.model_executor.layers.qk_norm_rope import FUSED_QK_NORM_ROPE_ENV
from minivllm.model_executor.layers.triton_skinny_gemm import PDL_ENV


def test_sides_get_only_their_switches_and_ratios_use_the_baseline(tmp_path, monkeypatch):
    seen: list[dict[str, str]] = []

    def fake_run(cmd, env, check, timeout):
        seen.append({k: env[k] for k in latency_gemv.SWITCHES if k in env})
        tpot = 1.5 if env.get(FUSED_QK_NORM_ROPE_ENV) == "0" else 1.2
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
    latency_gemv.main(
        [
            "--baseline",
            "on_unfused",
            "--sides",
            "on",
            "--rounds",
            "2",
            "--output",
            str(out),
            "--",
            "--model",
            str(tmp_path),
        ]
    )
    on_unfused, on = {FUSED_QK_NORM_ROPE_ENV: "0"}, {}
    assert seen == [on_unfused, on, on_unfused, on]  # alternating, baseline first
    result = json.loads(out.read_text())
    assert result["baseline"] == "on_unfused" and list(result["runs"]) == ["on_unfused", "on"]
    assert result["on_unfused_median_tpot_ms"] == 1.5 and result["on_median_tpot_ms"] == 1.2
    assert result["tpot_on_unfused_over_on"] == 1.5 / 1.2
    assert result["side_env"] == {"on_unfused": on_unfused, "on": on}
