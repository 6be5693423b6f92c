"""RMSNorm as one Triton kernel, with and without the fused residual add.

Upstream counterparts: ``csrc/libtorch_stable/layernorm_kernels.cu`` (``rms_norm``,
``fused_add_rms_norm``), reached through ``vllm/kernels/vllm_c.py``. Same contract:
``rms_norm`` writes a fresh output; ``fused_add_rms_norm`` updates ``residual`` in place
with ``x + residual`` and writes the normalised sum.

Numerics follow ``RMSNorm.forward_native`` (and so Hugging Face) step by step: the
residual sum is rounded to the model dtype before it is normalised, the statistics are
float32, ``x * rstd`` is rounded to the model dtype and only then multiplied by the
weight (and rounded again). Only the order of the float32 sum differs from torch.

One program normalises one row: the whole row fits in registers (hidden sizes up to
a few thousand), so it is read once and written once. A row is addressed through two
strides, so the per-head q/k norm of Qwen3 can run on ``[T, H, D]`` views of the fused
qkv output without a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.model_executor.layers.utils import pdl_enabled
from minivllm.utils.math_utils import next_power_of_2
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit
def rms_norm_kernel(
    out_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    n_inner,
    x_stride_outer,
    x_stride_inner,
    r_stride_row,
    out_stride_row,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    """One row: ``out = w * (s / sqrt(mean(s^2) + eps))`` with ``s = x (+ residual)``."""
    if LAUNCH_DEPENDENTS:
        # The next kernel (a linear layer's GEMV, under programmatic dependent launch) may
        # start now: it only prefetches its weights until this kernel has finished.
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)  # int64: rows * stride can exceed 2^31
    x_row = x_ptr + (row // n_inner) * x_stride_outer + (row % n_inner) * x_stride_inner
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size  # hidden sizes need not be powers of two
    x = tl.load(x_row + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r_row = residual_ptr + row * r_stride_row
        # Round the sum to the model dtype first: it is the residual stream, and
        # forward_native normalises the rounded value.
        x = (x.to(tl.float32) + tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(residual_ptr.dtype.element_ty)
        tl.store(r_row + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / hidden_size  # masked lanes hold 0
    normed = (x32 * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    # The weight multiply happens in the weight's dtype, as torch's `weight * normed`
    # does when both are the model dtype.
    y = weight.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * out_stride_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(out, x, residual, weight, epsilon) -> None:
    """Normalise every row of ``x`` (last dim contiguous) into contiguous ``out``."""
    hidden_size = x.shape[-1]
    if x.dim() == 3:  # [T, H, D] view (per-head norm): address rows with two strides
        n_inner, stride_outer, stride_inner = x.shape[1], x.stride(0), x.stride(1)
    else:
        n_inner, stride_outer, stride_inner = 1, x.stride(0), 0
    num_rows = x.numel() // hidden_size
    if num_rows == 0:
        return
    block = next_power_of_2(hidden_size)
    # Enough threads that each holds a handful of elements of the row.
    num_warps = min(max(block // 256, 1), 8)
    rms_norm_kernel[(num_rows,)](
        out,
        x,
        residual if residual is not None else x,
        weight,
        n_inner,
        stride_outer,
        stride_inner,
        residual.stride(0) if residual is not None else 0,
        out.stride(-2),
        hidden_size,
        epsilon,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        LAUNCH_DEPENDENTS=pdl_enabled(x.device),
        num_warps=num_warps,
    )


def _rms_norm_impl(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   epsilon: float) -> None:
    _launch(out, x, None, weight, epsilon)


def _fused_add_rms_norm_impl(out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor,
                             weight: torch.Tensor, epsilon: float) -> None:
    _launch(out, x, residual, weight, epsilon)


direct_register_custom_op(
    "rms_norm",
    "(Tensor(a!) out, Tensor x, Tensor weight, float epsilon) -> ()",
    _rms_norm_impl,
    fake_noop,
)
direct_register_custom_op(
    "fused_add_rms_norm",
    "(Tensor(a!) out, Tensor x, Tensor(b!) residual, Tensor weight, float epsilon) -> ()",
    _fused_add_rms_norm_impl,
    fake_noop,
)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as 2-D rows, or a 3-D ``[T, H, D]`` view, with a contiguous last dim."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 3:
        return x  # the kernel walks the two leading dims itself, copying nothing
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"x's last dimension must match weight {tuple(weight.shape)}, "
                         f"got x of shape {tuple(x.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x on {x.device} but weight on {weight.device}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim, as a new tensor.

    ``x`` may be any shape whose last dimension is contiguous (3-D strided views are
    read in place; other layouts are copied by ``reshape`` first).
    """
    _check(x, weight)
    rows = _as_rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    torch.ops.minivllm.rms_norm(out, rows, weight, float(epsilon))
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """``residual += x`` in place (rounded to its dtype), then return ``rms_norm(residual)``.

    ``x`` and ``residual`` are ``[num_tokens, hidden]`` with contiguous rows.
    """
    _check(x, weight)
    if (residual.shape != x.shape or residual.dtype != x.dtype or x.dim() != 2
            or residual.stride(-1) != 1 or x.stride(-1) != 1):
        raise ValueError(
            "x and residual must be [num_tokens, hidden] of one dtype with contiguous "
            f"rows, got {tuple(x.shape)}/{x.dtype} and {tuple(residual.shape)}/"
            f"{residual.dtype}"
        )
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.minivllm.fused_add_rms_norm(out, x, residual, weight, float(epsilon))
    return out
