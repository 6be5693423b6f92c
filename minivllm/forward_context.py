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
        decode_split: For a mixed batch, the same batch cut in two: its leading
            single-token queries and the rest (see :class:`DecodeSplit`); None otherwise.
        launch_order: A decode batch's ``seq_order`` as the host computed it
            (``[num_seqs]`` int64 on the device, carried in the step's one copy); None
            leaves ``seq_order`` to sort ``seq_lens`` on the device.
    """

    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    decode_split: DecodeSplit | None = None
    launch_order: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the batch."""
        return self.seq_lens.shape[0]

    @functools.cached_property
    def seq_order(self) -> torch.Tensor | None:
        """A decode batch's sequences, longest context first (``[num_seqs]`` int64 on
        the device), or None for a batch with longer queries.

        The launch order of the attention kernel (see "Launch order" in
        ``triton_unified_attention.py``). The engine's steps bring it from the host
        (``launch_order``: ``prepare_inputs`` sorts the lengths it already has, and a
        CUDA graph reads it from a static buffer), which keeps a sort kernel out of
        every decode step. Without it, it is sorted on the device on first use, by the
        first attention layer, and shared by the others. Any permutation is correct;
        the order only decides which programs start first.
        """
        if self.max_query_len != 1:
            return None
        if self.launch_order is not None:
            return self.launch_order
        return torch.argsort(self.seq_lens, descending=True)


@dataclass(frozen=True)
class DecodeSplit:
    """A mixed batch as two batches: its first ``num_decodes`` sequences, each with one
    query token, and the sequences after them.

    Why: one attention launch takes one tile shape for the whole batch. A batch with
    prompt chunks takes the prefill tiles, 64 or 128 query rows per tile, and a decode
    sequence then fills 2 of a tile's 64 rows (one token times the query heads that share
    a KV head): its keys are read once either way, but the tile's arithmetic is done for
    all 64 rows. Launched apart, the decodes run on the 16-row decode tiles, in
    ``seq_order``, and the chunks keep theirs. Upstream does the same in the metadata
    builders of its backends (``split_decodes_and_prefills`` in
    ``vllm/v1/attention/backends/utils.py``, after the persistent batch is reordered so
    decodes come first); minivllm's scheduler already lists running requests before new
    ones, so the leading run of single-token queries is the decodes.

    Both halves are views of the full batch's tensors except ``prefills.query_start_loc``
    (the offsets, less ``num_decodes``), so a correction made in place on the full
    ``seq_lens`` (async speculative decoding) holds in both.
    """

    num_decodes: int
    decodes: AttentionMetadata
    prefills: AttentionMetadata

    @staticmethod
    def of(
        metadata: AttentionMetadata,
        num_decodes: int,
        prefill_query_start_loc: torch.Tensor,
        decode_max_seq_len: int,
        prefill_max_seq_len: int,
        decode_launch_order: torch.Tensor | None = None,
    ) -> DecodeSplit:
        """Cut ``metadata`` after its first ``num_decodes`` sequences (``0 <
        num_decodes < num_seqs``); ``prefill_query_start_loc`` is the rest's query offsets
        counted from their first token, the two maxima the halves' longest contexts, and
        ``decode_launch_order`` the decodes' ``launch_order`` (None: sorted on the device)."""
        n = num_decodes
        if not 0 < n < metadata.num_seqs:
            raise ValueError(f"num_decodes must be in 1..{metadata.num_seqs - 1}, got {n}")
        if prefill_query_start_loc.shape != (metadata.num_seqs - n + 1,):
            raise ValueError(
                f"prefill_query_start_loc must have shape ({metadata.num_seqs - n + 1},), "
                f"got {tuple(prefill_query_start_loc.shape)}"
            )
        decodes = AttentionMetadata(
            slot_mapping=metadata.slot_mapping[:n],
            block_table=metadata.block_table[:n],
            seq_lens=metadata.seq_lens[:n],
            query_start_loc=metadata.query_start_loc[: n + 1],
            max_query_len=1,
            max_seq_len=decode_max_seq_len,
            launch_order=decode_launch_order,
        )
        prefills = AttentionMetadata(
            slot_mapping=metadata.slot_mapping[n:],
            block_table=metadata.block_table[n:],
            seq_lens=metadata.seq_lens[n:],
            query_start_loc=prefill_query_start_loc,
            max_query_len=metadata.max_query_len,
            max_seq_len=prefill_max_seq_len,
        )
        return DecodeSplit(n, decodes, prefills)


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
