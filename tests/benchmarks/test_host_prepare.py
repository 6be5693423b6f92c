"""``bench host``'s prepare_inputs part: its synthetic decode steps are valid, and the two
block tables it times build the same inputs."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.benchmarks.host_prepare import BLOCK_SIZE, decode_steps
from minivllm.worker.async_spec import PrevStep
from minivllm.worker.block_table import BlockTable
from minivllm.worker.input_batch import prepare_inputs


def test_kept_and_rebuilt_tables_build_the_same_inputs() -> None:
    batch, blocks, steps = 3, 2, 40  # 40 steps: every request opens new blocks
    kept = BlockTable(batch, blocks)
    cpu = torch.device("cpu")
    for step in decode_steps(batch, blocks, steps):
        a = prepare_inputs(step, BLOCK_SIZE, cpu, PrevStep(), kept)
        b = prepare_inputs(step, BLOCK_SIZE, cpu, PrevStep(), BlockTable(batch, blocks))
        for name in ("block_table", "slot_mapping", "seq_lens"):
            assert torch.equal(getattr(a.attn_metadata, name), getattr(b.attn_metadata, name))
        assert torch.equal(a.positions, b.positions)
        # Each request's newest token lands in its own last block.
        last = np.asarray([s.block_ids[-1] for s in step.scheduled])
        assert (a.attn_metadata.slot_mapping.numpy() // BLOCK_SIZE == last).all()
    assert len(step.scheduled[0].block_ids) > blocks


def test_bench_host_refuses_bad_sizes_before_building_anything(capsys) -> None:
    from minivllm.cli import main

    for flags, message in (
        (["--prepare-batch", "0"], "--prepare-batch must be >= 1"),
        (["--prepare-blocks", "4", "0"], "--prepare-blocks must all be >= 1"),
        (["--steps", "0"], "--steps must be >= 1"),
    ):
        assert main(["bench", "host", *flags]) == 2
        assert message in capsys.readouterr().err
