"""CustomOp dispatch, and each fused Triton layer kernel against its ``forward_native``.

On the CPU the kernels run through ``TRITON_INTERPRET=1`` (set by tests/conftest.py),
forced with ``CustomOp.force("cuda")``; on a GPU the same tests run the real kernels.

Tolerances. float32 and float16 are tight: the kernels round exactly where the torch
code does, so only the order of a float32 sum (RMSNorm) and fused multiply-adds differ.
bfloat16 is compared within a few bf16 steps, because the Triton *interpreter* converts
float32 to bfloat16 by truncation while torch (and the GPU's cvt.rn) rounds to nearest;
with up to three roundings in a row (rotary: product, product, sum) each may be one step
(2^-7 relative) off.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.model_executor.custom_op import NATIVE_OPS_ENV, CustomOp
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.qk_norm_rope import QKNormRotaryEmbedding
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from minivllm.model_executor.layers.triton_layernorm import fused_add_rms_norm, rms_norm
from minivllm.model_executor.layers.triton_rotary import rotary_embedding
from tests.model_executor.paged_forward import PagedForward
from tests.model_executor.test_models import CASES, NEXT_TOKENS, PROMPTS, _hf_logits, _load
from tests.tiny_models import load_hf_model, make_tiny_model

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Forcing the kernels onto CPU tensors works only in Triton's interpreter, i.e. without a
# GPU. On a GPU the same model-level check is tests/engine/test_llm_engine_gpu.py, where
# dispatch picks the kernels by itself.
interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="forces Triton kernels onto CPU tensors (interpreter only)"
)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2.5e-2},
}


def _native_and_cuda(module: torch.nn.Module, *args: torch.Tensor):
    """Run ``module`` natively and through the kernels (on clones: the kernels write in place)."""
    with CustomOp.force("native"):
        native = module(*[a.clone() for a in args])
    with CustomOp.force("cuda"):
        fused = module(*args)
    return native, fused


# ---------------------------------------------------------------------------- dispatch


@interpreter_only
def test_dispatch_picks_native_on_cpu_unless_forced(monkeypatch):
    monkeypatch.delenv(NATIVE_OPS_ENV, raising=False)
    norm = RMSNorm(8)
    x = torch.randn(2, 8)
    norm(x)
    assert norm._forward_method == norm.forward_native
    with CustomOp.force("cuda"):
        norm(x)
        assert norm._forward_method == norm.forward_cuda
    norm(x)  # leaving the block re-binds
    assert norm._forward_method == norm.forward_native
    assert CustomOp.selected_impl(torch.device("cpu")) == "native"


def test_dispatch_rule_for_cuda_devices_and_the_env_switch(monkeypatch):
    from minivllm.model_executor import custom_op

    monkeypatch.delenv(NATIVE_OPS_ENV, raising=False)
    monkeypatch.setattr(custom_op, "triton_available", lambda: (True, ""))
    assert CustomOp.selected_impl(torch.device("cuda")) == "cuda"
    monkeypatch.setenv(NATIVE_OPS_ENV, "1")
    assert CustomOp.selected_impl(torch.device("cuda")) == "native"
    monkeypatch.delenv(NATIVE_OPS_ENV)
    monkeypatch.setattr(custom_op, "triton_available", lambda: (False, "no triton"))
    assert CustomOp.selected_impl(torch.device("cuda")) == "native"
    with pytest.raises(ValueError, match="impl must be one of"), CustomOp.force("triton"):
        pass


# ---------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [48, 64])  # 48: not a power of two, masked lanes
def test_rms_norm_matches_native(dtype, hidden):
    norm = RMSNorm(hidden, eps=1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x = (torch.randn(5, hidden, device=DEVICE) * 3).to(dtype)
    native, fused = _native_and_cuda(norm, x)
    assert fused.dtype == dtype and fused.shape == x.shape
    torch.testing.assert_close(fused, native, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_updates_residual_in_place(dtype):
    hidden = 40
    norm = RMSNorm(hidden).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(6, hidden, device=DEVICE).to(dtype)
    residual = torch.randn(6, hidden, device=DEVICE).to(dtype)
    x_before = x.clone()
    (native_out, native_res), (out, res) = _native_and_cuda(norm, x, residual)
    assert res is residual  # the stream was updated in place, as upstream does
    assert torch.equal(x, x_before)  # the sublayer output is only read
    # The sum is one rounding of x + residual: exact in float32/float16.
    tol = TOL[dtype] if dtype == torch.bfloat16 else {"atol": 0, "rtol": 0}
    torch.testing.assert_close(residual, native_res, **tol)
    torch.testing.assert_close(out, native_out, **TOL[dtype])


def test_per_head_norm_reads_strided_views_of_qkv():
    """Qwen3's q/k norm: rows of D over a ``[T, H, D]`` view of the fused qkv output."""
    head, num_heads, num_kv = 16, 3, 1
    qkv = torch.randn(4, (num_heads + 2 * num_kv) * head, device=DEVICE)
    q = qkv[:, : num_heads * head].view(4, num_heads, head)  # non-contiguous rows
    weight = torch.randn(head, device=DEVICE)
    norm = RMSNorm(head).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(weight)
    with CustomOp.force("native"):
        expected = norm(q)
    torch.testing.assert_close(rms_norm(q, weight, 1e-6), expected, **TOL[torch.float32])
    torch.testing.assert_close(rms_norm(q.reshape(-1, head), weight, 1e-6),
                               expected.view(-1, head), **TOL[torch.float32])


