"""``minivllm bench tp`` end to end on the CPU: a tiny Qwen3 at TP=2 (gloo) and TP=1.

Not a timing: it keeps the benchmark from rotting between GPU runs and checks what its
JSON records. In float32 on the CPU the split sums round like the unsplit ones, so
every greedy sequence must be identical, with nothing to explain.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest

from minivllm.benchmarks.tensor_parallel import compare
from minivllm.cli import main
from minivllm.outputs import CompletionOutput
from minivllm.runner_outputs import Logprob
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.timeout(180)


def test_bench_tp_runs_both_sizes_side_by_side(tmp_path) -> None:
    # The published workload draws token ids up to 10000.
    model = make_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=10240)
    out = tmp_path / "tp.json"
    argv = ["bench", "tp", "--model", str(model), "--dtype", "float32", "--max-model-len",
            "64", "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--num-requests",
            "4", "--input-len-range", "4", "24", "--output-len-range", "2", "8",
            "--warmup-requests", "1", "--equiv-requests", "2", "--equiv-max-tokens", "4",
            "--compare-sync", "--compare-all-reduce", "--allow-cpu",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("minivllm bench tp")
    for key in ("torch", "transformers", "python", "nccl_env", "date_utc"):
        assert key in result
    tp1, tpn = result["tp1"], result["tpn"]
    assert (tp1["tensor_parallel_size"], tpn["tensor_parallel_size"]) == (1, 2)
    assert tp1["async_scheduling"] and tpn["async_scheduling"]
    assert result["tpn_over_tp1"] == tpn["output_tokens_per_s"] / tp1["output_tokens_per_s"]
    assert tpn["sync"]["output_tokens_per_s"] > 0
    # --compare-all-reduce: a second TP=2 engine with MINIVLLM_SYMM_MEM=0 (on the CPU
    # both reduce through gloo, so their greedy tokens agree exactly).
    nccl = result["tpn_nccl"]
    assert tpn["symm_mem_allowed"] and not nccl["symm_mem_allowed"]
    assert nccl["tensor_parallel_size"] == 2 and "sync" not in nccl
    assert result["symm_mem_over_nccl"] == (
        tpn["output_tokens_per_s"] / nccl["output_tokens_per_s"]
    )
    assert result["nccl_vs_symm_mem_greedy"]["num_identical"] == 4
    assert result["workload"]["num_requests"] == 4
    assert result["workload_greedy"] == {
        "num_sequences": 4,
        "num_identical": 4,
        "first_divergence_positions": [],
    }
    eq = result["equivalence"]
    assert (eq["num_prompts"], eq["num_identical"], eq["divergences"]) == (2, 2, [])
    assert out.with_suffix(".png").stat().st_size > 0
    assert multiprocessing.active_children() == []


def _completion(tokens: list[int], top2: list[tuple[int, float, int, float]]) -> CompletionOutput:
    logprobs = [{a: Logprob(la, 1), b: Logprob(lb, 2)} for a, la, b, lb in top2]
    return CompletionOutput(0, "", tokens, None, logprobs=logprobs)


def test_compare_reports_the_margin_at_the_first_divergence() -> None:
    ref_top2 = [(5, -1.0, 9, -3.0), (6, -2.0, 8, -2.015625), (7, -1.0, 1, -4.0)]
    ref = _completion([5, 6, 7], ref_top2)
    other = _completion([5, 8, 4], [(5, -1.0, 9, -3.0), (8, -2.0, 6, -2.0), (4, -1.0, 1, -2.0)])
    same = _completion([5, 6, 7], ref_top2)
    result = compare([ref, same], [other, same])
    assert result["num_identical"] == 1 and result["max_tp1_margin"] == 0.015625
    (d,) = result["divergences"]
    assert (d["prompt"], d["position"]) == (0, 1)
    assert d["tp1_top2"] == [(6, -2.0), (8, -2.015625)] and d["tpn_margin"] == 0.0
