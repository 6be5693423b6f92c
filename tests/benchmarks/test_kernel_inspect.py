"""kernel_inspect compiles the attention kernel for sm_90 without a GPU and reports what
the compiler made of it (in a subprocess: the test session runs Triton's interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minivllm.benchmarks import kernel_inspect


def test_inspect_compiles_for_hopper_without_a_gpu(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "inspect.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "minivllm.benchmarks.kernel_inspect",
            "--config",
            "16,32,4,2,2,1",
            "--output",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["config"]["num_segments"] == 2 and row["config"]["fused_reduce"]
    assert row["registers"] > 0 and row["shared_bytes"] > 0
    # 16-row tiles multiply with mma.sync (wgmma needs 64 rows), gathered by cp.async.
    assert row["mma_sync"] > 0 and row["wgmma"] == 0 and row["cp_async"] > 0
    assert row["kv_tile_buffers"] and row["tma_copies"] == 0


def test_inspect_refuses_bad_configs_and_the_interpreter(monkeypatch) -> None:
    with pytest.raises(SystemExit):
        kernel_inspect.main(["--config", "16,64"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit) as exc:
        kernel_inspect.main([])
    assert exc.value.code == 2
