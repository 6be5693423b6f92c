"""One CUDA graph for a draft model's whole proposal in a uniform verification step.

Upstream counterpart: the CUDA-graph dispatch of ``vllm/v1/spec_decode/llm_base_proposer.py``
(``SpecDecodeBaseProposer.propose`` replays a captured graph for each of the draft's
forward passes, its metadata prepared by a few fused kernels). minivllm goes one step
further for the step that matters at small batch: the whole proposal is one graph.

Why: a proposal of ``k`` drafts is the catch-up pass and ``k - 1`` chain passes, and
around each pass the positions, slots and sequence lengths are computed on the device
(they depend on how many drafts the verification accepted, which the host does not know
under async scheduling), its graph's static buffers are filled, and the argmax is taken.
Graph replays of the passes alone still leave some two hundred small operations per
step, each a few microseconds of Python and launch on the host; at batch 1, on an H200,
that host time was twice the GPU work of the whole speculative step, so the drafts cost
more than they saved. Here the host sends one page-locked copy of the step's layout, a
few device-to-device copies fill the inputs, and one replay runs everything:

* **catch-up**: each request's ``1 + k`` tokens (the token it sampled last step and its
  ``k`` drafts) and one more slot; the token sampled now takes the place of the first
  rejected draft (``1 + accepted``), exactly as ``DraftModelProposer._layout`` lays it
  out; draft 1 is the argmax at that place;
* **chain**: ``k - 1`` passes of one token per request at the positions after it.

A graph holds a *uniform* step: every request in it verified ``k`` drafts and samples
(the steady state of a batch of decoding requests). Any other step (a prefill chunk, a
request nearing ``max_model_len`` with fewer drafts, more requests than the largest
graph) takes ``DraftModelProposer``'s eager path, whose passes replay the draft's own
per-pass graphs. Both paths compute the same drafts: the tests run a proposal both ways.
Rows a graph is padded with read block 0 and write nowhere (slot -1).

``MINIVLLM_DRAFT_PROPOSAL_GRAPHS=0`` captures none (every proposal takes the eager path),
so ``python -m minivllm.benchmarks.spec_profile`` can time both in one run.
"""

from __future__ import annotations

import bisect
import logging
import os
from typing import Any

import numpy as np
import torch

from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.utils.math_utils import cdiv
from minivllm.utils.torch_utils import copy_to_device

logger = logging.getLogger(__name__)

PROPOSAL_GRAPHS_ENV = "MINIVLLM_DRAFT_PROPOSAL_GRAPHS"


def proposal_graphs_enabled() -> bool:
    """False under ``MINIVLLM_DRAFT_PROPOSAL_GRAPHS=0``: proposals run eagerly (their
    passes still replay the draft's per-pass graphs)."""
    return os.environ.get(PROPOSAL_GRAPHS_ENV, "1") != "0"


