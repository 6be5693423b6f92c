"""The engine against Hugging Face transformers: greedy outputs equal token for token.

Every configuration below changes *how* the engine gets to the answer (prefix cache
hits, prefills split into chunks, requests preempted and recomputed) but must never
change the answer. The oracle is ``transformers``' own ``generate`` on the same weights,
run one prompt at a time so that no padding is involved.
"""

from __future__ import annotations

import random

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.tiny_models import ARCHITECTURES, load_hf_model, make_tiny_model

MAX_MODEL_LEN = 320


def _workload(seed: int, shared_prefix: bool) -> tuple[list[list[int]], list[int]]:
    """At least 8 prompts of lengths 1..200 and different max_tokens."""
    rng = random.Random(seed)
    lengths = [1, 7, 16, 33, 64, 100, 150, 200, 17]
    prefix = [rng.randrange(3, 512) for _ in range(96)]
    prompts = []
    for n in lengths:
        body = [rng.randrange(3, 512) for _ in range(n)]
        if shared_prefix and n > 96:
            body = prefix + body[96:]
        prompts.append(body)
    max_tokens = [rng.randint(4, 24) for _ in prompts]
    return prompts, max_tokens


def _hf_greedy(path, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    model = load_hf_model(path)
    outs = []
    with torch.no_grad():
        for ids, n in zip(prompts, max_tokens):
            inp = torch.tensor([ids])
            gen = model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=0,
            )
            outs.append(gen[0, len(ids) :].tolist())
    return outs


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_case(request, tmp_path_factory):
    arch = request.param
    path = make_tiny_model(arch, tmp_path_factory.mktemp(arch))
    cases = {}
    for shared in (False, True):
        prompts, max_tokens = _workload(seed=hash(arch) % 1000, shared_prefix=shared)
        cases[shared] = (prompts, max_tokens, _hf_greedy(path, prompts, max_tokens))
    return arch, path, cases


ENGINE_CONFIGS = {
    "default": dict(),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunked-prefill": dict(max_num_batched_tokens=48),
    # 6 blocks of 16 slots hold ~96 tokens: the 200-token prompts need 13+ blocks each,
    # so the pool must be bigger than one max-length request but far below the batch.
    "preemption": dict(num_kv_blocks=MAX_MODEL_LEN // 16 + 2, max_num_batched_tokens=64),
    # Every configuration above runs with async scheduling (the default on one device);
    # these two run each step to completion before scheduling the next.
    "sync": dict(async_scheduling=False),
    # Without prefix caching no block is shared, so the tiny pool preempts whatever the
    # random model's outputs are (with it, a run may get by on shared prefix blocks).
    "sync-preemption": dict(
        async_scheduling=False,
        enable_prefix_caching=False,
        num_kv_blocks=MAX_MODEL_LEN // 16 + 2,
        max_num_batched_tokens=64,
    ),
}


@pytest.mark.parametrize("config_name", list(ENGINE_CONFIGS))
@pytest.mark.parametrize("shared_prefix", [False, True], ids=["distinct", "shared-prefix"])
def test_greedy_matches_hf(arch_case, config_name: str, shared_prefix: bool) -> None:
    arch, path, cases = arch_case
    prompts, max_tokens, expected = cases[shared_prefix]
    llm = LLM(
        str(path),
        dtype="float32",
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        **ENGINE_CONFIGS[config_name],
    )
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outputs]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{arch}/{config_name}: prompt {i} (len {len(prompts[i])}) diverged"
    for o, e in zip(outputs, expected):
        reason = o.outputs[0].finish_reason
        assert reason == ("stop" if e and e[-1] == 2 else "length")
    stats = llm.llm_engine.stats
    assert llm.llm_engine.engine_core.engine_core.async_scheduling == ("sync" not in config_name)
    if "preemption" in config_name:
        assert stats.num_preemptions > 0, "the tiny pool was meant to force preemptions"
    caching = ENGINE_CONFIGS[config_name].get("enable_prefix_caching", True)
    if shared_prefix and caching:
        assert stats.prefix_cache_hit_rate > 0
        assert any(o.num_cached_tokens > 0 for o in outputs)
    if not caching:
        assert stats.prefix_cache_hits == 0
    # Every block is back in the pool once every request finished.
    manager = llm.llm_engine.engine_core.engine_core.kv_cache_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_triton_backend_matches_hf_on_cpu(tmp_path) -> None:
    """The Triton kernels (interpreted on the CPU) drive the whole engine to HF's tokens."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    prompts = [[5, 9, 11], list(range(3, 40)), list(range(100, 121))]
    max_tokens = [6, 4, 5]
    expected = _hf_greedy(path, prompts, max_tokens)
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64,
              attention_backend="triton", max_num_batched_tokens=24)
    assert llm.collective_rpc(lambda runner: runner.attn_backend.name) == ["triton"]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
