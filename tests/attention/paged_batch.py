"""Builds random paged-attention batches for the kernel tests (shared by the test files).

A batch is described by, for each sequence, how many tokens are already cached
(``context``) and how many new query tokens it brings this step (``query``): decode is
``(c, 1)``, a whole prefill ``(0, n)``, a chunk of a prefill on top of a cached prefix
``(c, n)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Block-table entries past a sequence's last block: far outside the pool, so a kernel that
# reads K/V through one of them faults (GPU) or fails the comparison instead of silently
# reading a valid block.
INVALID_BLOCK = 1 << 20


@dataclass
class PagedBatch:
    """Everything one ``reshape_and_cache`` + ``paged_attention`` step needs."""

    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, KVH, D], a strided view into a fused qkv tensor
    value: torch.Tensor
    key_cache: torch.Tensor  # [num_blocks, block_size, KVH, D], random everywhere
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T] int64
    block_table: torch.Tensor  # [S, max_blocks] int32, a random permutation of the pool
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    scale: float
    max_query_len: int
    max_seq_len: int


def make_paged_batch(
    seqs: list[tuple[int, int]],
    *,
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_size: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Random inputs for ``seqs = [(context_len, query_len), ...]`` (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    seq_lens = [c + q for c, q in seqs]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    max_blocks = max(blocks_per_seq) + 1  # one spare column, always INVALID_BLOCK

    # A random permutation of the whole pool, dealt out to the sequences in order, so
    # neighbouring logical blocks are almost never neighbours in memory.
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = torch.full((len(seqs), max_blocks), INVALID_BLOCK, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        block_table[i, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = randn(*cache_shape), randn(*cache_shape)

    num_tokens = sum(q for _, q in seqs)
    # Fused projection output, as the engine has it; k and v are strided views of it.
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size).to(device)
    query = qkv[:, : num_heads * head_size].reshape(num_tokens, num_heads, head_size)
    kv = qkv[:, num_heads * head_size :].view(num_tokens, 2 * num_kv_heads, head_size)

    slots, starts = [], [0]
    for i, (ctx, q_len) in enumerate(seqs):
        for pos in range(ctx, ctx + q_len):
            slots.append(int(block_table[i, pos // block_size]) * block_size + pos % block_size)
        starts.append(starts[-1] + q_len)

    return PagedBatch(
        query=query.contiguous(),
        key=kv[:, :num_kv_heads],
        value=kv[:, num_kv_heads:],
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_table=block_table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        scale=head_size**-0.5,
        max_query_len=max(q for _, q in seqs),
        max_seq_len=max(seq_lens),
    )
