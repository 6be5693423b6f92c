"""RMSNorm (with the residual add) fused into the next linear layer's small-M kernel.

The fused kernel is held to the two layers it replaces, run as they run alone: the
residual stream bit for bit (one rounding of the sum), the projection within the
tolerances of tests/model_executor/test_custom_ops.py. On the CPU the kernels run
through ``TRITON_INTERPRET=1``, forced with ``CustomOp.force("cuda")``.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.norm_linear import (
    NORM_GEMV_DEFAULT,
    NORM_GEMV_ENV,
    rms_norm_linear,
    warm_up_norm_gemv,
)
from minivllm.model_executor.layers.triton_norm_gemv import rms_norm_gemv
from minivllm.model_executor.layers.utils import GEMV_MAX_M_ENV
from tests.model_executor.paged_forward import PagedForward
from tests.model_executor.test_custom_ops import DEVICE, TOL
from tests.model_executor.test_models import NEXT_TOKENS, PROMPTS, _hf_logits, _load
from tests.tiny_models import load_hf_model, make_tiny_model


def _layers(k: int, n: int, dtype: torch.dtype, bias: bool = False):
    gen = torch.Generator().manual_seed(k + n)
    norm, linear = RMSNorm(k, eps=1e-5), ColumnParallelLinear(k, n, bias=bias)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(k, generator=gen))
        linear.weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    return norm.to(DEVICE, dtype), linear.to(DEVICE, dtype)


def _unfused(norm, linear, x, residual):
    """The two layers as separate calls (on clones: RMSNorm updates the residual in place)."""
    residual = None if residual is None else residual.clone()
    with CustomOp.force("cuda"):
        if residual is None:
            return linear(norm(x)), x
        hidden, residual = norm(x.clone(), residual)
        return linear(hidden), residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("k,n,bias", [(64, 40, False), (48, 24, True)])  # 48: masked lanes
def test_fused_equals_norm_then_linear(dtype, rows, with_residual, k, n, bias):
    norm, linear = _layers(k, n, dtype, bias)
    x = (torch.randn(rows, k, device=DEVICE) * 2).to(dtype)
    residual = torch.randn(rows, k, device=DEVICE).to(dtype) if with_residual else None
    before = None if residual is None else residual.clone()
    expected, expected_residual = _unfused(norm, linear, x, residual)
    out, new_residual = rms_norm_gemv(
        x, residual, norm.weight, norm.variance_epsilon, linear.weight, linear.bias
    )
    assert out.shape == (rows, n) and out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOL[dtype])
    if residual is None:
        assert new_residual is x
    else:
        assert torch.equal(new_residual, expected_residual)  # x + residual, rounded once
        assert torch.equal(residual, before)  # out of place: the old stream is left alone


def test_dispatch_fuses_only_small_batches_on_the_kernel_path(monkeypatch):
    norm, linear = _layers(32, 16, torch.float32)
    calls = []
    from minivllm.model_executor.layers import triton_norm_gemv

    real = triton_norm_gemv.rms_norm_gemv
    monkeypatch.setattr(
        triton_norm_gemv, "rms_norm_gemv", lambda *a: calls.append(a[0].shape[0]) or real(*a)
    )
    monkeypatch.setenv(NORM_GEMV_ENV, "1")
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    for rows in (1, 2, 3):
        x = torch.randn(rows, 32, device=DEVICE)
        with CustomOp.force("cuda"):
            out, residual = rms_norm_linear(norm, linear, x, torch.zeros_like(x))
        expected, _ = _unfused(norm, linear, x, torch.zeros_like(x))
        torch.testing.assert_close(out, expected, **TOL[torch.float32])
    with CustomOp.force("native"):
        rms_norm_linear(norm, linear, torch.randn(1, 32, device=DEVICE), None)
    row_parallel = RowParallelLinear(32, 16).to(DEVICE)
    monkeypatch.setenv(NORM_GEMV_ENV, "0")
    with CustomOp.force("cuda"):
        rms_norm_linear(norm, linear, torch.randn(1, 32, device=DEVICE), None)
    monkeypatch.setenv(NORM_GEMV_ENV, "1")
    with CustomOp.force("cuda"):
        rms_norm_linear(norm, row_parallel, torch.randn(1, 32, device=DEVICE), None)
    monkeypatch.setenv(GEMV_MAX_M_ENV, "0")  # every linear layer on F.linear: no fusion
    with CustomOp.force("cuda"):
        rms_norm_linear(norm, linear, torch.randn(1, 32, device=DEVICE), None)
    assert calls == [1, 2]


def test_rejects_what_it_cannot_fuse():
    norm, linear = _layers(32, 16, torch.float32)
    w, eps = norm.weight, norm.variance_epsilon
    with pytest.raises(ValueError, match="at most 2 x 1024"):
        rms_norm_gemv(torch.randn(3, 32, device=DEVICE), None, w, eps, linear.weight)
    with pytest.raises(ValueError, match="residual must be"):
        rms_norm_gemv(
            torch.randn(1, 32, device=DEVICE),
            torch.randn(2, 32, device=DEVICE),
            w,
            eps,
            linear.weight,
        )


def test_warm_up_launches_each_column_parallel_shape(monkeypatch):
    from torch import nn

    monkeypatch.setenv(NORM_GEMV_ENV, "1")
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    model = nn.Sequential(
        ColumnParallelLinear(32, 16),
        ColumnParallelLinear(32, 16),
        RowParallelLinear(16, 32),
        ColumnParallelLinear(16, 48),
    ).to(DEVICE)
    for layer in model:
        torch.nn.init.normal_(layer.weight)
    with CustomOp.force("cuda"):
        assert warm_up_norm_gemv(model) == 2 * 2 * 2  # 2 shapes x 1, 2 rows x residual or not
    with CustomOp.force("native"):
        assert warm_up_norm_gemv(model) == 0
    monkeypatch.delenv(NORM_GEMV_ENV)  # the default
    with CustomOp.force("cuda"):
        assert warm_up_norm_gemv(model) == (8 if NORM_GEMV_DEFAULT == "1" else 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="forces the kernels onto CPU tensors")
@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])  # qwen2: the qkv bias in the kernel
def test_two_sequence_decode_with_the_fused_kernel_matches_hf(arch, tmp_path, monkeypatch):
    """A decode step of two tokens, the norms fused into qkv and gate/up, against HF."""
    from minivllm.model_executor.layers import triton_norm_gemv

    monkeypatch.setenv(NORM_GEMV_ENV, "1")
    path = make_tiny_model(arch, tmp_path)
    model, hf_model = _load(path), load_hf_model(path)
    runner = PagedForward(model, num_seqs=2)
    with CustomOp.force("cuda"):
        runner.step(PROMPTS[:2])
        calls = []
        real = triton_norm_gemv.rms_norm_gemv
        monkeypatch.setattr(
            triton_norm_gemv, "rms_norm_gemv", lambda *a: calls.append(a[5] is not None) or real(*a)
        )
        decode = runner.step([[t] for t in NEXT_TOKENS[:2]])
    # Two per layer (qkv, gate/up), and Qwen2's qkv bias went into the kernel.
    assert len(calls) == 2 * model.config.num_hidden_layers
    assert any(calls) == (arch == "qwen2")
    expected = torch.stack(
        [_hf_logits(hf_model, p + [t])[-1] for p, t in zip(PROMPTS, NEXT_TOKENS[:2])]
    )
    torch.testing.assert_close(decode, expected, atol=1e-4, rtol=1e-4)