def test_rms_norm_rejects_mismatched_shapes():
    weight = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="last dimension must match weight"):
        rms_norm(torch.randn(2, 6, device=DEVICE), weight, 1e-6)
    with pytest.raises(ValueError, match="x and residual"):
        fused_add_rms_norm(torch.randn(2, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE),
                           weight, 1e-6)


# ---------------------------------------------------------------------------- rotary


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size,num_heads,num_kv_heads", [(64, 3, 1), (128, 2, 2)])
def test_rotary_matches_native_on_qkv_slices(dtype, head_size, num_heads, num_kv_heads):
    """q and k are column slices of one qkv tensor; positions are in random order."""
    rope = RotaryEmbedding(head_size, 256, 10000.0, dtype=dtype).to(DEVICE)
    num_tokens = 5
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, device=DEVICE).to(dtype)
    v_before = qkv[:, q_size + kv_size :].clone()
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    positions = torch.randperm(256, device=DEVICE)[:num_tokens]
    (q_native, k_native), (q_out, k_out) = _native_and_cuda(rope, positions, q, k)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    torch.testing.assert_close(q, q_native, **TOL[dtype])
    torch.testing.assert_close(k, k_native, **TOL[dtype])
    assert torch.equal(qkv[:, q_size + kv_size :], v_before)  # v untouched


def test_rotary_llama3_scaled_cache_and_int32_positions():
    rope = get_rope(64, 128, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 32}).to(DEVICE)
    q = torch.randn(4, 2 * 64, device=DEVICE)
    k = torch.randn(4, 64, device=DEVICE)
    positions = torch.tensor([100, 3, 77, 0], dtype=torch.int32, device=DEVICE)
    (q_native, k_native), (q_out, k_out) = _native_and_cuda(rope, positions, q, k)
    torch.testing.assert_close(q_out, q_native, **TOL[torch.float32])
    torch.testing.assert_close(k_out, k_native, **TOL[torch.float32])


def test_rotary_rejects_bad_layouts():
    cache = torch.randn(16, 8, device=DEVICE)
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="query must be"):
        rotary_embedding(positions, torch.randn(2, 12, device=DEVICE),
                         torch.randn(2, 8, device=DEVICE), 8, cache)
    with pytest.raises(ValueError, match="positions must be"):
        rotary_embedding(positions.float(), torch.randn(2, 16, device=DEVICE),
                         torch.randn(2, 8, device=DEVICE), 8, cache)


# ---------------------------------------------------------------------------- SiLU-and-mul


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [40, 1030])  # 1030: more than one 1024-wide block per row
def test_silu_and_mul_matches_native(dtype, d):
    x = (torch.randn(2, 2 * d, device=DEVICE) * 4).to(dtype)
    native, fused = _native_and_cuda(SiluAndMul(), x)
    assert fused.shape == (2, d)
    torch.testing.assert_close(fused, native, **TOL[dtype])


