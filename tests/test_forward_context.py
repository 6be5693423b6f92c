"""``AttentionMetadata``: the per-step batch layout, and the launch order it derives."""

from __future__ import annotations

import torch

from minivllm.forward_context import AttentionMetadata


def _metadata(seq_lens: list[int], max_query_len: int) -> AttentionMetadata:
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.zeros(len(seq_lens), dtype=torch.long),
        block_table=torch.zeros(len(seq_lens), 1, dtype=torch.int32),
        seq_lens=lens,
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32),
        max_query_len=max_query_len,
        max_seq_len=max(seq_lens),
    )


def test_seq_order_of_a_decode_batch_is_longest_first_and_computed_once():
    metadata = _metadata([40, 7, 300, 41, 1], max_query_len=1)
    order = metadata.seq_order
    assert order.tolist() == [2, 3, 0, 1, 4]
    assert metadata.seq_order is order  # one sort per step, shared by every layer
    # A permutation of the batch, as the kernel needs (every sequence exactly once).
    assert sorted(order.tolist()) == list(range(5))


def test_seq_order_follows_the_lengths_on_the_device():
    """The order is a function of the ``seq_lens`` tensor, read when first asked for: a
    CUDA graph that captured the sort replays it on the lengths then in the buffer."""
    metadata = _metadata([3, 5, 4], max_query_len=1)
    metadata.seq_lens[0] = 9
    assert metadata.seq_order.tolist() == [0, 1, 2]


def test_no_seq_order_for_batches_with_longer_queries():
    assert _metadata([12, 30], max_query_len=4).seq_order is None
