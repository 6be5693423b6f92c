"""The engine against Hugging Face transformers: greedy outputs equal token for token.

Every configuration below changes *how* the engine gets to the answer (prefix cache
hits, prefills split into chunks, requests preempted and recomputed) but must never
change the answer. The oracle is ``transformers``' own ``generate`` on the same weights,
run one prompt at a time so that no padding is involved.

One difference is tolerated, and only where it cannot be an error: a float32 near-tie.
The engine batches a prompt with others, splits it into chunks or recomputes it after a
preemption, so its sums run in another order than transformers' and differ in the last
bits; where the reference's best two logits are that close (seen: one ulp, 1.2e-7), either
choice is right. Such a prompt is compared up to the tie and no further (the two texts
continue from different tokens); any other difference fails.
"""

from __future__ import annotations

import random

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.tiny_models import ARCHITECTURES, load_hf_model, make_tiny_model

MAX_MODEL_LEN = 320
# The largest logit gap a reordered float32 sum can flip on this model (logits of order 1):
# rounding noise is ~1e-7; a wrong kernel or a lost KV block moves logits by far more.
TIE_TOLERANCE = 1e-5
# Each architecture gets its own workload, the same in every process (str hash() is salted
# per process, which once made the suite draw a different workload, a tie among them, per run).
WORKLOAD_SEEDS = {"llama": 11, "qwen2": 22, "qwen3": 33}


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


def _hf_logit_gap(path, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """transformers' logit of token ``a`` minus that of ``b`` after ``prompt + prefix``."""
    model = load_hf_model(path)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1]
    return (logits[a] - logits[b]).item()


def assert_greedy_equal(path, prompts, got, expected, what: str) -> None:
    """Every sequence equal to the reference, or equal up to a float32 near-tie of the
    reference (then compared no further). At most one tie per run: several would mean the
    model is too flat to test anything, not that the engine is right."""
    ties = []
    for i, (g, e) in enumerate(zip(got, expected)):
        if g == e:
            continue
        k = next((j for j, (x, y) in enumerate(zip(g, e)) if x != y), None)
        assert k is not None, f"{what}: prompt {i} (len {len(prompts[i])}) ended early or late"
        gap = _hf_logit_gap(path, prompts[i], e[:k], e[k], g[k])
        assert 0.0 <= gap <= TIE_TOLERANCE, (
            f"{what}: prompt {i} (len {len(prompts[i])}) diverged at output {k}: "
            f"{g[k]} instead of {e[k]}, which the reference prefers by {gap:.3g} (not a tie)"
        )
        ties.append((i, k, gap))
    assert len(ties) <= 1, f"{what}: near-ties at {ties}"


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_case(request, tmp_path_factory):
    arch = request.param
    path = make_tiny_model(arch, tmp_path_factory.mktemp(arch))
    cases = {}
    for shared in (False, True):
        prompts, max_tokens = _workload(WORKLOAD_SEEDS[arch], shared_prefix=shared)
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
    assert_greedy_equal(path, prompts, got, expected, f"{arch}/{config_name}")
    for o, g in zip(outputs, got):
        reason = o.outputs[0].finish_reason
        assert reason == ("stop" if g and g[-1] == 2 else "length")
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
