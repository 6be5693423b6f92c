"""The ``Attention`` layer every decoder layer calls with its projected q, k, v.

Upstream counterpart: ``vllm/model_executor/layers/attention/attention.py``
(``Attention``). The layer owns no weights. It owns a view of this layer's slice of the
KV cache (bound by the model runner once the cache is allocated) and reads the batch
layout from the forward context. Each call does the two things paged attention is made
of: write this step's K/V into the cache, then attend over the cache.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.selector import AttentionBackend
from minivllm.forward_context import get_forward_context


class Attention(nn.Module):
    """Paged multi-head / grouped-query attention over the KV cache.

    Args:
        num_heads: Query heads on this rank.
        head_size: Size of each head.
        scale: Softmax scale.
        num_kv_heads: Key/value heads on this rank (defaults to ``num_heads``).
        prefix: Dotted module name, used to find this layer's cache.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{prefix}: num_heads={num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        self.prefix = prefix
        # Bound by the model runner (see ModelRunner.bind_kv_cache).
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.backend: AttentionBackend | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attend.

        Args:
            q: ``[num_tokens, num_heads * head_size]``.
            k: ``[num_tokens, num_kv_heads * head_size]``.
            v: ``[num_tokens, num_kv_heads * head_size]``.

        Returns:
            ``[num_tokens, num_heads * head_size]``.
        """
        num_tokens = q.shape[0]
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:
            # Memory-profiling run: there is no cache yet. Upstream backends also
            # return early here; the projections around attention dominate the
            # activation memory being measured.
            return torch.zeros_like(q)
        if self.kv_cache is None or self.backend is None:
            raise RuntimeError(f"{self.prefix}: KV cache not bound; call bind_kv_cache first")
        q = q.view(num_tokens, self.num_heads, self.head_size)
        k = k.view(num_tokens, self.num_kv_heads, self.head_size)
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        key_cache, value_cache = self.kv_cache
        self.backend.reshape_and_cache(k, v, key_cache, value_cache, attn_metadata.slot_mapping)
        out = self.backend.paged_attention(
            q,
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            attn_metadata.query_start_loc,
            self.scale,
            max_query_len=attn_metadata.max_query_len,
            max_seq_len=attn_metadata.max_seq_len,
            key=k,
            value=v,
        )
        return out.view(num_tokens, self.num_heads * self.head_size)
