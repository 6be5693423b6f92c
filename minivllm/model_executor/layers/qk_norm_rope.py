"""Per-head RMSNorm of q and k followed by the rotary embedding: Qwen3's QK-norm as one op.

Upstream counterpart: no layer. Upstream's model (``vllm/model_executor/models/qwen3.py``,
``Qwen3Attention.forward``) calls ``q_norm``, ``k_norm`` and ``rotary_emb`` one after the
other, and a compiler pass (``QKNormRoPEFusionPass`` in
``vllm/compilation/passes/fusion/qk_norm_rope_fusion.py``) finds that sequence in the
traced graph and replaces it with the fused ``fused_qk_norm_rope`` op
(``vllm/_custom_ops.py``). minivllm has no compiler passes, so the model calls this fused
layer directly, and the layer's ``forward_native`` is the sequence the pass matches.

Why fuse: at batch 1 a Qwen3 decoder layer is bound by its kernel count. Unfused, these
steps are three launches (q norm, k norm, rotary) per layer, 84 per step of a 28-layer
model, each moving a few kilobytes; fused they are one (``triton_qk_norm_rope.py``).

``MINIVLLM_FUSED_QK_NORM_ROPE=0`` keeps the three kernels of the unfused path (for a
side-by-side measurement); it is read when the layer binds, at its first call.

The fused kernel can also write the step's k and v into the paged KV cache, which saves
the attention layer's own cache-write launch: given the attention layer's
``fusable_kv_cache_update`` (and v), ``forward_cuda`` does so and returns it as the
third result, which the model hands to attention as ``kv_cache_updated``. The other
implementations write nothing and return None there, so attention writes the cache as
before: whichever implementation is bound, the cache is written exactly once. Upstream
gets this from a second compiler pass (``RopeKVCacheFusionPass`` in
``vllm/compilation/passes/fusion/rope_kvcache_fusion.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from minivllm.attention.layer import KVCacheUpdate
from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.layernorm import rms_norm_native
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding

#: Environment switch: ``0`` runs the q norm, k norm and rotary kernels separately.
FUSED_QK_NORM_ROPE_ENV = "MINIVLLM_FUSED_QK_NORM_ROPE"


def fused_qk_norm_rope_enabled() -> bool:
    """Whether the CUDA path uses the fused kernel (the default) rather than three."""
    return os.environ.get(FUSED_QK_NORM_ROPE_ENV, "1") not in ("0", "false", "False")


class QKNormRotaryEmbedding(CustomOp):
    """``rope(rms_norm(q per head), rms_norm(k per head))`` over flat q and k.

    The norm weights are passed at each call rather than owned, so that they stay the
    ``q_norm.weight`` and ``k_norm.weight`` parameters of the attention layer, under the
    checkpoint's names. Every implementation returns ``(query, key, kv_cache_updated)``:
    the last is ``kv_cache`` when the call wrote ``key`` and ``value`` into that cache,
    else None (only ``forward_cuda`` writes it).

    Args:
        head_size: ``D``: each head is normalised over, and rotated as, ``D`` values.
        eps: The RMSNorm epsilon.
        rotary_emb: The model's (shared) rotary embedding, whose cos/sin cache is used.
    """

    def __init__(self, head_size: int, eps: float, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        if rotary_emb.head_size != head_size:
            raise ValueError(
                f"rotary_emb rotates heads of {rotary_emb.head_size}, not head_size {head_size}"
            )
        self.head_size = head_size
        self.variance_epsilon = eps
        self.rotary_emb = rotary_emb

    def forward_native(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        value: torch.Tensor | None = None,
        kv_cache: KVCacheUpdate | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Normalise each head of ``query`` ``[T, H * D]`` and ``key`` ``[T, KVH * D]``, then
        rotate them by ``positions`` ``[T]``. Returns new tensors, and None: the cache is
        left to attention (``value`` and ``kv_cache`` are not used)."""
        num_tokens = query.shape[0]
        eps = self.variance_epsilon
        q = rms_norm_native(query.reshape(num_tokens, -1, self.head_size), q_weight, eps)
        k = rms_norm_native(key.reshape(num_tokens, -1, self.head_size), k_weight, eps)
        q, k = self.rotary_emb.forward_native(
            positions, q.view(num_tokens, -1), k.view(num_tokens, -1)
        )
        return q, k, None

    def forward_cuda(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        value: torch.Tensor | None = None,
        kv_cache: KVCacheUpdate | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KVCacheUpdate | None]:
        """``forward_native`` as one Triton launch, in place: returns ``query`` and ``key``
        themselves, normalised and rotated (column slices of this step's qkv output, read
        by nothing else). Given ``kv_cache`` and ``value`` ``[T, KVH * D]``, the same
        launch writes k and v into the cache (at every token count: see the Custom ops
        chapter) and ``kv_cache`` is returned third."""
        if not self._kernel_dtypes_match(query, key, q_weight, k_weight):
            return self.forward_native(positions, query, key, q_weight, k_weight)
        from minivllm.model_executor.layers import triton_qk_norm_rope  # Triton is optional

        args = (positions, query, key, q_weight, k_weight, self.rotary_emb.cos_sin_cache,
                self.head_size, self.variance_epsilon)  # fmt: skip
        if kv_cache is None:
            return (*triton_qk_norm_rope.qk_norm_rope(*args), None)
        if value is None:
            raise ValueError("writing the KV cache needs value")
        query, key = triton_qk_norm_rope.qk_norm_rope_kv_cache(*args, value, *kv_cache)
        return query, key, kv_cache

    def forward_unfused(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        value: torch.Tensor | None = None,
        kv_cache: KVCacheUpdate | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The three kernels the fused one replaces: RMSNorm over the q heads, over the k
        heads (each into a new tensor), then the rotary kernel in place on both. The cache
        is left to attention, as in the model before any fusion."""
        if not self._kernel_dtypes_match(query, key, q_weight, k_weight):
            return self.forward_native(positions, query, key, q_weight, k_weight)
        from minivllm.model_executor.layers import triton_layernorm  # Triton is optional

        num_tokens, eps = query.shape[0], self.variance_epsilon
        q = triton_layernorm.rms_norm(query.view(num_tokens, -1, self.head_size), q_weight, eps)
        k = triton_layernorm.rms_norm(key.view(num_tokens, -1, self.head_size), k_weight, eps)
        q, k = self.rotary_emb.forward_cuda(
            positions, q.view(num_tokens, -1), k.view(num_tokens, -1)
        )
        return q, k, None

    def dispatch_forward(self, device: torch.device) -> Callable[..., Any]:
        """``forward_cuda``, or ``forward_unfused`` under ``MINIVLLM_FUSED_QK_NORM_ROPE=0``."""
        impl = super().dispatch_forward(device)
        if impl == self.forward_cuda and not fused_qk_norm_rope_enabled():
            return self.forward_unfused
        return impl

    @staticmethod
    def _kernel_dtypes_match(*tensors: torch.Tensor) -> bool:
        # Mixed dtypes promote in torch; the kernels write q's dtype, so leave them to it.
        return all(t.dtype == tensors[0].dtype for t in tensors)

    def extra_repr(self) -> str:
        """Shown by ``print(model)``."""
        return f"head_size={self.head_size}, eps={self.variance_epsilon}"
