"""SiLU-and-mul (SwiGLU's gate) as one Triton kernel.

Upstream counterpart: ``csrc/libtorch_stable/activation_kernels.cu`` (``silu_and_mul``),
called from ``SiluAndMul.forward_cuda`` in ``vllm/model_executor/layers/activation.py``.
Same contract: ``out[..., :d] = silu(x[..., :d]) * x[..., d:]`` for ``x`` ``[T, 2d]``.

Torch runs this as two kernels (``chunk`` is a view; silu, then multiply) and stores
``silu(gate)`` in between; fused, each input element is read once and each output
written once. Rounding follows ``SiluAndMul.forward_native``: silu is computed in
float32 and rounded to the model dtype, then the product is rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.model_executor.layers.utils import pdl_enabled
from minivllm.utils.math_utils import cdiv, next_power_of_2
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit
def silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    x_stride,
    out_stride,
    d,
    BLOCK: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    """Program ``(token, block)``: ``BLOCK`` outputs of one token's row."""
    if LAUNCH_DEPENDENTS:
        # down_proj's GEMV (under programmatic dependent launch) may start now: it only
        # prefetches its weights until this kernel has finished.
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    row = x_ptr + token * x_stride
    gate = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + d + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * out_stride + cols, (silu * up).to(dtype), mask=mask)


def _silu_and_mul_impl(out: torch.Tensor, x: torch.Tensor) -> None:
    num_tokens, d = out.shape
    if num_tokens == 0 or d == 0:
        return
    block = min(next_power_of_2(d), 1024)
    silu_and_mul_kernel[(num_tokens, cdiv(d, block))](
        out, x, x.stride(0), out.stride(0), d, BLOCK=block,
        LAUNCH_DEPENDENTS=pdl_enabled(x.device), num_warps=4,
    )  # fmt: skip


direct_register_custom_op(
    "silu_and_mul", "(Tensor(a!) out, Tensor x) -> ()", _silu_and_mul_impl, fake_noop
)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2d] -> [..., d]``: ``silu(x[..., :d]) * x[..., d:]`` as a new tensor."""
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even (gate | up), got {tuple(x.shape)}")
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    d = x.shape[-1] // 2
    out = torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
    torch.ops.minivllm.silu_and_mul(out, rows)
    return out.view(*x.shape[:-1], d)
