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
from typing import Any

import numpy as np
import torch
from torch import nn

from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.utils.math_utils import cdiv
from minivllm.utils.torch_utils import copy_arrays_to_device


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


@dataclass
class _DraftPlan:
    """One proposal's host-side inputs: the catch-up pass, then the chain."""

    src: np.ndarray  # [T] each catch-up token's index in cat([input_ids, next_token_ids])
    positions: np.ndarray  # [T]
    slots: np.ndarray  # [T]
    sample_idx: np.ndarray  # [S] the catch-up row of each sampling request's new token
    table: np.ndarray  # [R, W] block table with scratch, every request
    seq_lens: np.ndarray  # [R]
    query_start_loc: np.ndarray  # [R + 1]
    max_query_len: int
    chain_pos: np.ndarray  # [k - 1, S]
    chain_table: np.ndarray  # [S, W] the sampling requests' rows of ``table``
    chain_slots: np.ndarray  # [k - 1, S]


class DraftModelProposer:
    """Greedy drafts from a draft model whose KV cache shares the target's block ids.

    The model runner loads the model, then (once the pool is sized) allocates its cache
    with ``num_blocks + num_scratch_blocks`` blocks, binds it, and calls
    ``set_num_blocks``.

    Args:
        model: The draft model, loaded.
        num_speculative_tokens: ``k``, drafts per request and step.
        block_size: Tokens per KV block (the target's).
        max_model_len: No position at or past it is ever computed.
        max_num_seqs: Most requests in one step (one run of scratch blocks each).
        device: Where the model runs.
    """

    def __init__(
        self,
        model: nn.Module,
        num_speculative_tokens: int,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.device = device
        # Per batch row, enough blocks for k positions past its last allocated block
        # (those start at a block boundary).
        self.scratch_per_row = cdiv(num_speculative_tokens, block_size)
        self.num_scratch_blocks = max_num_seqs * self.scratch_per_row
        self.num_blocks: int | None = None
        # The runner's CUDAGraphRunner for the draft (graph_key / run), or None: eager.
        self.graphs: Any = None

    def set_num_blocks(self, num_blocks: int) -> None:
        """The pool's size: the draft's cache holds these blocks, then the scratch."""
        self.num_blocks = num_blocks

    def profile_run(self, num_tokens: int, num_rows: int) -> None:
        """The largest catch-up pass (a full step's tokens plus one per request), without
        a cache, so that the memory profiler sees the draft's activation peak."""
        input_ids = torch.zeros(num_tokens + num_rows, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens + num_rows, device=self.device) % self.max_model_len
        with set_forward_context(None):
            hidden = self.model(input_ids, positions)
        self.model.compute_logits(hidden[:num_rows]).argmax(dim=-1)

    @torch.inference_mode()
    def propose(
        self,
        batch: TargetBatch,
        input_ids: torch.Tensor,
        next_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        num_accepted: list[int] | None,
        catch_up_only: bool = False,
    ) -> torch.Tensor:
        """Run the catch-up pass and the chain; return ``[num_sampling, k]`` drafts.

        Args:
            batch: The target step's layout.
            input_ids: ``[num_tokens]`` the target's flat input ids (device).
            next_token_ids: ``[num_sampling]`` the token each sampling request gained
                (device; -1 on a failed row, which is fed as token 0).
            num_draft_tokens: Drafts each sampling request verified this step.
            num_accepted: How many of them it accepted (None: no request verified).
            catch_up_only: Only write the draft's K/V of the kept tokens (a step above
                ``disable_by_batch_size``): the cache stays in step with the target's,
                so speculation can resume later and prefix hits find the draft's K/V
                too; returns ``[num_sampling, 0]``.
        """
        assert self.num_blocks is not None, "set_num_blocks() has not run"
        num_rejected = np.array(num_draft_tokens, dtype=np.int64)
        if num_accepted is not None:
            num_rejected = np.maximum(num_rejected - np.array(num_accepted, np.int64), 0)
        plan = self._plan(batch, input_ids.shape[0], num_rejected)
        num_seqs = plan.chain_table.shape[0]
        # One host-to-device copy for the whole proposal (int64 for ids, positions and
        # slots, int32 for the attention kernel's tables), the chain's metadata included.
        i64, i32 = np.int64, np.int32
        (
            src,
            positions,
            slots,
            sample_idx,
            chain_pos,
            chain_slots,
            table,
            seq_lens,
            query_start_loc,
            chain_table,
            chain_seq_lens,
            chain_query_start_loc,
        ) = copy_arrays_to_device(
            [
                plan.src,
                plan.positions,
                plan.slots,
                plan.sample_idx,
                plan.chain_pos,
                plan.chain_slots,
                plan.table,
                plan.seq_lens,
                plan.query_start_loc,
                plan.chain_table,
                plan.chain_pos + 1,
                np.arange(num_seqs + 1),
            ],
            [i64] * 6 + [i32] * 6,
            self.device,
        )
        tokens = torch.cat([input_ids, next_token_ids.clamp(min=0)])[src]
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_table=table,
            seq_lens=seq_lens,
            query_start_loc=query_start_loc,
            max_query_len=plan.max_query_len,
            max_seq_len=int(plan.seq_lens.max()),
        )
        if catch_up_only:
            self._run(tokens, positions, meta)
            return torch.empty((num_seqs, 0), dtype=torch.long, device=self.device)
        drafts = [self._greedy(tokens, positions, meta, sample_idx)]
        for j in range(self.k - 1 if num_seqs else 0):
            meta = AttentionMetadata(
                slot_mapping=chain_slots[j],
                block_table=chain_table,
                seq_lens=chain_seq_lens[j],
                query_start_loc=chain_query_start_loc,
                max_query_len=1,
                max_seq_len=int(plan.chain_pos[j].max()) + 1,
            )
            drafts.append(self._greedy(drafts[-1], chain_pos[j], meta, None))
        if not num_seqs:
            return torch.empty((0, self.k), dtype=torch.long, device=self.device)
        return torch.stack(drafts, dim=1)

    def _plan(self, batch: TargetBatch, num_tokens: int, num_rejected: np.ndarray) -> _DraftPlan:
        """Where every token of the catch-up pass and of the chain comes from and goes."""
        rows = np.flatnonzero(batch.needs_sample)
        keep = np.diff(batch.query_start_loc).astype(np.int64)
        keep[rows] -= num_rejected
        query_len = keep + batch.needs_sample
        cu_query = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(query_len, out=cu_query[1:])
        offsets = np.arange(cu_query[-1]) - np.repeat(cu_query[:-1], query_len)
        # Each token's index in cat([input_ids, next_token_ids]): a request's kept
        # inputs, then (if it sampled) its new token.
        src = np.repeat(batch.query_start_loc[:-1].astype(np.int64), query_len) + offsets
        src[offsets == np.repeat(keep, query_len)] = num_tokens + np.arange(len(rows))
        positions = np.repeat(batch.num_computed.astype(np.int64), query_len) + offsets
        # Chain pass j (row) of each sampling request (column): the position after
        # the new token's, j + 1 places on; never at or past max_model_len.
        last = batch.num_computed[rows] + keep[rows]
        chain_pos = np.minimum(last + np.arange(1, self.k)[:, None], self.max_model_len - 1)
        table = self._block_table(batch, max(positions.max(initial=0), chain_pos.max(initial=0)))
        req_idx = np.repeat(np.arange(len(keep)), query_len)
        return _DraftPlan(
            src=src,
            positions=positions,
            slots=self._slots(table, req_idx, positions),
            sample_idx=cu_query[1:][rows] - 1,
            table=table,
            seq_lens=batch.num_computed + query_len,
            query_start_loc=cu_query,
            max_query_len=int(query_len.max()),
            chain_pos=chain_pos,
            chain_table=table[rows],
            chain_slots=self._slots(table, rows[None, :], chain_pos),
        )

    def _greedy(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        sample_idx: torch.Tensor | None,
    ) -> torch.Tensor:
        """One forward pass of the draft; the argmax at ``sample_idx`` (every row if
        None)."""
        hidden = self._run(input_ids, positions, meta)
        if sample_idx is not None:
            hidden = hidden[sample_idx]
        return self.model.compute_logits(hidden).argmax(dim=-1)

    def _run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """One forward pass of the draft (a captured graph when one fits): hidden states."""
        graphs = self.graphs
        key = None if graphs is None else graphs.graph_key(meta, input_ids.shape[0])
        if key is not None:
            return graphs.run(key, input_ids, positions, meta)
        with set_forward_context(meta):
            return self.model(input_ids, positions)

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

    def _slots(self, table: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Cache slot of each position, given the block-table row of each (``rows``
        broadcasts against ``positions``)."""
        bs = self.block_size
        return table[rows, positions // bs] * bs + positions % bs
