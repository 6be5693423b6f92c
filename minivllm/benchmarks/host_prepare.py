"""``minivllm bench host``, second part: building one decode step's flat batch, with the
block table kept from step to step and rebuilt every step, side by side.

The demo model that ``bench host`` runs caps a sequence at 512 positions (32 blocks),
while the throughput workload's requests hold 35 to 130 blocks each; the block table's
cost grows with that width. So this part calls ``prepare_inputs`` directly, on decode
steps of synthetic requests of any length, alternating two block tables over the same
steps: the runner's persistent ``BlockTable``, and a fresh one per step, which writes every
row in full as the table built from scratch did before it.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Any

import torch

from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.worker.async_spec import PrevStep
from minivllm.worker.block_table import BlockTable
from minivllm.worker.input_batch import prepare_inputs

BLOCK_SIZE = 16


def decode_steps(batch: int, blocks: int, steps: int) -> list[SchedulerOutput]:
    """``steps`` consecutive decode steps of ``batch`` requests that start with ``blocks``
    blocks each and gain one token (and every 16 tokens one block) per step."""
    requests = [
        SimpleNamespace(request_id=f"req-{i}", all_token_ids=[7] * ((blocks - 1) * BLOCK_SIZE + 1))
        for i in range(batch)
    ]
    block_ids = [list(range(i * 4096, i * 4096 + blocks)) for i in range(batch)]
    out = []
    for _ in range(steps):
        step = SchedulerOutput(total_num_scheduled_tokens=batch)
        for r, ids in zip(requests, block_ids):
            computed = len(r.all_token_ids) - 1
            if computed // BLOCK_SIZE >= len(ids):  # the new token opens a block
                ids.append(ids[-1] + 1)
            step.scheduled.append(
                ScheduledRequest(r, 1, computed, list(ids), needs_sample=True)
            )
            r.all_token_ids = r.all_token_ids + [7]  # a new list: earlier steps keep theirs
        out.append(step)
    return out


def measure_prepare_inputs(batch: int, blocks: int, steps: int) -> dict[str, Any]:
    """Microseconds per ``prepare_inputs`` call, persistent block table vs rebuilt, on
    the CPU (the copies to a device are not part of it)."""
    device = torch.device("cpu")
    width = blocks + steps // BLOCK_SIZE + 1  # wide enough for the last step: no growth
    persistent = BlockTable(batch, width)
    times: dict[str, list[float]] = {"persistent": [], "rebuilt": []}
    for step in decode_steps(batch, blocks, steps):
        for name in ("persistent", "rebuilt"):
            table = persistent if name == "persistent" else BlockTable(batch, width)
            t0 = time.perf_counter()
            prepare_inputs(step, BLOCK_SIZE, device, PrevStep(), table)
            times[name].append(time.perf_counter() - t0)
    row: dict[str, Any] = {"batch": batch, "blocks_per_request": blocks, "steps": steps}
    for name, values in times.items():
        row[f"{name}_min_us"] = 1e6 * min(values)
        row[f"{name}_median_us"] = 1e6 * statistics.median(values)
    row["rebuilt_over_persistent_median"] = (
        row["rebuilt_median_us"] / row["persistent_median_us"]
    )
    return row
