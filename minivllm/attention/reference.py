"""The paged-attention oracle, in plain torch.

This file defines what paged attention *means* in minivllm. It is written for clarity,
not speed: it gathers each sequence's keys and values through its block table into a
contiguous tensor and runs ordinary causal attention over them. Every fast kernel
(``backends/triton_attn.py``) is tested against these two functions, and the engine uses them as
its CPU backend.

Upstream counterparts: the cache write is ``reshape_and_cache_flash`` and the attention
is ``unified_attention`` (see the PagedAttention chapter for links).

Cache layout: one K and one V tensor per layer, each
``[num_blocks, block_size, num_kv_heads, head_size]``. Token ``j`` of a sequence lives
in block ``block_table[seq, j // block_size]`` at offset ``j % block_size``.
"""

from __future__ import annotations

import torch


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write this step's keys and values into the paged cache, in place.

    Args:
        key: ``[num_tokens, num_kv_heads, head_size]``.
        value: ``[num_tokens, num_kv_heads, head_size]``.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_size]``.
        value_cache: same shape as ``key_cache``.
        slot_mapping: ``[num_tokens]``; slot ``s`` means block ``s // block_size``,
            offset ``s % block_size``. Tokens with a negative slot are skipped.
    """
    num_blocks, block_size = key_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    # View the cache as one long array of slots; a slot id is then a plain row index.
    key_cache.view(num_blocks * block_size, *key_cache.shape[2:])[slots] = key[valid].to(
        key_cache.dtype
    )
    value_cache.view(num_blocks * block_size, *value_cache.shape[2:])[slots] = value[valid].to(
        value_cache.dtype
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole cached context.

    Args:
        query: ``[num_tokens, num_heads, head_size]``; the new tokens of all sequences,
            concatenated.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_size]``.
        value_cache: same shape as ``key_cache``.
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32.
        seq_lens: ``[num_seqs]`` int32; context length including this step's tokens.
        query_start_loc: ``[num_seqs + 1]`` int32; the query tokens of sequence ``i`` are
            its last ``query_start_loc[i+1] - query_start_loc[i]`` positions.
        scale: Softmax scale, usually ``head_size ** -0.5``.

    Returns:
        ``[num_tokens, num_heads, head_size]`` in the query's dtype. Softmax runs in
        float32, as the kernels do.
    """
    num_tokens, num_heads, head_size = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    output = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        # Address translation: logical token j -> (physical block, offset).
        pos = torch.arange(seq_len, device=query.device)
        blocks = block_table[i, pos // block_size].long()
        k = key_cache[blocks, pos % block_size].float()  # [seq_len, kv_heads, head]
        v = value_cache[blocks, pos % block_size].float()
        k = k.repeat_interleave(group, dim=1)  # grouped-query: share each KV head
        v = v.repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # [q_len, heads, head]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        # Query token t sits at absolute position seq_len - q_len + t; causal mask.
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        mask = pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        output[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return output
