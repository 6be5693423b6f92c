"""The engine on a GPU with the Triton backend equals Hugging Face greedy decoding."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.engine.test_llm_engine import _hf_greedy, _workload
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_triton_engine_matches_hf(tmp_path, arch: str, eager: bool, async_scheduling) -> None:
    path = make_tiny_model(arch, tmp_path / arch)
    prompts, max_tokens = _workload(seed=3, shared_prefix=True)
    expected = _hf_greedy(path, prompts, max_tokens)
    llm = LLM(str(path), dtype="float32", device="cuda", max_model_len=320,
              attention_backend="triton", enforce_eager=eager, max_num_batched_tokens=64,
              num_kv_blocks=64, async_scheduling=async_scheduling)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
