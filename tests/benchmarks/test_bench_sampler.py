"""``minivllm bench sampler`` runs end to end on the CPU at a tiny shape (Triton's
interpreter runs the kernel). Not a timing: it keeps the command working between GPU
runs and checks the result file records its figures and its on-device checks."""

from __future__ import annotations

import json
import os

import pytest
import torch

from minivllm.cli import main


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)
def test_bench_sampler_records_both_paths_and_checks(tmp_path) -> None:
    out = tmp_path / "sampler.json"
    tiny = ["--num-rows", "4", "--vocab-size", "64", "--iters", "2", "--rounds", "1"]
    main(["bench", "sampler", *tiny, "--check-draws", "4096", "--allow-cpu", "--output", str(out)])
    result = json.loads(out.read_text())
    assert "bench sampler" in result["command"]
    assert set(result["us_per_call"]) == {"greedy", "general", "gumbel"}
    assert result["general_over_gumbel"] > 0
    checks = result["checks"]
    assert checks["greedy_rows_equal_argmax"]
    assert checks["chi_square_pvalue_at_0.7"] > 1e-3 > checks["chi_square_pvalue_drawn_at_0.8"]
