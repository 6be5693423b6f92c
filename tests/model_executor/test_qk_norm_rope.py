"""Qwen3's fused per-head q/k RMSNorm + rotary embedding (``QKNormRotaryEmbedding``).

The fused kernel is held to two references: the three kernels it replaces (RMSNorm over
the q heads, over the k heads, then the rotary kernel), bit for bit in the interpreter,
since it rounds at the same places; and the torch definition (RMSNorm then RoPE in
torch), within the tolerances of tests/model_executor/test_custom_ops.py. On the CPU the
kernels run through ``TRITON_INTERPRET=1`` (tests/conftest.py), forced with
``CustomOp.force``; on a GPU the same tests run the compiled kernels, where the fused and
the unfused kernels agree within those tolerances but not bit for bit: Triton picks each
kernel's reduction layout, so the float32 sum of squares may be added in another order.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.qk_norm_rope import (
    FUSED_QK_NORM_ROPE_ENV,
    QKNormRotaryEmbedding,
)
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from minivllm.model_executor.layers.triton_qk_norm_rope import heads_per_program, qk_norm_rope
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
        q_ref, k_ref = layer.forward_unfused(positions, q, k, q_weight, k_weight)
        q, k, v = _split(qkv, head_size, num_heads, num_kv_heads)
        q_out, k_out = layer(positions, q, k, q_weight, k_weight)
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
        q_native, k_native = layer(positions, q, k, q_weight, k_weight)
    with CustomOp.force("cuda"):
        q, k, _ = _split(qkv, head_size, num_heads, num_kv_heads)
        q_out, k_out = layer(positions.to(torch.int32), q, k, q_weight, k_weight)
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
        actual = layer(positions, q, k, q_weight, k_weight)
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