def test_silu_and_mul_keeps_leading_dims_and_rejects_odd_width():
    from minivllm.model_executor.layers.triton_activation import silu_and_mul

    x = torch.randn(2, 3, 16, device=DEVICE)
    native, fused = _native_and_cuda(SiluAndMul(), x)
    assert fused.shape == (2, 3, 8)
    torch.testing.assert_close(fused, native, **TOL[torch.float32])
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul(torch.randn(2, 7, device=DEVICE))


# ---------------------------------------------------------------------------- torch.compile


def test_ops_trace_with_fake_tensors():
    """The fake implementations let tracing (torch.compile's first step) pass the ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 32)
        out = rms_norm(x, torch.empty(32), 1e-6)
        q, k = rotary_embedding(torch.zeros(3, dtype=torch.int64), torch.empty(3, 64),
                                torch.empty(3, 32), 32, torch.empty(8, 32))
    assert out.shape == (3, 32) and q.shape == (3, 64) and k.shape == (3, 32)


def test_layers_compile_with_the_kernels_inside():
    """``torch.compile`` (functionalising the in-place ops) gives the native results."""
    norm, rope, act = RMSNorm(32).to(DEVICE), RotaryEmbedding(16, 64, 10000.0).to(DEVICE), \
        SiluAndMul()

    def block(positions, x, residual, qkv):
        h, residual = norm(x, residual)
        q, k = rope(positions, qkv[:, :32], qkv[:, 32:48])
        return act(h), residual, q.clone(), k.clone()

    args = (torch.tensor([3, 1, 7], device=DEVICE), torch.randn(3, 32, device=DEVICE),
            torch.randn(3, 32, device=DEVICE), torch.randn(3, 64, device=DEVICE))
    with CustomOp.force("native"):
        expected = block(*[a.clone() for a in args])
    with CustomOp.force("cuda"):
        compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
        actual = compiled(*[a.clone() for a in args])
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **TOL[torch.float32])


# ---------------------------------------------------------------------------- a whole model


@interpreter_only
@pytest.mark.parametrize("name", ["qwen3", "llama-rope-llama3"])
def test_model_with_kernels_matches_hf(name, tmp_path):
    """The HF comparison of test_models.py, every CustomOp forced onto its kernel.

    Qwen3 covers the fused add + norm, the fused per-head q/k norm + rotary on slices of
    qkv, and the small-M GEMM with SiLU-and-mul fused in; the Llama-3 case rotates slices
    of qkv with the rotary kernel, with a scaled cos/sin cache.
    """
    arch, overrides, _ = CASES[name]
    path = make_tiny_model(arch, tmp_path, **overrides)
    model, hf_model = _load(path), load_hf_model(path)
    runner = PagedForward(model, num_seqs=len(PROMPTS))
    with CustomOp.force("cuda"):
        generation = CustomOp._generation
        prefill = runner.step(PROMPTS)
        decode = runner.step([[t] for t in NEXT_TOKENS])
    # Every layer that ran took its kernel (Qwen3's q_norm/k_norm/rotary_emb modules only
    # hold weights and the cache: QKNormRotaryEmbedding runs them). Only the layers bound
    # inside the block count: get_rope shares one RotaryEmbedding between models, so an
    # earlier test's model may have bound it to another implementation.
    ran = [
        m for m in model.modules() if isinstance(m, CustomOp) and m._bound_generation == generation
    ]
    assert ran and all(m._forward_method == m.forward_cuda for m in ran)
    assert (name == "qwen3") == any(isinstance(m, QKNormRotaryEmbedding) for m in ran)
    expected = torch.cat([_hf_logits(hf_model, p) for p in PROMPTS])
    torch.testing.assert_close(prefill, expected, atol=1e-4, rtol=1e-4)
    expected = torch.stack(
        [_hf_logits(hf_model, p + [t])[-1] for p, t in zip(PROMPTS, NEXT_TOKENS, strict=True)]
    )
    torch.testing.assert_close(decode, expected, atol=1e-4, rtol=1e-4)
