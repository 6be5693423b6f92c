"""What the small-M GEMM does to ``x`` as it loads it, so that the layer before needs no
kernel of its own: SwiGLU's SiLU-and-mul, or RMSNorm with the residual add.

Upstream counterpart: none on NVIDIA GPUs (cuBLAS cannot transform its input). The idea
is CUTLASS's prologue fusion; upstream's ``RMSNormQuantFusionPass``
(``vllm/compilation/passes/fusion/rms_quant_fusion.py``) folds a norm into the step after
it, a quantisation, the same way. Each helper rounds exactly where the standalone kernel
it replaces rounds (``silu_and_mul_kernel``, ``rms_norm_kernel``), so fusing changes
launches, not results (up to the order of a float32 sum).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_and_mul_tile(x_rows, ks, K, mask, dtype: tl.constexpr):
    """Columns ``ks`` of ``silu(gate) * up`` for rows ``[gate | up]`` of width ``2 K``,
    rounded exactly as ``silu_and_mul_kernel`` rounds them (silu in float32, rounded to
    the model dtype, then the product rounded again)."""
    gate = tl.load(x_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_rows + K + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def rms_norm_tile(
    x_rows,
    r_rows,
    r_out_rows,
    norm_w_ptr,
    ks,
    K,
    mask,
    eps,
    write_residual,
    HAS_RESIDUAL: tl.constexpr,
    dtype: tl.constexpr,
):
    """``norm(x + residual)`` for a tile that holds *whole* rows (``ks`` covers ``K``).

    With ``HAS_RESIDUAL`` the sum is rounded to the model dtype (it is the new residual
    stream) and, where ``write_residual`` (one program of the grid), stored at
    ``r_out_rows``: out of place, because every other program still reads the old
    stream. Then ``rms_norm_kernel``'s roundings: float32 statistics, ``s * rstd`` rounded,
    the weight product rounded.
    """
    s = tl.load(x_rows + ks[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_rows + ks[None, :], mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(dtype)
        if write_residual:
            tl.store(r_out_rows + ks[None, :], s, mask=mask)
    s32 = s.to(tl.float32)
    variance = tl.sum(s32 * s32, axis=1) / K  # masked lanes hold 0
    normed = (s32 * tl.rsqrt(variance + eps)[:, None]).to(dtype)
    weight = tl.load(norm_w_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
    return (weight[None, :] * normed.to(tl.float32)).to(dtype)
