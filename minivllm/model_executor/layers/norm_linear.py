"""A decoder layer's RMSNorm and the linear layer after it, one kernel at batch 1 or 2.

Upstream counterpart: none for bf16 (upstream's compiler passes fuse RMSNorm into a
following quantisation, not into the GEMM). A pre-norm decoder layer runs "add the
residual, normalise, project" twice: into ``qkv_proj`` and into ``gate_up_proj``. At one
or two tokens the projection is a stream of its weight through the small-M kernel, whose
programs load whole rows of the activations anyway, so the add and the norm ride along
(``triton_norm_gemv.py``) and the layer launches two kernels fewer. Anywhere else (the
CPU, prefill, bigger batches, ``K`` over 1024, the switch off) this is the norm call
followed by the layer call, unchanged.

On by default since the H200 measurement (``docs/benchmarks/perf2/latency_norm_gemv.json``);
``MINIVLLM_NORM_GEMV=0`` turns it off. Read when a step runs, so set it before the engine
starts (CUDA graphs keep what they captured).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import ColumnParallelLinear
from minivllm.model_executor.layers.utils import gemv_max_m

#: Environment switch: ``1`` fuses the norm into the linear layer's kernel, ``0`` keeps
#: them separate.
NORM_GEMV_ENV = "MINIVLLM_NORM_GEMV"
#: The setting without the switch: on. The fusion is measured faster on the H200, and the
#: GPU test suite (Hugging Face equality with CUDA graphs, no kernel compiled after
#: start-up) passed with it on; ``MINIVLLM_NORM_GEMV=0`` turns it off.
NORM_GEMV_DEFAULT = "1"


def norm_gemv_enabled() -> bool:
    """Whether ``MINIVLLM_NORM_GEMV`` (default ``NORM_GEMV_DEFAULT``) allows the fusion."""
    return os.environ.get(NORM_GEMV_ENV, NORM_GEMV_DEFAULT) not in ("0", "false", "False")


def _fusable(
    norm: RMSNorm, linear: nn.Module, x: torch.Tensor, residual: torch.Tensor | None
) -> bool:
    from minivllm.model_executor.layers import triton_norm_gemv  # Triton is optional

    return (
        isinstance(linear, ColumnParallelLinear) and not linear.gather_output
        and 0 < x.shape[0] <= min(triton_norm_gemv.MAX_ROWS, gemv_max_m())
        and x.dim() == 2 and x.shape[1] <= triton_norm_gemv.MAX_K
        and x.is_contiguous() and (residual is None or residual.is_contiguous())
        and x.dtype == norm.weight.dtype == linear.weight.dtype
        and (residual is None or residual.dtype == x.dtype)
        and norm_gemv_enabled()
    )  # fmt: skip


def rms_norm_linear(
    norm: RMSNorm, linear: nn.Module, x: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(norm(x + residual)), x + residual)``; without ``residual``,
    ``(linear(norm(x)), x)``: what a pre-norm decoder layer does before each sublayer.

    One kernel when both layers run their CUDA implementation and ``x`` has one or two
    rows; otherwise ``norm`` then ``linear``, each as it would run alone (which may
    update ``residual`` in place, as ``RMSNorm`` does).
    """
    if CustomOp.selected_impl(x.device) == "cuda" and _fusable(norm, linear, x, residual):
        from minivllm.model_executor.layers import triton_norm_gemv  # Triton is optional

        return triton_norm_gemv.rms_norm_gemv(
            x, residual, norm.weight, norm.variance_epsilon, linear.weight, linear.bias
        )
    if residual is None:
        return linear(norm(x)), x
    hidden, residual = norm(x, residual)
    return linear(hidden), residual


def warm_up_norm_gemv(model: nn.Module) -> int:
    """Compile every variant of the fused kernel ``model`` can launch: each column-parallel
    layer's shape at one and two rows, with and without a residual. Returns the launches
    (0 when the fusion does not apply here)."""
    launches = 0
    seen: set[tuple] = set()
    for module in model.modules():
        if not isinstance(module, ColumnParallelLinear):
            continue
        weight = module.weight
        k = weight.shape[1]
        norm = RMSNorm(k).to(weight.device, weight.dtype)
        key = (tuple(weight.shape), weight.dtype, module.bias is not None, weight.device)
        if key in seen or CustomOp.selected_impl(weight.device) != "cuda":
            continue
        seen.add(key)
        for rows in (1, 2):
            x = torch.zeros(rows, k, dtype=weight.dtype, device=weight.device)
            for residual in (None, torch.zeros_like(x)):
                if _fusable(norm, module, x, residual):
                    rms_norm_linear(norm, module, x, residual)
                    launches += 1
    return launches
