"""CUDA graphs change how a decode step is launched, never what it computes."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.cuda_graph import default_capture_sizes
from tests.tiny_models import make_tiny_model


def test_capture_sizes_cover_every_batch() -> None:
    sizes = default_capture_sizes(100)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 100
    assert sizes == sorted(set(sizes))
    assert default_capture_sizes(3) == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graphs_equal_eager(tmp_path, arch: str) -> None:
    path = make_tiny_model(arch, tmp_path / arch)
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (1, 5, 17, 40, 70)]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (30, 12, 25, 8, 40)]
    results = {}
    for eager in (True, False):
        llm = LLM(str(path), dtype="float32", device="cuda", max_model_len=256,
                  max_num_seqs=8, num_kv_blocks=128, enforce_eager=eager,
                  attention_backend="triton")
        has_graphs = llm.collective_rpc(lambda runner: runner.cuda_graph_runner is not None)
        assert has_graphs == [not eager]
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        del llm
        torch.cuda.empty_cache()
    assert results[True] == results[False]