class DraftProposalGraphs:
    """Captured proposals, one per batch size, of a ``DraftModelProposer``.

    Args:
        proposer: The proposer (its model bound to the draft's KV cache, its pool size
            set with ``set_num_blocks``).
        capture_sizes: Batch sizes (requests) to capture, ascending.
        pool: A CUDA graph memory pool to share (the draft's per-pass graphs'), or None.
    """

    def __init__(self, proposer: Any, capture_sizes: list[int], pool: Any = None) -> None:
        self.proposer = proposer
        self.capture_sizes = list(capture_sizes)
        self.pool = pool
        k, device = proposer.k, proposer.device
        n = self.capture_sizes[-1]
        # Wide enough for every position a uniform step reaches: the catch-up's and the
        # chain's, up to k + 1 past max_model_len before clamping.
        self.width = cdiv(proposer.max_model_len + 2 * k + 2, proposer.block_size)
        i64 = dict(dtype=torch.long, device=device)
        # The step's layout from the host, one buffer: num_computed | valid | table.
        self.host_layout = torch.zeros(n * (2 + self.width), **i64)
        self.input_ids = torch.zeros(n * (k + 1), **i64)
        self.next_ids = torch.zeros(n, **i64)
        self.accepted = torch.zeros(n, **i64)
        self.shift = torch.zeros(n, **i64)
        self.drafts = torch.zeros(n, k, **i64)
        q = k + 2  # catch-up tokens per request
        i32 = dict(dtype=torch.int32, device=device)
        self._offsets = torch.arange(q, **i64)
        self._rows = torch.arange(n, **i64)
        self._row_start = self._rows * q
        self._query_start_q = torch.arange(n + 1, **i32) * q
        self._query_start_1 = torch.arange(n + 1, **i32)
        self.graphs: dict[int, Any] = {}
        # Tests read it: how many proposals replayed a graph.
        self.num_replays = 0

    # ---- when a step fits ------------------------------------------------------------

    def padded_size(self, batch: Any, num_tokens: int) -> int | None:
        """The captured size this step's proposal replays at, or None (eager): every
        request samples and verified exactly ``k`` drafts, and the batch fits a graph."""
        k = self.proposer.k
        num_reqs = len(batch.needs_sample)
        if (
            num_reqs == 0
            or batch.num_draft_tokens is None
            or num_tokens != num_reqs * (k + 1)
            or not batch.needs_sample.all()
            or not (batch.num_draft_tokens == k).all()
            or not (np.diff(batch.query_start_loc) == k + 1).all()
            or batch.block_table.shape[1] > self.width
        ):
            return None
        i = bisect.bisect_left(self.capture_sizes, num_reqs)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    # ---- one replay ------------------------------------------------------------------

    def run(
        self,
        size: int,
        batch: Any,
        input_ids: torch.Tensor,
        next_token_ids: torch.Tensor,
        num_accepted: torch.Tensor,
    ) -> torch.Tensor:
        """Fill the static inputs for a step ``padded_size`` accepted and replay its
        graph; returns ``[num_reqs, k]`` drafts (a copy: the next replay overwrites the
        buffer while this step's drafts may still be read)."""
        num_reqs = len(batch.needs_sample)
        layout = self._host_layout(size, batch)
        self.host_layout[: layout.size].copy_(
            copy_to_device([layout], np.int64, self.proposer.device)[0], non_blocking=True
        )
        self.input_ids[: input_ids.shape[0]].copy_(input_ids, non_blocking=True)
        self.next_ids[:num_reqs].copy_(next_token_ids, non_blocking=True)
        self.accepted[:num_reqs].copy_(num_accepted, non_blocking=True)
        if batch.position_shift is None:
            self.shift[:num_reqs].zero_()
        else:
            self.shift[:num_reqs].copy_(batch.position_shift, non_blocking=True)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.drafts[:num_reqs].clone()

    def _host_layout(self, size: int, batch: Any) -> np.ndarray:
        """num_computed, valid and the block table (the target's, each row continued by
        its scratch blocks, as the eager path builds it) of ``size`` rows, flat."""
        p, num_reqs = self.proposer, len(batch.needs_sample)
        layout = np.zeros(size * (2 + self.width), dtype=np.int64)
        layout[:num_reqs] = batch.num_computed
        layout[size : size + num_reqs] = 1
        table = p._block_table(batch, self.width * p.block_size - 1)
        layout[2 * size :].reshape(size, self.width)[:num_reqs] = table
        return layout

    # ---- the captured computation ----------------------------------------------------

    def _views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """num_computed, valid and the block table of ``size`` rows, views of the layout
        buffer."""
        n = size
        num_computed = self.host_layout[:n]
        valid = self.host_layout[n : 2 * n].bool()
        table = self.host_layout[2 * n : n * (2 + self.width)].view(n, self.width)
        return num_computed, valid, table

    def propose(self, size: int) -> None:
        """The proposal of ``size`` rows over the static buffers (what a graph records;
        on the CPU, tests call it as the replay)."""
        p, k, q = self.proposer, self.proposer.k, self.proposer.k + 2
        num_computed, valid, table = self._views(size)
        table32 = table.to(torch.int32)
        # Padded rows hold stale inputs from earlier steps: they start at position 0.
        computed = torch.where(valid, num_computed - self.shift[:size], 0)
        accepted = self.accepted[:size]
        next_ids = self.next_ids[:size].clamp(min=0)
        # Catch-up: the 1 + k scheduled tokens, then the spare slot; the new token goes
        # where the first rejected draft stood (the spare slot when all were accepted).
        tokens = torch.cat(
            [self.input_ids[: size * (k + 1)].view(size, k + 1), next_ids[:, None]], 1
        )
        column = 1 + accepted
        tokens.scatter_(1, column[:, None], next_ids[:, None])
        positions = computed[:, None] + self._offsets
        positions, slots = self._place(table, valid[:, None], positions)
        meta = AttentionMetadata(
            slot_mapping=slots.view(-1),
            block_table=table32,
            seq_lens=(computed + q).to(torch.int32),
            query_start_loc=self._query_start_q[: size + 1],
            max_query_len=q,
            max_seq_len=p.max_model_len,
        )
        with set_forward_context(meta):
            hidden = p.model(tokens.view(-1), positions.view(-1))
        draft = p.model.compute_logits(hidden[self._row_start[:size] + column]).argmax(dim=-1)
        self.drafts[:size, 0] = draft
        last = computed + column  # the new token's position
        for j in range(1, k):
            positions, slots = self._place(table, valid, last + j)
            meta = AttentionMetadata(
                slot_mapping=slots,
                block_table=table32,
                seq_lens=(positions + 1).to(torch.int32),
                query_start_loc=self._query_start_1[: size + 1],
                max_query_len=1,
                max_seq_len=p.max_model_len,
            )
            with set_forward_context(meta):
                hidden = p.model(draft, positions)
            draft = p.model.compute_logits(hidden).argmax(dim=-1)
            self.drafts[:size, j] = draft

    def _place(
        self, table: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions clamped below ``max_model_len`` and their cache slots
        (``DraftModelProposer._within_model_len``), and slot -1 on padded rows too."""
        rows = self._rows[: table.shape[0]]
        if positions.dim() == 2:
            rows = rows[:, None]
        positions, slots = self.proposer._within_model_len(table, rows, positions)
        return positions, torch.where(valid, slots, -1)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per size, largest first, over a harmless layout (every row
        padding: nothing is written)."""
        self.host_layout.zero_()
        for size in reversed(self.capture_sizes):
            self.propose(size)  # warm-up: compiles kernels, settles allocations
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.propose(size)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured the draft's whole proposal for batch sizes %s", self.capture_sizes)

