"""SwiGLU's gating: ``silu(gate) * up`` over a fused ``[gate | up]`` tensor.

Upstream counterpart: ``vllm/model_executor/layers/activation.py`` (``SiluAndMul``).
The MLP computes gate and up in one fused GEMM (``MergedColumnParallelLinear``), so the
activation receives them concatenated on the last dimension. Under tensor parallelism
each rank's fused output holds *its* slice of gate followed by *its* slice of up, so
this elementwise op needs no communication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``[..., 2d] -> [..., d]``: ``silu(x[..., :d]) * x[..., d:]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated activation."""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
