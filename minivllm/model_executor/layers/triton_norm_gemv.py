"""RMSNorm (with the residual add) and the next linear layer, one small-M kernel launch.

The small-M GEMM of ``triton_skinny_gemm.py`` with its RMSNorm prologue
(``triton_gemv_prologue.rms_norm_tile``): at one or two rows, every program loads whole
rows of ``x`` anyway (one step of ``K`` values, four output features per program), so it
can add the residual, compute the row's statistics and normalise before multiplying. The
statistics are recomputed by every program (a 1024-value sum, from L2), which costs far
less than the launch it saves: the decoder layer's separate ``fused_add_rms_norm``.

Upstream counterpart: none for bf16 weights (upstream fuses RMSNorm into the next
*quantisation*, through ``RMSNormQuantFusionPass`` in
``vllm/compilation/passes/fusion/rms_quant_fusion.py``).
"""

from __future__ import annotations

import torch

from minivllm.model_executor.layers.triton_skinny_gemm import NormPrologue, launch_skinny_gemm
from minivllm.model_executor.layers.utils import GemvConfig
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop

#: The most rows the fused kernel takes: its tile holds ``rows x K`` activations.
MAX_ROWS = 2
#: The widest ``K`` it takes: one step must cover a whole row.
MAX_K = 1024


#: Four output features per program, a whole row (up to ``MAX_K``, masked) per step, on
#: the CUDA cores: the H200 sweep's best tiling for qkv at M = 1
#: (``docs/benchmarks/perf2/gemv_sweep.json``). One block width for every ``K``, so a
#: draft model of another width needs no variant of its own.
NORM_GEMV_CONFIG = GemvConfig(block_n=4, block_k=MAX_K, num_warps=4, num_stages=2,
                              use_dot=False)  # fmt: skip


def _impl(out, residual_out, x, residual, norm_weight, eps, weight, bias) -> None:
    if x.shape[0] == 0:
        return
    norm = NormPrologue(norm_weight, eps, residual, residual_out)
    launch_skinny_gemm(out, x, weight, bias, NORM_GEMV_CONFIG, norm=norm)


direct_register_custom_op(
    "rms_norm_gemv",
    "(Tensor(a!) out, Tensor(b!) residual_out, Tensor x, Tensor? residual, Tensor norm_weight, "
    "float eps, Tensor weight, Tensor? bias) -> ()",
    _impl,
    fake_noop,
)


def rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F.linear(rms_norm(x + residual), weight, bias), x + residual)`` in one launch.

    ``x`` and ``residual`` are ``[M, K]`` contiguous with ``M <= MAX_ROWS`` and
    ``K <= MAX_K``; without ``residual`` the second result is ``x`` itself.
    """
    m, k = x.shape
    if (
        m > MAX_ROWS
        or k > MAX_K
        or not x.is_contiguous()
        or weight.shape[1] != k
        or (norm_weight.shape != (k,) or weight.stride(1) != 1)
    ):
        raise ValueError(
            f"rms_norm_gemv takes contiguous x of at most {MAX_ROWS} x {MAX_K} matching the "
            f"norm {tuple(norm_weight.shape)} and weight {tuple(weight.shape)}, got "
            f"{tuple(x.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(
            f"residual must be contiguous {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    out = torch.empty((m, weight.shape[0]), dtype=x.dtype, device=x.device)
    # Without a residual nothing is written there (an empty placeholder, no alias of x).
    residual_out = torch.empty_like(x) if residual is not None else x.new_empty(0)
    torch.ops.minivllm.rms_norm_gemv(out, residual_out, x, residual, norm_weight, float(eps),
                                     weight, bias)  # fmt: skip
    return out, residual_out if residual is not None else x
