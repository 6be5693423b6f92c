"""SwiGLU's gating: ``silu(gate) * up`` over a fused ``[gate | up]`` tensor.

Upstream counterpart: ``vllm/model_executor/layers/activation.py`` (``SiluAndMul``).
The MLP computes gate and up in one fused GEMM (``MergedColumnParallelLinear``), so the
activation receives them concatenated on the last dimension. Under tensor parallelism
each rank's fused output holds *its* slice of gate followed by *its* slice of up, so
this elementwise op needs no communication.

``SiluAndMul`` is a :class:`~minivllm.model_executor.custom_op.CustomOp`: on CUDA,
``forward_cuda`` does it in one Triton kernel (``triton_activation.py``) that reads each
input once, where torch runs two kernels and stores ``silu(gate)`` in between.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model_executor.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """``[..., 2d] -> [..., d]``: ``silu(x[..., :d]) * x[..., d:]``."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated activation (torch: silu, then the product)."""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        """``forward_native`` as one Triton kernel."""
        from minivllm.model_executor.layers import triton_activation  # Triton is optional

        return triton_activation.silu_and_mul(x)
