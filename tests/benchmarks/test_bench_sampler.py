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
    tiny = ["--num-rows", "4", "--vocab-size", "64", "--iters", "2", "--rounds", "1", "--sweep",
            "--host-calls", "5"]  # fmt: skip
    main(["bench", "sampler", *tiny, "--check-draws", "4096", "--allow-cpu", "--output", str(out)])
    result = json.loads(out.read_text())
    assert "bench sampler" in result["command"]
    assert set(result["us_per_call"]) == {"greedy", "general", "gumbel"}
    assert result["general_over_gumbel"] > 0
    host = result["host"]
    assert all(host[k] > 0 for k in host if k.endswith("_us"))
    assert host["metadata_reused_us"] < host["metadata_build_us"]
    assert result["sweep"]["same_tokens_every_tiling"] and len(result["sweep"]["tilings"]) > 1
    checks = result["checks"]
    assert checks["greedy_rows_equal_argmax"]
    assert checks["chi_square_pvalue"] > 1e-3 > checks["chi_square_pvalue_wrong_temperature"]


def test_bench_throughput_compare_sampler(tmp_path) -> None:
    """``bench throughput --compare-sampler`` records the general path's run and the
    kernel's second run next to the first (on the CPU both take the general path), and
    ``--profile-temperature`` profiles sampled steps."""
    from tests.tiny_models import make_tiny_model

    model = make_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=10240)
    out = tmp_path / "throughput.json"
    workload = ["--num-requests", "2", "--input-len-range", "4", "8",
                "--output-len-range", "2", "3"]  # fmt: skip
    engine = ["--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "4",
              "--max-num-batched-tokens", "32", "--allow-cpu"]  # fmt: skip
    main(["bench", "throughput", "--model", str(model), *workload, *engine, "--compare-sampler",
          "--profile-dir", str(tmp_path / "prof"), "--profile-temperature", "0.6",
          "--output", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["profile"]["temperature"] == 0.6
    compared = result["minivllm"]["sampled_general_path"]
    assert compared["kernel_speedup"] > 0
    for run in ("kernel_off", "kernel_on_again"):
        assert compared[run]["output_tokens_per_s"] > 0
        assert compared[run]["fraction_of_roofline"] > 0
