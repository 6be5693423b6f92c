"""``y = x @ W^T`` for a handful of rows of ``x`` (a decode step): a Triton GEMV.

Upstream counterpart: the ROCm "skinny GEMMs" of ``csrc/rocm/skinny_gemms.cu``
(``wvSplitK``, ``LLMM1``), chosen for small batches by ``rocm_unquantized_gemm_impl`` in
``vllm/model_executor/layers/utils.py``. On NVIDIA GPUs upstream leaves these shapes to
cuBLAS; minivllm has its own kernel because on the 0.6B model's reducing layers
(o_proj, down_proj) cuBLAS reaches a sixth to a third of the bandwidth it reaches on the
others at M = 1 (see the "Layers as custom ops" chapter).

Why a separate kernel: at M = 1 a linear layer does 2 FLOPs per weight element it reads,
so its time is the time to stream ``W`` (``N x K`` bf16) from memory once. Nothing is
reused, so the tiling of a GEMM (square tiles of ``x`` and ``W`` staged in shared memory)
buys nothing; what matters is keeping enough loads in flight on every SM.

Tiling. ``W`` is ``[N, K]`` row-major as ``nn.Linear`` stores it, so one output feature is
one contiguous row of ``W``. Program ``(n, s)`` owns the ``BLOCK_N`` output features
``n * BLOCK_N ...`` and walks its share ``s`` of ``K`` in ``BLOCK_K`` steps: it loads a
``[BLOCK_N, BLOCK_K]`` tile of ``W`` (each row a contiguous, coalesced run) and the
matching ``[BLOCK_M, BLOCK_K]`` slice of ``x`` (all ``M`` rows at once: ``x`` is tiny and
stays in cache), and accumulates ``x_tile @ w_tile^T`` in float32, either with
``tl.dot`` (tensor cores; ``BLOCK_M`` padded to 16) or with broadcast multiply-and-sum
(CUDA cores; ``BLOCK_M`` = the next power of two of ``M``). Each element of ``W`` is read
by exactly one program per block of rows: more rows than one program holds are split
into row blocks (``GemvConfig.block_m``, the grid's third axis), which read the same
weight tile, the repeats from L2.

Split-K. A narrow layer (``o_proj`` 2048 -> 1024, ``down_proj`` 3072 -> 1024) has few
output tiles: 1024 / 16 = 64 programs cannot keep 132 SMs busy. With ``SPLIT_K > 1``
each output tile is shared by ``SPLIT_K`` programs, each summing a slice of ``K``. They
write float32 partial sums to a workspace and count their arrival on a per-tile counter;
the *last* to arrive adds the partials in a fixed order (so the result does not depend
on which program finished first), writes the output and resets the counter for the next
launch. One kernel, no second reduction launch, no zero-fill: this is "serial split-K"
(CUTLASS's semaphore variant), also what ``wvSplitKrc`` does on ROCm.

Fused SiLU-and-mul (``GATED``). For down_proj, ``x`` may be the ``[gate | up]`` output of
gate_up_proj: the kernel then loads both halves and multiplies by ``silu(gate) * up``,
which saves the activation's own kernel. Fused RMSNorm (``NORM``): for a tile that holds
whole rows, the kernel adds the residual and normalises ``x`` first
(``triton_norm_gemv.py``), which saves the norm's kernel. Both live in
``triton_gemv_prologue.py``.

Starting early (optional, ``MINIVLLM_GEMV_PDL=1``). Each program can ask L2 for all of
its weights first (``prefetch.global.L2``, which does not wait), and under programmatic
dependent launch the kernel starts while the previous one is finishing and waits for it
(``gdc_wait``) only before it reads ``x``.

CUDA graphs: the grid depends only on the shapes and the workspace is allocated once per
device, on the first (eager, warm-up) call; a call under capture that finds no workspace
falls back to ``SPLIT_K = 1``. The workspace assumes one stream per device runs these
kernels (two concurrent launches would share the counters).

This file is the kernel and its launch. Which layers take it, with which tiles
(``GemvConfig``, ``default_config``) and whether it launches early (``pdl_enabled``) are
measured choices, decided in ``utils.py`` as upstream decides its skinny GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minivllm.model_executor.layers.triton_gemv_prologue import rms_norm_tile, silu_and_mul_tile
from minivllm.model_executor.layers.utils import INTERPRETED as _INTERPRETED
from minivllm.model_executor.layers.utils import GemvConfig, default_config, pdl_enabled
from minivllm.utils.math_utils import cdiv
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit
def _store_output(
    out_ptr, acc, bias_ptr, rows, cols, row_ok, col_ok, stride_om, HAS_BIAS: tl.constexpr
):
    """Add the bias in float32 and write the tile in the output's dtype."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _prefetch_weights(w_ptr, cols, stride_wn, N, K, k_start, k_per_split):
    """Ask L2 for every 128-byte line of this program's share of ``W``, without waiting.

    ``prefetch.global.L2`` is fire-and-forget: no register waits for the data, so a few
    instructions put the whole share in flight at once, and the main loop then finds it
    in L2. Addresses are clamped into the matrix (a line requested twice costs nothing).
    """
    LINE: tl.constexpr = 64  # bf16 elements per 128-byte line
    rows = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, k_per_split, 16 * LINE):
        ks = tl.minimum(k_start + k0 + tl.arange(0, 16) * LINE, K - 1)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
            "=r,l",
            [rows + ks[None, :]],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit(do_not_specialize=["M"])
def skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    partial_ptr,
    counter_ptr,
    residual_ptr,
    residual_out_ptr,
    norm_w_ptr,
    eps,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr = False,
    HAS_RESIDUAL: tl.constexpr = False,
):
    """Program ``(n, s)``: output columns ``n * BLOCK_N ...`` from K-slice ``s``.

    ``k_per_split`` is a multiple of ``BLOCK_K``; the last slice may run past ``K`` and is
    masked. ``M`` is not specialised on (one compiled variant serves every small batch).
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    # int64 addresses: N * K exceeds 2^31 for a large vocabulary's lm_head.
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    # NORM: the residual stream in and out, [M, K] with x's row stride.
    r_rows = residual_ptr + rows.to(tl.int64)[:, None] * stride_xm
    r_out_rows = residual_out_ptr + rows.to(tl.int64)[:, None] * stride_xm
    k_start = pid_k * k_per_split
    if PREFETCH:
        _prefetch_weights(w_ptr, cols, stride_wn, N, K, k_start, k_per_split)
    if PDL:
        # Launched before the previous kernel has finished (programmatic dependent launch):
        # the weights, which no kernel writes, are already on their way; x is that
        # kernel's output, so wait for it here, before the first read of x or any write.
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        ks = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x_mask = row_ok[:, None] & k_ok[None, :]
        if GATED:
            x = silu_and_mul_tile(x_rows, ks, K, x_mask, x_ptr.dtype.element_ty)
        elif NORM:  # one step covers all of K (the launcher checks), so whole rows
            x = rms_norm_tile(x_rows, r_rows, r_out_rows, norm_w_ptr, ks, K, x_mask, eps,
                              pid_n == 0, HAS_RESIDUAL, x_ptr.dtype.element_ty)  # fmt: skip
        else:
            x = tl.load(x_rows + ks[None, :], mask=x_mask, other=0.0)
        if USE_DOT:
            if INTERPRETED:
                # The interpreter multiplies bf16 operands as their raw 16-bit integers;
                # widening first is exact (the tensor cores multiply bf16 exactly too).
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        else:
            prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=2)
    if SPLIT_K == 1:
        _store_output(out_ptr, acc, bias_ptr, rows, cols, row_ok, col_ok, stride_om, HAS_BIAS)
    else:
        # Partial sums of slice s live at partial[s, m, n] (float32, [SPLIT_K, M, N]).
        tile = rows[:, None] * N + cols[None, :]
        out_mask = row_ok[:, None] & col_ok[None, :]
        tl.store(partial_ptr + pid_k * M * N + tile, acc, mask=out_mask)
        # Every thread's partial must be written before the arrival is counted; the
        # counter's acq_rel atomic then publishes them to the program that arrives last.
        tl.debug_barrier()
        counter = counter_ptr + pid_m * tl.num_programs(0) + pid_n  # one per output tile
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # fixed order: deterministic result
                # .cg: read from L2, never from this SM's L1, which may hold stale lines.
                part_ptrs = partial_ptr + s * M * N + tile
                total += tl.load(part_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store_output(out_ptr, total, bias_ptr, rows, cols, row_ok, col_ok, stride_om, HAS_BIAS)
            tl.atomic_xchg(counter, 0)  # ready for the next launch (graph replay)


# The split-K workspace: float32 partials and one arrival counter per output tile, per
# device. Fixed sizes, so a captured graph's pointers stay valid for the process's life.
WORKSPACE_FLOATS = 1 << 22  # 16 MiB: e.g. split 4 x 256 rows x 4096 columns
NUM_COUNTERS = 4096
_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The device's split-K workspace, allocated on first use outside graph capture."""
    ws = _workspaces.get(device)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # allocating (and zeroing) here would be captured, not run now
        ws = (
            torch.empty(WORKSPACE_FLOATS, dtype=torch.float32, device=device),
            torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device),
        )
        _workspaces[device] = ws
    return ws


