"""Draft-model proposer: a second, smaller model guesses the next ``k`` tokens.

Upstream counterparts: ``vllm/v1/spec_decode/draft_model.py`` (``DraftModelProposer``)
on top of ``vllm/v1/spec_decode/llm_base_proposer.py`` (``SpecDecodeBaseProposer.propose``:
one pass over the step's tokens, then ``k - 1`` single-token passes, greedy).

The draft has its own KV cache, indexed by the *same block ids* as the target's: block
``b`` of request ``r`` holds the target's K/V of some 16 positions in the target's
tensors and the draft's K/V of the same positions in the draft's tensors. So the block
pool, ``allocate_slots``, preemption and prefix caching need no change: whatever the
target has computed in a block, the draft has computed too, because after every step the
draft runs over exactly the tokens the target kept.

One step of proposing, after the target has verified and sampled:

1. **Catch up.** Per request, the draft is fed the target's input tokens of this step
   minus the rejected drafts, followed (for a request that sampled) by the token just
   sampled. A prefill chunk feeds its whole chunk, so the draft's cache follows the
   prompt as the target's does. The draft's argmax after the sampled token is draft 1.
2. **Chain.** ``k - 1`` more passes of one token per sampling request: draft ``j``
   at the position after the previous one, its argmax is draft ``j + 1``.

The last ``k`` positions written (the sampled token's, when all drafts were accepted,
and the chain's) may lie past the blocks the scheduler has allocated to the request:
their K/V goes to *scratch blocks* after the pool's ``num_blocks``, one small run per
batch row, and is lost. Nothing is lost that matters: the next step's catch-up starts at
the target's first scheduled position, which is the position of the token sampled now,
so it rewrites those positions in the request's real blocks (upstream instead reserves
``k`` lookahead slots in the scheduler). Rejected drafts' positions are rewritten the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.utils.math_utils import cdiv
from minivllm.utils.torch_utils import copy_to_device


@dataclass
class TargetBatch:
    """The host-side layout of the step the target just ran (from ``_prepare_inputs``).

    Attributes:
        query_start_loc: ``[R + 1]`` where each request's tokens start in the flat batch.
        num_computed: ``[R]`` tokens each request had computed before the step.
        block_table: ``[R, W]`` block ids of each request (zero-padded).
        num_blocks: ``[R]`` blocks each request holds after this step's allocation.
        needs_sample: ``[R]`` True for the requests that sampled a token this step.
    """

    query_start_loc: np.ndarray
    num_computed: np.ndarray
    block_table: np.ndarray
    num_blocks: np.ndarray
    needs_sample: np.ndarray


def num_scratch_blocks(num_speculative_tokens: int, block_size: int, max_num_seqs: int) -> int:
    """Scratch blocks the draft's cache needs past the pool: per batch row, enough for
    ``k`` positions past its last allocated block (those start at a block boundary)."""
    return max_num_seqs * cdiv(num_speculative_tokens, block_size)


class DraftModelProposer:
    """Greedy drafts from a draft model whose KV cache shares the target's block ids.

    Args:
        model: The draft model, loaded, its attention layers bound to a cache of
            ``num_blocks + num_scratch_blocks(...)`` blocks.
        num_speculative_tokens: ``k``, drafts per request and step.
        block_size: Tokens per KV block (the target's).
        max_model_len: No position at or past it is ever computed.
        num_blocks: Blocks in the shared pool; scratch blocks follow them.
        device: Where the model runs.
    """

    def __init__(
        self,
        model: nn.Module,
        num_speculative_tokens: int,
        block_size: int,
        max_model_len: int,
        num_blocks: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self.scratch_per_row = cdiv(num_speculative_tokens, block_size)
        self.device = device

    @torch.inference_mode()
    def propose(
        self,
        batch: TargetBatch,
        input_ids: torch.Tensor,
        next_token_ids: torch.Tensor,
        num_rejected: np.ndarray,
    ) -> torch.Tensor:
        """Run the catch-up pass and the chain; return ``[num_sampling, k]`` drafts.

        Args:
            batch: The target step's layout.
            input_ids: ``[num_tokens]`` the target's flat input ids (device).
            next_token_ids: ``[num_sampling]`` the token each sampling request gained
                (device; -1 on a failed row, which is fed as token 0).
            num_rejected: ``[num_sampling]`` drafts each sampling request rejected.
        """
        sampling_rows = np.flatnonzero(batch.needs_sample)
        num_tokens = input_ids.shape[0]
        keep = np.diff(batch.query_start_loc).astype(np.int64)
        keep[sampling_rows] -= num_rejected
        extra = batch.needs_sample.astype(np.int64)
        # Source of every catch-up token in cat([input_ids, next_token_ids]): the kept
        # inputs of each request, then its sampled token.
        query_len = keep + extra
        cu_query = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(query_len, out=cu_query[1:])
        offsets = np.arange(cu_query[-1]) - np.repeat(cu_query[:-1], query_len)
        src = np.repeat(batch.query_start_loc[:-1].astype(np.int64), query_len) + offsets
        is_next = offsets == np.repeat(keep, query_len)
        src[is_next] = num_tokens + np.arange(len(sampling_rows))
        positions = np.repeat(batch.num_computed.astype(np.int64), query_len) + offsets
        req_idx = np.repeat(np.arange(len(keep)), query_len)
        last_pos = batch.num_computed[sampling_rows] + keep[sampling_rows]
        chain_pos = np.minimum(
            last_pos[None, :] + np.arange(1, self.k)[:, None], self.max_model_len - 1
        )
        table = self._block_table(
            batch, max(int(positions.max(initial=0)), int(chain_pos.max(initial=0)))
        )
        seq_lens = (batch.num_computed + query_len).astype(np.int64)
        sample_idx = cu_query[1:][sampling_rows] - 1
        chain_tables = table[sampling_rows]
        chain_slots = self._slots(chain_tables[None, :, :].repeat(len(chain_pos), 0), chain_pos)
        src_d, pos_d, slots_d, sample_d, chain_pos_d, chain_slots_d = copy_to_device(
            [
                src,
                positions,
                self._slots(table[req_idx], positions),
                sample_idx,
                chain_pos,
                chain_slots,
            ],
            np.int64,
            self.device,
        )
        table_d, seq_d, qsl_d, chain_table_d, chain_seq_d = copy_to_device(
            [table, seq_lens, cu_query, chain_tables, chain_pos + 1], np.int32, self.device
        )
        tokens = torch.cat([input_ids, next_token_ids.clamp(min=0)])[src_d]
        meta = AttentionMetadata(
            slot_mapping=slots_d,
            block_table=table_d,
            seq_lens=seq_d,
            query_start_loc=qsl_d,
            max_query_len=int(query_len.max()),
            max_seq_len=int(seq_lens.max()),
        )
        draft = self._greedy(tokens, pos_d, meta, sample_d)
        drafts = [draft]
        num_seqs = len(sampling_rows)
        chain_qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=self.device)
        for j in range(self.k - 1):
            meta = AttentionMetadata(
                slot_mapping=chain_slots_d[j],
                block_table=chain_table_d,
                seq_lens=chain_seq_d[j],
                query_start_loc=chain_qsl,
                max_query_len=1,
                max_seq_len=int(chain_pos[j].max()) + 1,
            )
            draft = self._greedy(draft, chain_pos_d[j], meta, None)
            drafts.append(draft)
        return torch.stack(drafts, dim=1)

    def _greedy(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        sample_idx: torch.Tensor | None,
    ) -> torch.Tensor:
        """One forward pass of the draft; the argmax at ``sample_idx`` (every row if None)."""
        with set_forward_context(meta):
            hidden = self.model(input_ids, positions)
        if sample_idx is not None:
            hidden = hidden[sample_idx]
        return self.model.compute_logits(hidden).argmax(dim=-1)

    def _block_table(self, batch: TargetBatch, max_position: int) -> np.ndarray:
        """The target's block table, each row continued past its own blocks by that
        row's scratch blocks, wide enough for ``max_position``."""
        num_reqs = len(batch.num_blocks)
        width = max(batch.block_table.shape[1], max_position // self.block_size + 1)
        table = np.zeros((num_reqs, width), dtype=np.int64)
        table[:, : batch.block_table.shape[1]] = batch.block_table
        col = np.arange(width)[None, :]
        past = col - batch.num_blocks[:, None]  # >= 0: past the request's own blocks
        scratch = (
            self.num_blocks
            + np.arange(num_reqs)[:, None] * self.scratch_per_row
            + np.clip(past, 0, self.scratch_per_row - 1)
        )
        return np.where(past >= 0, scratch, table)

    def _slots(self, table: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Cache slot of each position, given the block-table row of each position."""
        bs = self.block_size
        block = np.take_along_axis(table, (positions // bs)[..., None], axis=-1)[..., 0]
        return block * bs + positions % bs
