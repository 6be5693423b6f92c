"""The block table kept from step to step: one row of block ids per live request.

Upstream counterpart: ``BlockTable`` in ``vllm/v1/worker/block_table.py`` (and Model Runner
V2's ``vllm/v1/worker/gpu/block_table.py``), which the persistent batch updates with each
step's new blocks instead of rebuilding. minivllm first rebuilt the table every step from
every request's block list: at 256 running requests of ~70 blocks each, one Python list
converted into a numpy row per request, every step, for rows that had gained at most one
block since the step before (Benchmarks, eighth round, measures the difference).

Here each request keeps its row while it lives. A step writes only what changed: the ids
a running request appended (the KV cache manager only ever appends to a running request's
list) or a whole row when the request was (re)admitted from the waiting queue, whose old
blocks were freed. The step's table is then one gather of the scheduled rows. It is the
same rule the tensor-parallel step message uses to send block ids as differences
(``core/step_message.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from minivllm.core.sched_output import ScheduledRequest


class BlockTable:
    """Block ids of every live request, one row each, in a numpy array that grows as needed.

    Args:
        max_num_reqs: Rows to start with (the scheduler's ``max_num_seqs``).
        max_blocks_per_req: Columns to start with (blocks of a ``max_model_len`` request).
    """

    def __init__(self, max_num_reqs: int, max_blocks_per_req: int) -> None:
        self.table = np.zeros((max(1, max_num_reqs), max(1, max_blocks_per_req)), np.int32)
        # Ids written per row: a Python list, read once per request per step.
        self.num_blocks = [0] * self.table.shape[0]
        self.rows: dict[str, int] = {}
        self._free_rows = list(range(self.table.shape[0] - 1, -1, -1))

    def free(self, req_ids: Iterable[str]) -> None:
        """Give up the rows of requests that finished or were preempted."""
        for req_id in req_ids:
            row = self.rows.pop(req_id, None)
            if row is not None:
                self._free_rows.append(row)

    def update(self, scheduled: Sequence[ScheduledRequest]) -> list[int]:
        """Bring the scheduled requests' rows up to their block lists; return each one's
        row, in batch order."""
        rows = []
        num_blocks = self.num_blocks
        for s in scheduled:
            rid, ids = s.request.request_id, s.block_ids
            row, n = self.rows.get(rid), len(ids)
            if row is not None and n == num_blocks[row] and not s.is_new:
                # Most steps: a running request that gained no block (a block holds
                # block_size tokens, a decode step adds one).
                rows.append(row)
                continue
            fresh = row is None
            if fresh:
                row = self.rows[rid] = self._new_row()
            old = num_blocks[row]
            # A row is rewritten for a new occupant, and for a request admitted from the
            # waiting queue (after a preemption its old blocks were freed); a running
            # request only ever appends (a shorter list never happens; rewrite it too).
            rewrite = fresh or s.is_new or n < old
            start = 0 if rewrite else old
            if n > self.table.shape[1]:
                self._grow(cols=n)
            if rewrite and old > n:
                self.table[row, n:old] = 0  # as zero-padded as a fresh row
            if n > start:
                self.table[row, start:n] = ids[start:]
            num_blocks[row] = n
            rows.append(row)
        return rows

    def gather(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The step's ``[len(rows), widest]`` table (a copy) and its block counts."""
        num_blocks = np.array(self.num_blocks, np.int64)[rows]
        width = int(num_blocks.max()) if rows else 0
        return self.table[rows, :width], num_blocks

    def _new_row(self) -> int:
        if not self._free_rows:
            self._grow(rows=2 * self.table.shape[0])
        return self._free_rows.pop()

    def _grow(self, rows: int = 0, cols: int = 0) -> None:
        old_rows, old_cols = self.table.shape
        new_rows, new_cols = max(rows, old_rows), max(cols, old_cols)
        table = np.zeros((new_rows, new_cols), np.int32)
        table[:old_rows, :old_cols] = self.table
        self.table = table
        self.num_blocks.extend([0] * (new_rows - old_rows))
        self._free_rows.extend(range(new_rows - 1, old_rows - 1, -1))
