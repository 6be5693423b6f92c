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
   and (for a request that sampled) one more slot; the token just sampled goes where the
   first rejected draft stood, or in that slot when every draft was accepted. A prefill
   chunk feeds its whole chunk, so the draft's cache follows the prompt as the target's
   does. The draft's argmax at the sampled token is draft 1. The pass has this fixed
   shape so that the host never needs the number of accepted drafts (async scheduling
   queues the next step before it is known): the host plans it (``_plan``), the device
   places the new token and the chain's positions (``_layout``). The positions after the
   new token hold rejected drafts past the request's end; causal attention keeps them
   out of the argmax, and the next passes write them again before anything reads them.
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
        num_computed: ``[R]`` tokens each request had computed before the step, as the
            scheduler counted them (with async scheduling: before ``position_shift``).
        block_table: ``[R, W]`` block ids of each request (zero-padded).
        num_blocks: ``[R]`` blocks each request holds after this step's allocation.
        needs_sample: ``[R]`` True for the requests that sampled a token this step.
        num_draft_tokens: ``[R]`` drafts each request verified this step (its last
            scheduled tokens).
        position_shift: ``[R]`` int64 on the device, or None (all zero): positions each
            request's tokens sit below ``num_computed + offset`` (async scheduling: the
            drafts the previous step rejected, which the scheduler still counted).
    """

    query_start_loc: np.ndarray
    num_computed: np.ndarray
    block_table: np.ndarray
    num_blocks: np.ndarray
    needs_sample: np.ndarray
    num_draft_tokens: np.ndarray | None = None
    position_shift: torch.Tensor | None = None


@dataclass
class _DraftPlan:
    """One proposal's host-side inputs: the catch-up pass, then the chain.

    Everything here is known before the target's verification has run: the parts that
    depend on how many drafts it accepts (where the new token goes, the chain's
    positions) are finished on the device in ``propose``.
    """

    src: np.ndarray  # [T] each catch-up token's index in cat([input_ids, next_token_ids])
    req_idx: np.ndarray  # [T] the batch row of each catch-up token
    positions: np.ndarray  # [T] before position_shift
    first_draft_idx: np.ndarray  # [S] catch-up row of each sampling request's first draft
    table: np.ndarray  # [R, W] block table with scratch, every request
    seq_lens: np.ndarray  # [R] before position_shift
    query_start_loc: np.ndarray  # [R + 1]
    max_query_len: int
    rows: np.ndarray  # [S] the batch row of each sampling request
    first_draft_pos: np.ndarray  # [S] position of its first draft, before position_shift


@dataclass
class _Passes:
    """One proposal's passes, ready to run on the device."""

    tokens: torch.Tensor  # [T] the catch-up pass's input ids
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_idx: torch.Tensor  # [S] the catch-up row whose argmax is draft 1
    chain_positions: list[torch.Tensor]  # k - 1 of [S]
    chain_metas: list[AttentionMetadata]


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
        # The whole proposal of a uniform verification step as one graph
        # (spec_decode/draft_graph.py), or None.
        self.proposal_graphs: Any = None

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
        num_accepted: torch.Tensor | None,
        catch_up_only: bool = False,
    ) -> torch.Tensor:
        """Run the catch-up pass and the chain; return ``[num_sampling, k]`` drafts.

        Nothing here waits for the device: the number of accepted drafts stays there.

        Args:
            batch: The target step's layout.
            input_ids: ``[num_tokens]`` the target's flat input ids (device).
            next_token_ids: ``[num_sampling]`` the token each sampling request gained
                (device; -1 on a failed row, which is fed as token 0).
            num_accepted: ``[num_sampling]`` int64 drafts each request accepted (device),
                or None: no request verified drafts.
            catch_up_only: Only write the draft's K/V of the kept tokens (a step above
                ``disable_by_batch_size``): the cache stays in step with the target's,
                so speculation can resume later and prefix hits find the draft's K/V
                too; returns ``[num_sampling, 0]``.
        """
        graphs = self.proposal_graphs
        if graphs is not None and num_accepted is not None and not catch_up_only:
            size = graphs.padded_size(batch, input_ids.shape[0])
            if size is not None:
                return graphs.run(size, batch, input_ids, next_token_ids, num_accepted)
        passes = self._layout(batch, input_ids, next_token_ids, num_accepted)
        num_seqs = len(passes.sample_idx)
        if catch_up_only:
            self._run(passes.tokens, passes.positions, passes.meta)
            return torch.empty((num_seqs, 0), dtype=torch.long, device=self.device)
        drafts = [self._greedy(passes.tokens, passes.positions, passes.meta, passes.sample_idx)]
        if not num_seqs:
            return torch.empty((0, self.k), dtype=torch.long, device=self.device)
        for positions, meta in zip(passes.chain_positions, passes.chain_metas):
            drafts.append(self._greedy(drafts[-1], positions, meta, None))
        return torch.stack(drafts, dim=1)

    def _layout(
        self,
        batch: TargetBatch,
        input_ids: torch.Tensor,
        next_token_ids: torch.Tensor,
        num_accepted: torch.Tensor | None,
    ) -> _Passes:
        """Every pass's inputs, on the device: the host's plan (``_plan``) finished with
        what only the device knows (accepted drafts, ``batch.position_shift``)."""
        assert self.num_blocks is not None, "set_num_blocks() has not run"
        plan = self._plan(batch, input_ids.shape[0])
        num_seqs = len(plan.rows)
        # One host-to-device copy for the whole proposal (int64 for ids, positions and
        # slots, int32 for the attention kernel's tables).
        i64, i32 = np.int64, np.int32
        (
            src,
            req_idx,
            positions,
            first_draft_idx,
            first_draft_pos,
            rows,
            table64,
            table,
            seq_lens,
            query_start_loc,
            chain_query_start_loc,
        ) = copy_arrays_to_device(
            [
                plan.src,
                plan.req_idx,
                plan.positions,
                plan.first_draft_idx,
                plan.first_draft_pos,
                plan.rows,
                plan.table,
                plan.table,
                plan.seq_lens,
                plan.query_start_loc,
                np.arange(num_seqs + 1),
            ],
            [i64] * 7 + [i32] * 4,
            self.device,
        )
        next_ids = next_token_ids.clamp(min=0)
        tokens = torch.cat([input_ids, next_ids])[src]
        # The new token follows the accepted drafts: it takes the first rejected
        # draft's place (the positions after it hold rejected drafts and, at the end,
        # a copy of the new token; the next step rewrites them before anything reads
        # them, as the target does).
        accepted = torch.zeros_like(first_draft_idx)
        if num_accepted is not None:
            accepted = num_accepted.to(torch.int64)
        sample_idx = first_draft_idx + accepted
        tokens[sample_idx] = next_ids
        shift = batch.position_shift
        if shift is not None:
            positions = positions - shift[req_idx]
            seq_lens = seq_lens - shift.to(torch.int32)
        # The spare slot of a request scheduled up to max_model_len - 1 sits at
        # max_model_len, past every position the model has (its rotary table ends
        # there): it runs at the last position and writes nothing (slot -1).
        positions, slots = self._within_model_len(table64, req_idx, positions)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_table=table,
            seq_lens=seq_lens,
            query_start_loc=query_start_loc,
            max_query_len=plan.max_query_len,
            max_seq_len=int(plan.seq_lens.max()),
        )
        passes = _Passes(tokens, positions, meta, sample_idx, [], [])
        # The new token's position; the chain's pass j runs at the j-th after it,
        # never at or past max_model_len.
        last = first_draft_pos + accepted - (0 if shift is None else shift[rows])
        chain_table = table[rows]
        max_last = int(plan.seq_lens[plan.rows].max(initial=1)) - 1  # all accepted, no shift
        for j in range(1, self.k if num_seqs else 0):
            pos, slots = self._within_model_len(table64, rows, last + j)
            passes.chain_positions.append(pos)
            passes.chain_metas.append(
                AttentionMetadata(
                    slot_mapping=slots,
                    block_table=chain_table,
                    seq_lens=(pos + 1).to(torch.int32),
                    query_start_loc=chain_query_start_loc,
                    max_query_len=1,
                    max_seq_len=min(max_last + j, self.max_model_len - 1) + 1,
                )
            )
        return passes

    def _plan(self, batch: TargetBatch, num_tokens: int) -> _DraftPlan:
        """The catch-up pass's layout: each request's scheduled tokens, then (a request
        that sampled) one more, so the pass has the same shape whatever the
        verification accepts; and the table that gives every position a slot."""
        rows = np.flatnonzero(batch.needs_sample)
        num_drafts = batch.num_draft_tokens
        if num_drafts is None:
            num_drafts = np.zeros(len(batch.needs_sample), dtype=np.int64)
        num_sched = np.diff(batch.query_start_loc).astype(np.int64)
        query_len = num_sched + batch.needs_sample
        cu_query = np.zeros(len(num_sched) + 1, dtype=np.int64)
        np.cumsum(query_len, out=cu_query[1:])
        offsets = np.arange(cu_query[-1]) - np.repeat(cu_query[:-1], query_len)
        # Each token's index in cat([input_ids, next_token_ids]): a request's scheduled
        # inputs, then (if it sampled) its new token.
        src = np.repeat(batch.query_start_loc[:-1].astype(np.int64), query_len) + offsets
        src[offsets == np.repeat(num_sched, query_len)] = num_tokens + np.arange(len(rows))
        num_computed = batch.num_computed.astype(np.int64)
        positions = np.repeat(num_computed, query_len) + offsets
        first_draft = num_sched[rows] - num_drafts[rows]  # offset of the first draft
        # Wide enough for the chain's last position if every draft is accepted.
        chain_end = num_computed[rows] + num_sched[rows] + self.k - 1
        table = self._block_table(batch, max(positions.max(initial=0), chain_end.max(initial=0)))
        return _DraftPlan(
            src=src,
            req_idx=np.repeat(np.arange(len(num_sched)), query_len),
            positions=positions,
            first_draft_idx=cu_query[rows] + first_draft,
            table=table,
            seq_lens=num_computed + query_len,
            query_start_loc=cu_query,
            max_query_len=int(query_len.max()),
            rows=rows,
            first_draft_pos=num_computed[rows] + first_draft,
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

    def _within_model_len(
        self, table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions clamped below ``max_model_len`` and their slots, -1 (no write) for
        those that were not: a position past the model's last belongs to no token that
        is ever read (a spare slot, or a chain pass after the request's end)."""
        beyond = positions >= self.max_model_len
        positions = positions.clamp(max=self.max_model_len - 1)
        slots = self._slots(table, rows, positions)
        return positions, torch.where(beyond, -1, slots)

    def _slots(
        self, table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Cache slot of each position, given the block-table row of each (on the
        device: the positions may depend on the verification)."""
        bs = self.block_size
        return table[rows, positions // bs] * bs + positions % bs
