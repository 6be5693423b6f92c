"""Qwen3: the Llama structure with RMSNorm on each query and key head before RoPE.

Upstream counterpart: ``vllm/model_executor/models/qwen3.py`` (``Qwen3Attention``,
``Qwen3ForCausalLM``). Normalising q and k per head ("QK-norm") bounds the attention
logits, which stabilises training; at inference it is two extra RMSNorms whose weight
has ``head_dim`` entries, shared by all heads.
"""

from __future__ import annotations

from typing import Any

import torch

from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """Llama attention plus per-head ``q_norm`` and ``k_norm``.

    Args:
        config: The Hugging Face config.
        prefix: Dotted module name.
    """

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__(config, prefix=prefix)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise every head of q ``[T, H * D]`` and k ``[T, KVH * D]`` over its D values."""
        num_tokens = q.shape[0]
        q = self.q_norm(q.reshape(num_tokens, -1, self.head_dim)).view(num_tokens, -1)
        k = self.k_norm(k.reshape(num_tokens, -1, self.head_dim)).view(num_tokens, -1)
        return q, k


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 (dense) causal LM."""

    attention_cls = Qwen3Attention
