"""SwiGLU's first half in one kernel: ``silu(x @ W_gate^T) * (x @ W_up^T)``.

Upstream counterpart: none for bf16. Upstream's MLP runs ``gate_up_proj`` (cuBLAS) and
then ``SiluAndMul`` (``vllm/model_executor/layers/activation.py``), two launches, and
fuses the activation only into a following quantisation (``ActivationQuantFusionPass``
in ``vllm/compilation/passes/fusion/``). This is CUTLASS's epilogue fusion, written in
Triton for the decode batches of a small model.

Why it pays at decode. A decode step of Qwen3-0.6B runs some 270 kernels, and at these
sizes each costs a few microseconds whatever it moves, plus a gap before the next one
starts (the Benchmarks chapter's tenth to thirteenth rounds). The activation kernel
moves little; removing its launch is the saving. Applying the activation in the GEMM's
*epilogue* (as it stores) costs once per output element, unlike the small-M kernel's
prologue (``triton_gemv_prologue.py``), which recomputes ``silu(gate) * up`` for every
output tile of ``down_proj`` and loses from three rows up.

Tiling. ``W`` is ``gate_up_proj``'s ``[2 D, K]`` weight: the gate rows, then the up rows
(under tensor parallelism: this rank's slice of each). Program ``p`` owns output columns
``n * BLOCK_N ...`` of rows ``m * BLOCK_M ...`` and keeps two float32 accumulators, one
for the gate's columns ``n * BLOCK_N ...`` of ``W`` and one for the up's, ``D`` rows
further; both see the same tile of ``x``. The row blocks of one column tile are adjacent
program ids (``m`` varies fastest), so they run together and read that weight tile from
memory once, the repeats from L2.

Rounding follows the two kernels it replaces: each accumulator is rounded to the model
dtype (what ``gate_up_proj`` would have stored), then ``silu_and_mul_kernel``'s roundings.
Only the order of the float32 sums over ``K`` differs from cuBLAS.

This file is the kernel and its launch; which batches take it and with which tiles are
measured choices, in ``utils.py`` (``gate_up_silu_config``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.model_executor.layers.utils import INTERPRETED as _INTERPRETED
from minivllm.model_executor.layers.utils import GemvConfig, gate_up_silu_config
from minivllm.utils.math_utils import cdiv
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit(do_not_specialize=["M"])
def gate_up_silu_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    D,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``p``: row block ``p % cdiv(M, BLOCK_M)``, column tile ``p // cdiv(M, BLOCK_M)``
    of ``out [M, D]``. ``M`` is not specialised on: one variant serves every batch."""
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(M, BLOCK_M)
    rows = (pid % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid // row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < D
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    gate_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = w_ptr + (cols + D).to(tl.int64)[:, None] * stride_wn  # D rows further down
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w_gate = tl.load(gate_rows + ks[None, :], mask=w_mask, other=0.0)
        w_up = tl.load(up_rows + ks[None, :], mask=w_mask, other=0.0)
        if INTERPRETED:
            # The interpreter multiplies bf16 operands as their raw 16-bit integers;
            # widening first is exact (the tensor cores multiply bf16 exactly too).
            x = x.to(tl.float32)
            w_gate = w_gate.to(tl.float32)
            w_up = w_up.to(tl.float32)
        acc_gate = tl.dot(x, tl.trans(w_gate), acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=DOT_PRECISION)
    dtype = out_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(ptrs, (silu * up).to(dtype), mask=row_ok[:, None] & col_ok[None, :])


def launch_gate_up_silu(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, config: GemvConfig
) -> None:
    """Launch the kernel with ``config`` (``block_m``, ``block_n``, ``block_k``, warps,
    stages; ``split_k`` must be 1): ``out[M, D] = silu(x W_gate^T) * (x W_up^T)`` for
    ``x [M, K]`` and ``weight [2 D, K]``, each with unit stride along its last dimension.

    ``GemvConfig`` is the small-M kernel's configuration, reused for its tile fields; its
    ``use_dot``, ``prefetch`` and ``pdl`` do not apply here (this kernel always multiplies
    with ``tl.dot`` and launches plainly)."""
    if config.split_k != 1 or not config.block_m:
        raise ValueError(f"the fused gate/up kernel needs split_k=1 and block_m set: {config}")
    m, d = out.shape
    k = weight.shape[1]
    grid = (cdiv(m, config.block_m) * cdiv(d, config.block_n),)
    gate_up_silu_kernel[grid](
        x, weight, out, m, d, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        INTERPRETED=_INTERPRETED,
        # float32 weights: exact products as F.linear computes them, not TF32's 10 bits.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip


def _gate_up_silu_impl(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    m, d = out.shape
    if m == 0 or d == 0:
        return
    launch_gate_up_silu(out, x, weight, gate_up_silu_config(m, d, weight.shape[1]))


direct_register_custom_op(
    "gate_up_silu",
    "(Tensor(a!) out, Tensor x, Tensor weight) -> ()",
    _gate_up_silu_impl,
    fake_noop,
)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu_and_mul(F.linear(x, weight))`` as one Triton kernel.

    Args:
        x: ``[..., K]`` activations.
        weight: ``gate_up_proj``'s ``[2 D, K]`` weight (gate rows, then up rows), unit
            stride along ``K``.

    Returns:
        ``[..., D]``.
    """
    if weight.dim() != 2 or weight.shape[0] % 2 or weight.stride(1) != 1:
        raise ValueError(
            f"weight must be [2 D, K] with unit stride along K, got {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x's last dimension is {x.shape[-1]}, weight expects {weight.shape[1]}")
    rows = x.reshape(-1, weight.shape[1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    d = weight.shape[0] // 2
    out = torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
    torch.ops.minivllm.gate_up_silu(out, rows, weight)
    return out.view(*x.shape[:-1], d)
