"""RMSNorm, with the residual add of the decoder block fused in.

Upstream counterpart: ``vllm/model_executor/layers/layernorm.py`` (``RMSNorm``), whose
reference math is ``vllm/ir/ops/layernorm.py`` (``rms_norm``, ``fused_add_rms_norm``).

A pre-norm decoder block does ``residual = x + sublayer(norm(x))`` twice per layer.
Passing the residual into the norm (``norm(x, residual)``) lets one call do the add and
the normalisation and hand back both the normalised activations and the new residual
stream; on a GPU this is one memory pass instead of two.

``RMSNorm`` is a :class:`~minivllm.model_executor.custom_op.CustomOp`: the torch code
below is ``forward_native``; on CUDA, ``forward_cuda`` runs the same math as one Triton
kernel (``triton_layernorm.py``) instead of about ten elementwise kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.weight_utils import default_weight_loader


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim, in torch (HF's roundings).

    The statistics and the scaling run in float32, the result is cast back to ``x``'s
    dtype, and only then multiplied by the weight.
    """
    x32 = x.float()
    variance = x32.pow(2).mean(dim=-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


class RMSNorm(CustomOp):
    """``y = w * x / sqrt(mean(x^2) + eps)``, computed in float32.

    Numerics follow Hugging Face's Llama/Qwen ``RMSNorm`` exactly: the statistics and
    the scaling run in float32, the result is cast back to the input dtype, and only then
    multiplied by the weight. Matching this order matters in bfloat16, where rounding
    before or after the weight multiply gives different bits.

    Args:
        hidden_size: Size of the normalised (last) dimension.
        eps: Added to the mean square for stability.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_native(x, self.weight, self.variance_epsilon)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise ``x``; with ``residual``, normalise ``x + residual`` instead.

        Returns:
            ``norm(x)``, or ``(norm(x + residual), x + residual)`` when a residual is
            given: the second element is the residual stream for the next sublayer.
        """
        if residual is None:
            return self._norm(x)
        # The sum is rounded to the model dtype before normalising, as HF does when it
        # adds the residual in the model dtype in the decoder layer.
        residual = x + residual
        return self._norm(residual), residual

    def forward_cuda(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``forward_native`` as one Triton kernel; ``residual`` is updated in place.

        Like upstream's ``fused_add_rms_norm``, the new residual stream is written into
        the ``residual`` tensor passed in (the caller's old stream is consumed), which
        saves allocating and writing a second tensor per norm.
        """
        if x.dtype != self.weight.dtype or (residual is not None and residual.dtype != x.dtype):
            # forward_native would promote to the wider dtype; the kernel writes x's.
            return self.forward_native(x, residual)
        from minivllm.model_executor.layers import triton_layernorm  # Triton is optional

        if residual is None:
            return triton_layernorm.rms_norm(x, self.weight, self.variance_epsilon)
        out = triton_layernorm.fused_add_rms_norm(
            x, residual, self.weight, self.variance_epsilon
        )
        return out, residual

    def extra_repr(self) -> str:
        """Shown by ``print(model)``."""
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"
