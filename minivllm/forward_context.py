"""Per-step state that every attention layer reads during one forward pass.

Upstream counterpart: ``vllm/forward_context.py`` (``set_forward_context``,
``get_forward_context``). The model's ``forward(input_ids, positions)`` signature
stays the same as a Hugging Face model's; the batch layout that paged attention needs
(where each token's K/V goes, which blocks each sequence owns) travels beside it in a
context variable set by the model runner for the duration of the forward pass.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """How one flat batch of tokens maps onto sequences and KV cache slots.

    Attributes:
        slot_mapping: ``[num_tokens]`` int64; cache slot (``block_id * block_size +
            offset``) where each token's K/V is written; negative means "do not write"
            (padding).
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32; physical block ids of each
            sequence, in logical order.
        seq_lens: ``[num_seqs]`` int32; context length of each sequence including the
            tokens of this step.
        query_start_loc: ``[num_seqs + 1]`` int32; sequence i owns query tokens
            ``query_start_loc[i]:query_start_loc[i + 1]`` of the flat batch.
        max_query_len: Longest query of the batch (host int, so kernels can pick a launch
            configuration without reading the device).
        max_seq_len: Longest context of the batch (host int, same reason).
    """

    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the batch."""
        return self.seq_lens.shape[0]

    @functools.cached_property
    def seq_order(self) -> torch.Tensor | None:
        """A decode batch's sequences, longest context first (``[num_seqs]`` int64 on
        the device), or None for a batch with longer queries.

        The launch order of the attention kernel (see "Launch order" in
        ``triton_unified_attention.py``). Computed on first use, by the first attention
        layer of the step, and shared by the others: one small sort per step. It runs on
        the device so that a captured CUDA graph replays it, on the lengths of that
        replay.
        """
        if self.max_query_len != 1:
            return None
        return torch.argsort(self.seq_lens, descending=True)


@dataclass
class ForwardContext:
    """Everything a layer may need that is not a tensor argument of ``forward``."""

    attn_metadata: AttentionMetadata | None


_forward_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    """Return the context of the forward pass in progress."""
    if _forward_context is None:
        raise RuntimeError(
            "no forward context is set: run the model inside set_forward_context(...)"
        )
    return _forward_context


@contextlib.contextmanager
def set_forward_context(attn_metadata: AttentionMetadata | None) -> Iterator[None]:
    """Make ``attn_metadata`` visible to every layer for the duration of the block."""
    global _forward_context
    previous = _forward_context
    _forward_context = ForwardContext(attn_metadata=attn_metadata)
    try:
        yield
    finally:
        _forward_context = previous
