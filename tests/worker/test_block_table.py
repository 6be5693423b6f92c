"""BlockTable: the rows kept across steps always equal the table rebuilt from scratch
(every scheduled request's block list, zero-padded), through appends, new requests,
preemption and re-admission, finished requests, reused ids and growth."""

from __future__ import annotations

import random

import numpy as np

from minivllm.core.sched_output import ScheduledRequest
from minivllm.worker.block_table import BlockTable


def _scheduled(req_id: str, block_ids: list[int], is_new: bool = False) -> ScheduledRequest:
    request = type("R", (), {"request_id": req_id})()
    return ScheduledRequest(request, 1, 0, block_ids, is_new=is_new)


def _rebuilt(scheduled: list[ScheduledRequest]) -> np.ndarray:
    """The table as prepare_inputs built it before: one zero-padded row per request."""
    width = max(len(s.block_ids) for s in scheduled)
    table = np.zeros((len(scheduled), width), np.int32)
    for i, s in enumerate(scheduled):
        table[i, : len(s.block_ids)] = s.block_ids
    return table


def test_rows_match_a_rebuilt_table_through_a_random_run() -> None:
    rng = random.Random(0)
    # Deliberately small: the run must grow both the rows and the columns.
    tables = BlockTable(max_num_reqs=2, max_blocks_per_req=2)
    live: dict[str, list[int]] = {}  # running requests and their block lists
    next_block, next_id = 0, 0
    for _ in range(300):
        finished, preempted, readmitted = [], [], set()
        for rid in list(live):
            roll = rng.random()
            if roll < 0.08:
                finished.append(rid)
                del live[rid]
            elif roll < 0.14:  # preempted: blocks freed, admitted again with fresh ones
                preempted.append(rid)
                live[rid] = list(range(next_block, next_block + rng.randint(1, 3)))
                next_block += len(live[rid])
                readmitted.add(rid)
            elif roll < 0.5:  # a running request appends
                live[rid].extend(range(next_block, next_block + rng.randint(1, 2)))
                next_block += 2
        for _ in range(rng.randint(0, 3)):
            # A fresh request; one id in ten reuses a finished request's id.
            rid = rng.choice(finished) if finished and rng.random() < 0.1 else f"r{next_id}"
            next_id += 1
            if rid in live:
                continue
            live[rid] = list(range(next_block, next_block + rng.randint(1, 12)))
            next_block += 12
            readmitted.add(rid)
        tables.free(finished)
        tables.free(preempted)
        if not live:
            continue
        order = list(live)
        rng.shuffle(order)  # batch order changes from step to step
        scheduled = [_scheduled(r, live[r], is_new=r in readmitted) for r in order]
        table, num_blocks = tables.gather(tables.update(scheduled))
        np.testing.assert_array_equal(table, _rebuilt(scheduled))
        assert num_blocks.tolist() == [len(live[r]) for r in order]
    assert tables.table.shape[0] > 2 and tables.table.shape[1] > 2


def test_a_reused_row_is_zero_past_its_new_blocks() -> None:
    tables = BlockTable(max_num_reqs=1, max_blocks_per_req=4)
    tables.update([_scheduled("a", [7, 8, 9, 10], is_new=True)])
    tables.free(["a"])
    rows = tables.update([_scheduled("b", [3], is_new=True)])
    assert tables.table[rows[0]].tolist() == [3, 0, 0, 0]
    # A running request writes only its new ids: the row it holds is not rewritten.
    tables.table[rows[0], 0] = 99
    tables.update([_scheduled("b", [3, 4])])
    assert tables.table[rows[0]].tolist() == [99, 4, 0, 0]


def test_a_request_admitted_again_gets_its_row_rewritten_even_unfreed() -> None:
    """is_new means a fresh block list, whether or not the row was given back first."""
    tables = BlockTable(max_num_reqs=2, max_blocks_per_req=3)
    (row,) = tables.update([_scheduled("a", [1, 2], is_new=True)])
    assert tables.update([_scheduled("a", [5, 6, 7], is_new=True)]) == [row]
    assert tables.table[row].tolist() == [5, 6, 7]
    # As many blocks as before, other ids: the unchanged count is no reason to skip it.
    assert tables.update([_scheduled("a", [8, 9, 4], is_new=True)]) == [row]
    assert tables.table[row].tolist() == [8, 9, 4]
    # Running, no new block: the row stays as it is.
    assert tables.update([_scheduled("a", [8, 9, 4])]) == [row]
    assert tables.table[row].tolist() == [8, 9, 4]
