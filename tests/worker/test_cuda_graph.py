"""CUDA graphs change how a decode step is launched, never what it computes."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.cuda_graph import default_capture_sizes, default_prefill_capture_sizes
from tests.tiny_models import make_tiny_model


def test_capture_sizes_cover_every_batch() -> None:
    sizes = default_capture_sizes(100)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 100
    assert sizes == sorted(set(sizes))
    assert default_capture_sizes(3) == [1, 2, 3]


def test_prefill_capture_sizes_stop_at_the_budget_and_2048() -> None:
    assert default_prefill_capture_sizes(16384) == [32, 64, 128, 256, 512, 1024, 2048]
    assert default_prefill_capture_sizes(100) == [32, 64]
    assert default_prefill_capture_sizes(16) == []


def _replays(runner) -> dict[str, int] | None:
    graphs = runner.cuda_graph_runner
    return None if graphs is None else dict(graphs.num_replays)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("budget", [64, 2048])
def test_graphs_equal_eager(tmp_path, arch: str, budget: int) -> None:
    """Decode graphs, and prefill graphs for whole prompts (budget 2048) and for chunks
    mixed with decodes (budget 64: chunked prefill), against the eager forward pass."""
    path = make_tiny_model(arch, tmp_path / arch)
    lens = (1, 5, 17, 40, 70, 33, 130)
    prompts = [{"prompt_token_ids": [3 + (7 * i) % 90 for i in range(n)]} for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (30, 12, 25, 8, 40, 3, 9)]
    results = {}
    for eager in (True, False):
        llm = LLM(
            str(path),
            dtype="float32",
            device="cuda",
            max_model_len=256,
            max_num_seqs=8,
            max_num_batched_tokens=budget,
            num_kv_blocks=128,
            enforce_eager=eager,
            attention_backend="triton",
        )
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        replays = llm.collective_rpc(_replays)[0]
        if eager:
            assert replays is None
        else:
            assert replays["decode"] > 0 and replays["prefill"] > 0, replays
        del llm
        torch.cuda.empty_cache()
    assert results[True] == results[False]
