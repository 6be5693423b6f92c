"""``prepare_inputs``'s cut of a mixed step (``AttentionMetadata.decode_split``): the
leading decodes and the prompt chunks after them, as two batches over the same tensors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.forward_context import DecodeSplit
from minivllm.worker.async_spec import PrevStep
from minivllm.worker.block_table import BlockTable
from minivllm.worker.input_batch import launch_order, leading_decodes, prepare_inputs

BLOCK_SIZE = 4
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("num_new", "expected"),
    [([1, 1, 5, 3], 2), ([1, 1, 1], 0), ([6, 1, 1], 0), ([1], 0), ([1, 2], 1), ([], 0)],
)
def test_leading_decodes_counts_one_token_queries_before_the_first_longer_one(num_new, expected):
    assert leading_decodes(np.asarray(num_new, dtype=np.int64)) == expected


def _step(layout: list[tuple[int, int]]) -> SchedulerOutput:
    """A step of requests ``(cached tokens, new tokens)``, in batch order."""
    step = SchedulerOutput(total_num_scheduled_tokens=sum(n for _, n in layout))
    for i, (cached, new) in enumerate(layout):
        total = cached + new
        request = SimpleNamespace(request_id=f"req-{i}", all_token_ids=list(range(total)))
        blocks = list(range(100 * i, 100 * i + -(-total // BLOCK_SIZE)))
        step.scheduled.append(ScheduledRequest(request, new, cached, blocks, needs_sample=True))
    return step


def _prepare(layout: list[tuple[int, int]]):
    step = _step(layout)
    tables = BlockTable(len(layout), max(len(s.block_ids) for s in step.scheduled))
    return prepare_inputs(step, BLOCK_SIZE, CPU, PrevStep(), tables).attn_metadata


def test_a_mixed_step_is_cut_after_its_decodes():
    meta = _prepare([(9, 1), (20, 1), (0, 5), (6, 3)])
    split = meta.decode_split
    assert isinstance(split, DecodeSplit) and split.num_decodes == 2
    dec, pre = split.decodes, split.prefills
    assert (dec.max_query_len, dec.max_seq_len) == (1, 21)
    assert (pre.max_query_len, pre.max_seq_len) == (5, 9)
    assert dec.query_start_loc.tolist() == [0, 1, 2]
    # The chunks' offsets count from their own first token.
    assert pre.query_start_loc.tolist() == [0, 5, 8]
    assert dec.seq_lens.tolist() == [10, 21] and pre.seq_lens.tolist() == [5, 9]
    assert torch.equal(dec.block_table, meta.block_table[:2])
    assert torch.equal(pre.block_table, meta.block_table[2:])
    assert torch.equal(pre.slot_mapping, meta.slot_mapping[2:])
    # Views of the full batch's lengths: a correction made in place there holds here.
    meta.seq_lens[0] -= 1
    assert dec.seq_lens[0].item() == 9
    # The decodes half is a decode batch: it runs in its own launch order.
    assert dec.seq_order.tolist() == [1, 0]
    assert pre.seq_order is None


@pytest.mark.parametrize(
    "layout",
    [
        [(9, 1), (20, 1)],  # a decode step
        [(0, 5), (6, 3)],  # prompt chunks only
        [(0, 5), (9, 1)],  # a chunk first: no leading decodes to cut off
    ],
)
def test_other_steps_are_not_cut(layout):
    assert _prepare(layout).decode_split is None


def test_the_cut_is_checked():
    meta = _prepare([(9, 1), (0, 5)])
    for n in (0, 2):
        with pytest.raises(ValueError, match="num_decodes must be in 1..1"):
            DecodeSplit.of(meta, n, meta.query_start_loc, 1, 1)
    with pytest.raises(ValueError, match="prefill_query_start_loc must have shape"):
        DecodeSplit.of(meta, 1, meta.query_start_loc, 1, 1)


def test_decodes_carry_their_launch_order_from_the_host():
    """A decode step, and a mixed step's decodes, bring their longest-first order in the
    step's copy (int64, as the device sort gave it); prompt chunks have none."""
    meta = _prepare([(9, 1), (30, 1), (4, 1), (30, 1)])
    assert meta.launch_order is not None and meta.launch_order.dtype == torch.int64
    assert meta.seq_order is meta.launch_order
    assert meta.launch_order.tolist() == [1, 3, 0, 2]  # ties keep batch order
    mixed = _prepare([(9, 1), (20, 1), (0, 5)])
    assert mixed.launch_order is None and mixed.seq_order is None
    assert mixed.decode_split.decodes.seq_order.tolist() == [1, 0]
    assert mixed.decode_split.prefills.seq_order is None
    assert _prepare([(0, 6), (3, 4)]).launch_order is None


def test_launch_order_is_the_device_sort_up_to_ties():
    lens = np.array([5, 900, 17, 900, 1, 64], dtype=np.int32)
    order = launch_order(lens)
    assert order.dtype == np.int64
    device = torch.argsort(torch.from_numpy(lens), descending=True)
    assert torch.equal(torch.from_numpy(lens[order]), torch.from_numpy(lens)[device])


def _prepare_inputs(layout: list[tuple[int, int]], needs_sample: list[bool] | None = None):
    step = _step(layout)
    for s, sample in zip(step.scheduled, needs_sample or [True] * len(layout)):
        s.needs_sample = sample
    tables = BlockTable(len(layout), max(len(s.block_ids) for s in step.scheduled))
    return prepare_inputs(step, BLOCK_SIZE, CPU, PrevStep(), tables)


def test_a_decode_step_reads_its_logits_rows_without_a_gather():
    inputs = _prepare_inputs([(9, 1), (20, 1), (3, 1)])
    assert inputs.logits_rows == 3
    # The rows it names are exactly the ones the gather would pick.
    assert inputs.logits_indices.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("layout", "needs_sample"),
    [
        ([(9, 1), (0, 5)], None),  # a prompt chunk: its last token samples, not its first
        ([(9, 1), (20, 1)], [True, False]),  # a request that does not sample this step
    ],
)
def test_other_steps_gather_their_logits_rows(layout, needs_sample):
    inputs = _prepare_inputs(layout, needs_sample)
    assert inputs.logits_rows is None
    last_tokens = np.cumsum([n for _, n in layout]) - 1
    sampled = needs_sample or [True] * len(layout)
    assert inputs.logits_indices.tolist() == [
        int(t) for t, keep in zip(last_tokens, sampled, strict=True) if keep
    ]
