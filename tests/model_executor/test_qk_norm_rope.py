"""Qwen3's fused per-head q/k RMSNorm + rotary embedding (``QKNormRotaryEmbedding``).

The fused kernel is held to two references: the three kernels it replaces (RMSNorm over
the q heads, over the k heads, then the rotary kernel), bit for bit in the interpreter,
since it rounds at the same places; and the torch definition (RMSNorm then RoPE in
torch), within the tolerances of tests/model_executor/test_custom_ops.py. Its paged
KV-cache write is held to ``reshape_and_cache`` run after it, bit for bit on any device
(it stores the values it also writes to k, so no reduction order enters). On the CPU the
kernels run through ``TRITON_INTERPRET=1`` (tests/conftest.py), forced with
``CustomOp.force``; on a GPU the same tests run the compiled kernels, where the fused and
the unfused kernels agree within those tolerances but not bit for bit: Triton picks each
kernel's reduction layout, so the float32 sum of squares may be added in another order.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.backends.triton_attn import reshape_and_cache
from minivllm.attention.layer import KVCacheUpdate
from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.qk_norm_rope import (
    FUSED_QK_NORM_ROPE_ENV,
    QKNormRotaryEmbedding,
)
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from minivllm.model_executor.layers.triton_qk_norm_rope import (
    heads_per_program,
    qk_norm_rope,
    qk_norm_rope_kv_cache,
)
from tests.model_executor.test_custom_ops import DEVICE, TOL

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (head size, q heads, kv heads): Qwen3-0.6B's heads; a GQA group of 3; a head of 80,
# whose halves (40) are no power of two, so both the row and the halves are masked.
SHAPES = [(128, 16, 8), (64, 3, 1), (80, 2, 2)]


def _inputs(dtype, head_size, num_heads, num_kv_heads, num_tokens=3, max_pos=4096, seed=0):
    """A qkv tensor (q, k, v as column slices), norm weights and positions."""
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    qkv = (torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen) * 2).to(DEVICE, dtype)
    q_weight = (1 + 0.3 * torch.randn(head_size, generator=gen)).to(DEVICE, dtype)
    k_weight = (1 + 0.3 * torch.randn(head_size, generator=gen)).to(DEVICE, dtype)
    # Far-apart positions in random order, the last one near the end of the cache (more
    # tokens than five: random positions).
    first = [17, max_pos - 1, 0, 1000, 5]
    more = torch.randint(0, max_pos, (max(num_tokens - 5, 0),), generator=gen).tolist()
    positions = torch.tensor((first + more)[:num_tokens], device=DEVICE)
    return qkv, q_weight, k_weight, positions


def _layer(head_size, dtype, max_pos=4096) -> QKNormRotaryEmbedding:
    rope = RotaryEmbedding(head_size, max_pos, 1000000.0, dtype=dtype).to(DEVICE)
    return QKNormRotaryEmbedding(head_size, 1e-6, rope)


def _split(qkv, head_size, num_heads, num_kv_heads):
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    return qkv.split([q_size, kv_size, kv_size], dim=-1)


@pytest.mark.parametrize("num_tokens", [3, 17])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size,num_heads,num_kv_heads", SHAPES)
def test_fused_equals_the_three_kernels_it_replaces(dtype, head_size, num_heads, num_kv_heads,
                                                    num_tokens):
    """As q norm, k norm, rotary run as separate kernels (the same bits in the
    interpreter); in place; v untouched; blocks of heads, partial ones where the head
    count is no multiple of the block."""
    layer = _layer(head_size, dtype)
    qkv, q_weight, k_weight, positions = _inputs(dtype, head_size, num_heads, num_kv_heads,
                                                 num_tokens=num_tokens)
    unfused_qkv = qkv.clone()
    v_before = _split(qkv, head_size, num_heads, num_kv_heads)[2].clone()
    with CustomOp.force("cuda"):
        q, k, _ = _split(unfused_qkv, head_size, num_heads, num_kv_heads)
        q_ref, k_ref, _ = layer.forward_unfused(positions, q, k, q_weight, k_weight)
        q, k, v = _split(qkv, head_size, num_heads, num_kv_heads)
        q_out, k_out, _ = layer(positions, q, k, q_weight, k_weight)
    assert layer._forward_method == layer.forward_cuda
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    if DEVICE.type == "cpu":
        assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    else:  # compiled: the sums of squares may be reduced in another order
        torch.testing.assert_close(q_out, q_ref, **TOL[dtype])
        torch.testing.assert_close(k_out, k_ref, **TOL[dtype])
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size,num_heads,num_kv_heads", SHAPES)
def test_fused_matches_norm_then_rope_in_torch(dtype, head_size, num_heads, num_kv_heads):
    layer = _layer(head_size, dtype)
    qkv, q_weight, k_weight, positions = _inputs(
        dtype, head_size, num_heads, num_kv_heads, num_tokens=5, seed=1
    )
    with CustomOp.force("native"):
        q, k, _ = _split(qkv.clone(), head_size, num_heads, num_kv_heads)
        q_native, k_native, _ = layer(positions, q, k, q_weight, k_weight)
    with CustomOp.force("cuda"):
        q, k, _ = _split(qkv, head_size, num_heads, num_kv_heads)
        q_out, k_out, _ = layer(positions.to(torch.int32), q, k, q_weight, k_weight)
    torch.testing.assert_close(q_out, q_native, **TOL[dtype])
    torch.testing.assert_close(k_out, k_native, **TOL[dtype])


def test_native_is_rms_norm_then_rotary_of_the_layers():
    """forward_native is exactly what Qwen3 ran before the fusion: RMSNorm modules, RoPE."""
    from minivllm.model_executor.layers.layernorm import RMSNorm

    head_size, num_heads, num_kv_heads = 32, 4, 2
    rope = RotaryEmbedding(head_size, 256, 10000.0).to(DEVICE)
    layer = QKNormRotaryEmbedding(head_size, 1e-5, rope)
    qkv, q_weight, k_weight, positions = _inputs(
        torch.float32, head_size, num_heads, num_kv_heads, max_pos=256
    )
    q_norm, k_norm = RMSNorm(head_size, 1e-5).to(DEVICE), RMSNorm(head_size, 1e-5).to(DEVICE)
    with torch.no_grad():
        q_norm.weight.copy_(q_weight)
        k_norm.weight.copy_(k_weight)
    q, k, _ = _split(qkv, head_size, num_heads, num_kv_heads)
    with CustomOp.force("native"):
        expected = rope(
            positions,
            q_norm(q.reshape(3, -1, head_size)).view(3, -1),
            k_norm(k.reshape(3, -1, head_size)).view(3, -1),
        )
        actual = layer(positions, q, k, q_weight, k_weight)[:2]
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))


def test_env_switch_binds_the_unfused_kernels(monkeypatch):
    layer = _layer(64, torch.float32)
    qkv, q_weight, k_weight, positions = _inputs(torch.float32, 64, 3, 1)
    q, k, _ = _split(qkv, 64, 3, 1)
    monkeypatch.setenv(FUSED_QK_NORM_ROPE_ENV, "0")
    with CustomOp.force("cuda"):
        layer(positions, q, k, q_weight, k_weight)
        assert layer._forward_method == layer.forward_unfused
    with CustomOp.force("native"):
        layer(positions, q, k, q_weight, k_weight)
        assert layer._forward_method == layer.forward_native  # the switch is CUDA-only
    monkeypatch.delenv(FUSED_QK_NORM_ROPE_ENV)
    with CustomOp.force("cuda"):
        layer(positions, q, k, q_weight, k_weight)
        assert layer._forward_method == layer.forward_cuda


def test_rejects_bad_layouts_and_dtypes():
    cache = torch.randn(16, 8, device=DEVICE)
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    q, k = torch.randn(2, 16, device=DEVICE), torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="query must be"):
        qk_norm_rope(positions, torch.randn(2, 12, device=DEVICE), k, w, w, cache, 8, 1e-6)
    with pytest.raises(ValueError, match="key must be"):
        qk_norm_rope(positions, q, torch.randn(3, 8, device=DEVICE), w, w, cache, 8, 1e-6)
    with pytest.raises(ValueError, match="k_weight must be"):
        qk_norm_rope(positions, q, k, w, torch.ones(4, device=DEVICE), cache, 8, 1e-6)
    with pytest.raises(ValueError, match="q_weight must be"):
        qk_norm_rope(positions, q, k, w.half(), w, cache, 8, 1e-6)
    with pytest.raises(ValueError, match="positions must be"):
        qk_norm_rope(positions.float(), q, k, w, w, cache, 8, 1e-6)
    with pytest.raises(ValueError, match="head_size must be even"):
        qk_norm_rope(positions, q, k, w, w, cache, 7, 1e-6)
    with pytest.raises(ValueError, match="rotates heads of 8"):
        QKNormRotaryEmbedding(16, 1e-6, RotaryEmbedding(8, 16, 10000.0))


def test_op_traces_with_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(3, 4 * 32)
        q, k = qk_norm_rope(
            torch.zeros(3, dtype=torch.int64),
            qkv[:, :64],
            qkv[:, 64:96],
            torch.empty(32),
            torch.empty(32),
            torch.empty(8, 32),
            32,
            1e-6,
        )
    assert q.shape == (3, 64) and k.shape == (3, 32)


def test_heads_per_program():
    assert heads_per_program(16, 8) == 8  # two q blocks, one k block
    assert heads_per_program(3, 1) == 4  # a partial block of q heads, one k head
    assert heads_per_program(64, 8) == 8
    assert heads_per_program(2, 2) == 2


def _caches(num_blocks, block_size, num_kv_heads, head_size, dtype, seed=0):
    """A key/value cache pair of random contents (so an unwanted store shows) that share a
    strided layout: halves of one ``[blocks, 2, block_size, heads, head_size + 16]``
    allocation, as a view that is contiguous in its last dim only."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, 2, block_size, num_kv_heads, head_size + 16)
    both = torch.randn(shape, generator=gen).to(DEVICE, dtype)[..., :head_size]
    return both[:, 0], both[:, 1]


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
     (torch.float32, torch.float32), (torch.float32, torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize("head_size,num_heads,num_kv_heads", SHAPES)
def test_fused_cache_write_equals_reshape_and_cache(
    dtype, cache_dtype, head_size, num_heads, num_kv_heads
):
    """The cache bits reshape_and_cache writes from the same k and v, on any device:
    scattered slots over a strided cache, padding slots (-1) that write nothing, and a
    cache dtype narrower than the activations (both cast on the store). q and k are
    those of the kernel without the cache write (the same bits in the interpreter)."""
    num_tokens, block_size, num_blocks = 9, 4, 5
    qkv, q_weight, k_weight, positions = _inputs(
        dtype, head_size, num_heads, num_kv_heads, num_tokens=num_tokens, seed=2
    )
    layer = _layer(head_size, dtype)
    slots = torch.tensor([13, -1, 0, 7, 19, 4, -1, 5, 10], device=DEVICE)
    key_cache, value_cache = _caches(num_blocks, block_size, num_kv_heads, head_size, cache_dtype)
    ref_key_cache, ref_value_cache = (c.clone() for c in (key_cache, value_cache))
    initial_key_cache = key_cache.clone()
    unfused_qkv = qkv.clone()
    cos_sin = layer.rotary_emb.cos_sin_cache

    q, k, v = _split(qkv, head_size, num_heads, num_kv_heads)
    qk_norm_rope_kv_cache(positions, q, k, q_weight, k_weight, cos_sin, head_size, 1e-6,
                          v, key_cache, value_cache, slots)  # fmt: skip
    heads = (num_tokens, num_kv_heads, head_size)
    reshape_and_cache(k.view(heads), v.view(heads), ref_key_cache, ref_value_cache, slots)
    assert torch.equal(key_cache, ref_key_cache) and torch.equal(value_cache, ref_value_cache)
    # Not vacuous: the written slots changed, the others (padding included) did not.
    flat_now, flat_before = key_cache.flatten(0, 1), initial_key_cache.flatten(0, 1)
    written = slots[slots >= 0]
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    untouched[written] = False
    assert not torch.equal(flat_now[written], flat_before[written])
    assert torch.equal(flat_now[untouched], flat_before[untouched])

    q, k, _ = _split(unfused_qkv, head_size, num_heads, num_kv_heads)
    qk_norm_rope(positions, q, k, q_weight, k_weight, cos_sin, head_size, 1e-6)
    if DEVICE.type == "cpu":
        assert torch.equal(qkv, unfused_qkv)  # q, k as without the write, v untouched
    else:  # two compiled variants: each may reduce the sums of squares in its own order
        torch.testing.assert_close(qkv, unfused_qkv, **TOL[dtype])


def test_layer_writes_the_cache_only_from_the_fused_kernel(monkeypatch):
    """forward_cuda writes the cache and returns the update; native and unfused return
    None and leave the cache alone, so that attention writes it."""
    head_size, num_heads, num_kv_heads = 64, 3, 1
    layer = _layer(head_size, torch.float32)
    qkv, q_weight, k_weight, positions = _inputs(torch.float32, head_size, num_heads,
                                                 num_kv_heads)  # fmt: skip
    slots = torch.tensor([2, 0, 5], device=DEVICE)
    cache = KVCacheUpdate(*_caches(2, 4, num_kv_heads, head_size, torch.float32), slots)
    before = [c.clone() for c in cache[:2]]

    def run(impl):
        q, k, v = _split(qkv.clone(), head_size, num_heads, num_kv_heads)
        with CustomOp.force(impl):
            return layer(positions, q, k, q_weight, k_weight, v, cache)

    assert run("native")[2] is None
    monkeypatch.setenv(FUSED_QK_NORM_ROPE_ENV, "0")
    assert run("cuda")[2] is None
    assert all(torch.equal(c, b) for c, b in zip(cache[:2], before, strict=True))
    monkeypatch.delenv(FUSED_QK_NORM_ROPE_ENV)
    assert run("cuda")[2] is cache
    assert not torch.equal(cache.key_cache, before[0])
    assert not torch.equal(cache.value_cache, before[1])
    q, k, _ = _split(qkv.clone(), head_size, num_heads, num_kv_heads)
    with CustomOp.force("cuda"), pytest.raises(ValueError, match="needs value"):
        layer(positions, q, k, q_weight, k_weight, None, cache)


def test_cache_write_rejects_bad_arguments():
    head_size = 8
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    w, cos_sin = torch.ones(head_size, device=DEVICE), torch.randn(16, head_size, device=DEVICE)
    q, k, v = (torch.randn(2, n, device=DEVICE) for n in (16, 8, 8))
    cache = torch.zeros(3, 4, 1, head_size, device=DEVICE)
    slots = torch.zeros(2, dtype=torch.int64, device=DEVICE)

    def call(value=v, key_cache=cache, value_cache=None, slot_mapping=slots):
        value_cache = cache.clone() if value_cache is None else value_cache
        qk_norm_rope_kv_cache(positions, q, k, w, w, cos_sin, head_size, 1e-6, value,
                              key_cache, value_cache, slot_mapping)  # fmt: skip

    with pytest.raises(ValueError, match="value must be"):
        call(value=torch.randn(2, 16, device=DEVICE))
    with pytest.raises(ValueError, match="value must be"):
        call(value=v.double())
    with pytest.raises(ValueError, match="key must have shape"):
        call(key_cache=torch.zeros(3, 4, 2, head_size, device=DEVICE),
             value_cache=torch.zeros(3, 4, 2, head_size, device=DEVICE))  # fmt: skip
    with pytest.raises(ValueError, match="share one layout"):
        call(value_cache=torch.zeros(3, 1, 4, head_size, device=DEVICE).transpose(1, 2))
    with pytest.raises(ValueError, match="slot_mapping must be"):
        call(slot_mapping=slots.float())
    with pytest.raises(ValueError, match="slot_mapping must be contiguous"):
        call(slot_mapping=torch.zeros(4, dtype=torch.int64, device=DEVICE)[::2])


def test_cache_write_op_traces_with_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(3, 4 * 32)
        cache = torch.empty(2, 4, 1, 32)
        q, k = qk_norm_rope_kv_cache(
            torch.zeros(3, dtype=torch.int64), qkv[:, :64], qkv[:, 64:96], torch.empty(32),
            torch.empty(32), torch.empty(8, 32), 32, 1e-6, qkv[:, 96:], cache, cache.clone(),
            torch.zeros(3, dtype=torch.int64),
        )  # fmt: skip
    assert q.shape == (3, 64) and k.shape == (3, 32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="forces the kernels onto CPU tensors")
def test_qwen3_on_triton_writes_the_cache_from_the_fused_kernel(tmp_path, monkeypatch):
    """A tiny Qwen3 over the Triton backend: the fused kernel writes the cache, the layer
    launches no reshape_and_cache, and logits and caches are those of the unfused path."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from minivllm.attention.layer import Attention
    from minivllm.attention.selector import get_attn_backend
    from tests.model_executor.paged_forward import PagedForward
    from tests.model_executor.test_models import NEXT_TOKENS, PROMPTS, _load
    from tests.tiny_models import make_tiny_model

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    path = make_tiny_model("qwen3", tmp_path, num_hidden_layers=2)
    backend = get_attn_backend("triton", torch.device("cpu"))

    def run(fused: str) -> tuple[torch.Tensor, list[torch.Tensor], list[str]]:
        monkeypatch.setenv(FUSED_QK_NORM_ROPE_ENV, fused)
        model = _load(path)
        runner = PagedForward(model, num_seqs=len(PROMPTS))
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer in layers:
            layer.backend = backend
        mode = Ops()
        with CustomOp.force("cuda"), mode:
            logits = torch.cat([runner.step(PROMPTS), runner.step([[t] for t in NEXT_TOKENS])])
        return logits, [c for layer in layers for c in layer.kv_cache], mode.names

    logits, caches, ops = run("1")
    ref_logits, ref_caches, ref_ops = run("0")
    steps_x_layers = 2 * 2
    assert ops.count("qk_norm_rope_kv_cache") == steps_x_layers
    assert "reshape_and_cache" not in ops
    assert ref_ops.count("reshape_and_cache") == steps_x_layers
    assert "qk_norm_rope_kv_cache" not in ref_ops
    assert all(torch.equal(c, r) for c, r in zip(caches, ref_caches, strict=True))
    assert any(c.count_nonzero() for c in caches)
    assert torch.equal(logits, ref_logits)


@pytest.mark.skipif(torch.cuda.is_available(), reason="forces the kernels onto CPU tensors")
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "draft-model"])
def test_engine_on_the_fused_cache_write_matches_hf_greedy(speculative, tmp_path, monkeypatch):
    """The whole engine on the Triton backend, every layer on its kernel: chunked
    prefills, a prefix-cache hit and (draft-model) a Qwen3 draft with a cache of its own,
    all over caches the fused kernel writes, give HF's greedy tokens."""
    from minivllm import LLM, SamplingParams
    from minivllm.attention.backends import triton_attn
    from minivllm.model_executor.layers import triton_qk_norm_rope
    from tests.engine.test_llm_engine import _hf_greedy
    from tests.tiny_models import make_tiny_model

    calls: list[str] = []
    fused, separate = triton_qk_norm_rope.qk_norm_rope_kv_cache, triton_attn.reshape_and_cache
    monkeypatch.setattr(triton_qk_norm_rope, "qk_norm_rope_kv_cache",
                        lambda *args: calls.append("fused") or fused(*args))  # fmt: skip
    monkeypatch.setattr(triton_attn, "reshape_and_cache",
                        lambda *args: calls.append("separate") or separate(*args))  # fmt: skip
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    prefix = list(range(3, 40))  # two full blocks of 16, cached by the first request
    prompts = [prefix + [50, 51], prefix + [60, 61, 62], list(range(100, 121)), [5, 9]]
    max_tokens = [6, 5, 4, 7]
    expected = _hf_greedy(path, prompts, max_tokens)
    spec = {"method": "draft_model", "model": str(path), "num_speculative_tokens": 2}
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    with CustomOp.force("cuda"):
        llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64, block_size=16,
                  attention_backend="triton", max_num_batched_tokens=24,
                  speculative_config=spec if speculative else None)  # fmt: skip
        llm.generate([{"prompt_token_ids": prompts[0]}], params[:1], use_tqdm=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert any(o.num_cached_tokens > 0 for o in outputs)
    # Every cache write, the draft's included, came from the fused kernel.
    assert "fused" in calls and "separate" not in calls
