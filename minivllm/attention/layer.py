"""The ``Attention`` layer every decoder layer calls with its projected q, k, v.

Upstream counterpart: ``vllm/model_executor/layers/attention/attention.py``
(``Attention``). The layer owns no weights. It owns a view of this layer's slice of the
KV cache (bound by the model runner once the cache is allocated) and reads the batch
layout from the forward context. Each call does the two things paged attention is made
of: write this step's K/V into the cache, then attend over the cache.

The first of the two may have been done already: an op that runs just before attention
and holds k (Qwen3's fused q/k norm + RoPE kernel) can store k and v into the cache in
its own launch, saving one launch per layer and step. The layer hands such an op what it
needs (:meth:`Attention.fusable_kv_cache_update`) and takes back the proof that it was
done (``forward``'s ``kv_cache_updated``). Upstream splits the cache write out of
attention for the same reason (``forward_includes_kv_cache_update = False`` and
``do_kv_cache_update`` in ``vllm/v1/attention/backends/triton_attn.py``), so that the
compiler pass ``vllm/compilation/passes/fusion/rope_kvcache_fusion.py`` can fuse it
with RoPE.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from minivllm.attention.selector import AttentionBackend
from minivllm.forward_context import AttentionMetadata, get_forward_context


class KVCacheUpdate(NamedTuple):
    """Where one layer's K/V of this step go: its cache pair and the step's slot mapping.

    Handed out by :meth:`Attention.fusable_kv_cache_update` to the op that will write the
    cache itself, and handed back to :meth:`Attention.forward` (``kv_cache_updated``) by
    the caller once that op ran. The layer checks by identity that it is its own, of
    this step, so a stale or foreign one fails loudly instead of skipping a write.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor


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

    def can_fuse_kv_cache_write(self) -> bool:
        """Whether an op before attention may write this layer's cache: the cache is bound
        and the backend lets it (``AttentionBackend.fused_kv_cache_write``; off for the
        torch backend, the oracle the kernels are checked against; upstream fuses only
        for backends whose ``fused_rope_kvcache_supported`` says so)."""
        return (
            self.kv_cache is not None
            and self.backend is not None
            and self.backend.fused_kv_cache_write
        )

    def fusable_kv_cache_update(self) -> KVCacheUpdate | None:
        """What an op fused before attention needs to write this step's K/V to the cache
        itself, or None when ``forward`` must write them (then pass it nothing).

        None during the memory-profiling run (no metadata: nothing may be written) and
        where :meth:`can_fuse_kv_cache_write` says no.
        Decided on the host from the forward context alone (no device work, no sync), so
        a captured CUDA graph holds whichever path its capture took, and its replays
        write the cache exactly as the capture did.
        """
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None or not self.can_fuse_kv_cache_write():
            return None
        return KVCacheUpdate(*self.kv_cache, attn_metadata.slot_mapping)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache_updated: KVCacheUpdate | None = None,
    ) -> torch.Tensor:
        """Attend.

        Args:
            q: ``[num_tokens, num_heads * head_size]``.
            k: ``[num_tokens, num_kv_heads * head_size]``.
            v: ``[num_tokens, num_kv_heads * head_size]``.
            kv_cache_updated: The :meth:`fusable_kv_cache_update` of this step when an op
                already wrote ``k`` and ``v`` there (the write is skipped); None to have
                them written here.

        Returns:
            ``[num_tokens, num_heads * head_size]``.
        """
        num_tokens = q.shape[0]
        attn_metadata = get_forward_context().attn_metadata
        if attn_metadata is None:
            if kv_cache_updated is not None:
                raise ValueError(f"{self.prefix}: no step is running, so no cache was written")
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
        if kv_cache_updated is None:
            self.backend.reshape_and_cache(k, v, key_cache, value_cache, attn_metadata.slot_mapping)
        elif not (
            kv_cache_updated.key_cache is key_cache
            and kv_cache_updated.value_cache is value_cache
            and kv_cache_updated.slot_mapping is attn_metadata.slot_mapping
        ):
            raise ValueError(
                f"{self.prefix}: kv_cache_updated is not this layer's cache update of this "
                "step (take it from fusable_kv_cache_update of this layer, in this step)"
            )
        split = attn_metadata.decode_split if self.backend.splits_decodes else None
        if split is None:
            out = self._attend(q, k, v, attn_metadata)
        else:
            # Two launches into one output: the decodes on decode tiles, the prompt
            # chunks on prefill tiles (see DecodeSplit).
            out = torch.empty(num_tokens, self.num_heads, self.head_size,
                              dtype=q.dtype, device=q.device)  # fmt: skip
            n = split.num_decodes
            self._attend(q[:n], k[:n], v[:n], split.decodes, out[:n])
            self._attend(q[n:], k[n:], v[n:], split.prefills, out[n:])
        return out.view(num_tokens, self.num_heads * self.head_size)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_metadata: AttentionMetadata,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One paged-attention call over ``attn_metadata``'s sequences (into ``out``
        when given), with the launch hints the metadata and the backend allow."""
        key_cache, value_cache = self.kv_cache
        return self.backend.paged_attention(
            q,
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            attn_metadata.query_start_loc,
            self.scale,
            out=out,
            max_query_len=attn_metadata.max_query_len,
            max_seq_len=attn_metadata.max_seq_len,
            key=k,
            value=v,
            seq_order=attn_metadata.seq_order if self.backend.takes_seq_order else None,
        )