@dataclass(frozen=True)
class NormPrologue:
    """RMSNorm (with the residual add) applied to ``x`` as the GEMV loads it.

    Attributes:
        weight: The norm's ``[K]`` weight.
        eps: Its epsilon.
        residual: The residual stream ``[M, K]`` (None: normalise ``x`` alone).
        residual_out: Where ``x + residual`` is written (the new stream), out of place.
    """

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None


def launch_skinny_gemm(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: GemvConfig,
    gated: bool = False,
    norm: NormPrologue | None = None,
) -> None:
    """Launch the kernel with ``config``: ``out[M, N] = x[M, K] @ weight[N, K]^T (+ bias)``.

    With ``gated``, ``x`` is ``[M, 2K]`` = ``[gate | up]`` and the product is taken with
    ``silu(gate) * up``. With ``norm``, with ``rms_norm(x + residual)`` (see
    :class:`NormPrologue`; ``config`` must cover ``K`` in one step, unsplit). ``x``,
    ``weight`` and ``out`` must have unit stride along their last dimension.
    """
    m = x.shape[0]
    k = weight.shape[1]
    n = weight.shape[0]
    split = config.split_k
    tiles = cdiv(n, config.block_n)
    block_m = config.rows_per_program(m)
    row_blocks = cdiv(m, block_m)
    ws = _workspace(x.device) if split > 1 else None
    if ws is None or split * m * n > WORKSPACE_FLOATS or tiles * row_blocks > NUM_COUNTERS:
        split, ws = 1, None
    if norm is not None and (split != 1 or config.block_k < k or gated):
        raise ValueError(f"a norm prologue needs one unsplit step over K={k}, got {config}")
    residual = norm.residual if norm is not None and norm.residual is not None else None
    partial, counters = ws if ws is not None else (out, out)  # unused when split == 1
    k_per_split = cdiv(cdiv(k, split), config.block_k) * config.block_k
    skinny_gemm_kernel[(tiles, split, row_blocks)](
        x, weight, bias if bias is not None else weight, out, partial, counters,
        residual if residual is not None else x,
        norm.residual_out if residual is not None else x,
        norm.weight if norm is not None else x,
        norm.eps if norm is not None else 0.0,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0), k_per_split,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SPLIT_K=split,
        USE_DOT=config.use_dot,
        INTERPRETED=_INTERPRETED,
        # float32 weights: exact products as F.linear computes them, not TF32's 10 bits.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PREFETCH=(config.prefetch or config.pdl) and not _INTERPRETED,  # PTX, GPU only
        PDL=config.pdl and not _INTERPRETED,
        GATED=gated,
        NORM=norm is not None,
        HAS_RESIDUAL=residual is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **({"launch_pdl": True} if config.pdl and not _INTERPRETED else {}),
    )  # fmt: skip


def _skinny_gemm_impl(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gated: bool,
) -> None:
    m, (n, k) = x.shape[0], weight.shape
    if m == 0 or n == 0:
        return
    config = default_config(m, n, k, pdl=pdl_enabled(x.device))
    launch_skinny_gemm(out, x, weight, bias, config, gated)


direct_register_custom_op(
    "skinny_gemm",
    "(Tensor(a!) out, Tensor x, Tensor weight, Tensor? bias, bool gated) -> ()",
    _skinny_gemm_impl,
    fake_noop,
)


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for an ``x`` of few rows, as one Triton kernel.

    Args:
        x: ``[..., K]`` activations; with ``gated``, ``[..., 2K]`` holding ``[gate | up]``.
        weight: ``[N, K]``, unit stride along ``K`` (as ``nn.Linear`` stores it).
        bias: Optional ``[N]``.
        gated: Multiply by ``silu(gate) * up`` (SwiGLU's SiLU-and-mul, fused into the
            loads) instead of by ``x`` itself.
    """
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(f"weight must be [N, K] with unit stride along K, got {weight.shape}")
    width = weight.shape[1] * (2 if gated else 1)
    if x.shape[-1] != width:
        raise ValueError(f"x's last dimension is {x.shape[-1]}, weight expects {width}")
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    torch.ops.minivllm.skinny_gemm(out, rows, weight, bias, gated)
    return out.view(*x.shape[:-1], weight.shape[0])
