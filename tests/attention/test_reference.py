"""The torch oracle itself agrees with plain, unpaged attention written independently.

``reference.py`` is what the Triton kernels are measured against, so it gets its own
check: rebuild each sequence's keys and values token by token from the cache (a Python
loop, no vectorised indexing), then run ``scaled_dot_product_attention`` with an explicit
bottom-right-aligned causal mask.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.attention import reference
from tests.attention.paged_batch import make_paged_batch


def _dense_attention(b) -> torch.Tensor:
    block_size = b.key_cache.shape[1]
    group = b.query.shape[1] // b.key_cache.shape[2]
    out = torch.empty_like(b.query, dtype=torch.float32)
    starts = b.query_start_loc.tolist()
    for i, seq_len in enumerate(b.seq_lens.tolist()):
        rows = []
        for pos in range(seq_len):
            block = int(b.block_table[i, pos // block_size])
            rows.append((block, pos % block_size))
        k = torch.stack([b.key_cache[blk, off] for blk, off in rows]).float()  # [S, KVH, D]
        v = torch.stack([b.value_cache[blk, off] for blk, off in rows]).float()
        q = b.query[starts[i] : starts[i + 1]].float()  # [Q, H, D]
        q_len = q.shape[0]
        # Query t is at absolute position seq_len - q_len + t and sees keys 0..that.
        allowed = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.repeat_interleave(group, dim=1).transpose(0, 1),
            v.repeat_interleave(group, dim=1).transpose(0, 1),
            attn_mask=allowed,
            scale=b.scale,
        )
        out[starts[i] : starts[i + 1]] = o.transpose(0, 1)
    return out


@pytest.mark.parametrize("group", [1, 4])
def test_reference_attention_equals_dense_sdpa(group: int) -> None:
    b = make_paged_batch([(0, 9), (20, 1), (13, 6)], block_size=8, num_kv_heads=2,
                         group=group, head_size=32, dtype=torch.float32, seed=group)
    reference.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping)
    out = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    torch.testing.assert_close(out, _dense_attention(b), atol=1e-5, rtol=1e-5)


def test_reference_cache_write_is_a_slot_scatter() -> None:
    b = make_paged_batch([(3, 4), (0, 5)], block_size=4, num_kv_heads=2, group=1,
                         head_size=16, dtype=torch.float32, seed=1)
    slots = b.slot_mapping.clone()
    slots[2] = -1  # padding: must leave the cache alone
    expected_k, expected_v = b.key_cache.clone(), b.value_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // 4, slot % 4] = b.key[t]
            expected_v[slot // 4, slot % 4] = b.value[t]
    reference.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, slots)
    assert torch.equal(b.key_cache, expected_k)
    assert torch.equal(b.value_cache, expected_v)


def test_reference_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        reference.paged_attention(
            torch.randn(1, 3, 8), torch.randn(2, 4, 2, 8), torch.randn(2, 4, 2, 8),
            torch.zeros(1, 1, dtype=torch.int32), torch.tensor([1], dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32), 1.0,
        )
