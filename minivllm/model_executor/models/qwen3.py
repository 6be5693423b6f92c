"""Qwen3: the Llama structure with RMSNorm on each query and key head before RoPE.

Upstream counterpart: ``vllm/model_executor/models/qwen3.py`` (``Qwen3Attention``,
``Qwen3ForCausalLM``). Normalising q and k per head ("QK-norm") bounds the attention
logits, which stabilises training; at inference it is two extra RMSNorms whose weight
has ``head_dim`` entries, shared by all heads. minivllm runs them together with RoPE as
one layer (``QKNormRotaryEmbedding``: one kernel on CUDA), which upstream gets from a
compiler pass that fuses the same three steps. On the Triton backend the same kernel
also writes the step's k and v into the paged KV cache (upstream: a second pass,
``rope_kvcache_fusion.py``), so attention skips its own cache-write launch.
"""

from __future__ import annotations

from typing import Any

import torch

from minivllm.attention.layer import KVCacheUpdate
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.qk_norm_rope import QKNormRotaryEmbedding
from minivllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """Llama attention plus per-head ``q_norm`` and ``k_norm``.

    ``q_norm`` and ``k_norm`` hold the checkpoint's weights; the fused layer
    ``qk_norm_rotary`` applies them and RoPE.

    Args:
        config: The Hugging Face config.
        prefix: Dotted module name.
    """

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__(config, prefix=prefix)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.qk_norm_rotary = QKNormRotaryEmbedding(
            self.head_dim, config.rms_norm_eps, self.rotary_emb
        )

    def qk_norm_rope(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, KVCacheUpdate | None]:
        """Normalise every head of q ``[T, H * D]`` and k ``[T, KVH * D]`` over its D
        values, then rotate both: one kernel on CUDA, in place on the slices of qkv,
        which also writes k and v ``[T, KVH * D]`` into the paged cache when attention
        offers it (Triton backend, a step with metadata). Returns the update done, if
        any, for ``Attention.forward``."""
        return self.qk_norm_rotary(
            positions, q, k, self.q_norm.weight, self.k_norm.weight,
            v, self.attn.fusable_kv_cache_update(),
        )  # fmt: skip


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 (dense) causal LM."""

    attention_cls = Qwen3Attention
