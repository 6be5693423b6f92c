"""The flat batch of one step: every scheduled token end to end, with its position, its
KV cache slot and its sequence.

Upstream counterpart: Model Runner V2's ``vllm/v1/worker/gpu/input_batch.py``
(``InputBatch``, and the runner's ``prepare_inputs``); the V1 runner builds it in
``GPUModelRunner._prepare_inputs`` (``vllm/v1/worker/gpu_model_runner.py``). minivllm
rebuilds it from the scheduler's requests every step instead of updating a persistent
batch, so the construction is one function of the step's ``SchedulerOutput``; the one
exception is the block table, which keeps each request's row across steps
(``worker/block_table.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.core.sched_output import SchedulerOutput
from minivllm.forward_context import AttentionMetadata, DecodeSplit
from minivllm.spec_decode.draft_model import TargetBatch
from minivllm.spec_decode.metadata import SpecDecodeMetadata
from minivllm.utils.torch_utils import copy_arrays_to_device, copy_to_device
from minivllm.worker.async_spec import PrevStep, fill_drafts_in_flight, slots_on_device
from minivllm.worker.block_table import BlockTable


@dataclass
class ModelInputs:
    """The flat batch of one step, on the device."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    # Index (into the flat token axis) of each sampling request's last token.
    logits_indices: torch.Tensor
    # Set when those indices are 0 .. n-1 (a decode step: one token per request, every
    # request sampling): the LM head then reads the first n rows, no gather launched.
    logits_rows: int | None = None
    # Requests whose last input token is a placeholder for the step still in flight.
    placeholder_req_ids: list[str] = field(default_factory=list)
    # Where the drafts and the rows that verify them are, when any request has drafts.
    spec_decode_metadata: SpecDecodeMetadata | None = None
    # The host-side layout, for a draft model's catch-up pass.
    batch: TargetBatch | None = None


def prepare_inputs(
    scheduler_output: SchedulerOutput,
    block_size: int,
    device: torch.device,
    prev: PrevStep,
    block_tables: BlockTable,
) -> ModelInputs:
    """Lay every scheduled token end to end and compute its slot and sequence.

    Only the per-request facts are gathered in Python; everything per token is one
    vectorized numpy expression, since a decode step of 256 requests must cost
    microseconds here, not milliseconds. Everything then travels to the device in
    one copy (int64 and int32 arrays side by side) that never makes the host wait.

    ``prev`` is the step still in flight under async scheduling (its sampled tokens and
    drafts stay on the device; the placeholders read them from there). ``block_tables``
    keeps every live request's block ids from step to step (the runner's; freed rows
    are given back before this is called), so only new blocks are written here.
    """
    bs = block_size
    scheduled = scheduler_output.scheduled
    num_reqs = len(scheduled)
    # One pass over the requests gathers every per-request fact (rather than a
    # generator pass per fact, each walking all the requests again); numpy takes over
    # from there.
    counts: list[int] = []
    computed: list[int] = []
    samples: list[bool] = []
    draft_counts: list[int] = []
    tokens: list[int] = []
    placeholders: list[tuple[int, str]] = []  # (flat index, request id)
    in_flight_rows: list[int] = []  # batch rows of those requests
    for i, s in enumerate(scheduled):
        counts.append(s.num_scheduled_tokens)
        computed.append(s.num_computed_tokens)
        samples.append(s.needs_sample)
        draft_counts.append(len(s.spec_token_ids))
        known = s.token_ids
        if len(known) < s.num_scheduled_tokens:
            # Async scheduling: the first input is the token the step in flight
            # samples (with a draft model, the drafts after it are in flight too).
            placeholders.append((len(tokens), s.request.request_id))
            in_flight_rows.append(i)
            tokens.append(0)
        tokens += known
    num_new = np.array(counts, np.int64)
    starts = np.array(computed, np.int64)
    needs_sample = np.array(samples, bool)
    num_drafts = np.array(draft_counts, np.int64)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(num_new, out=query_start_loc[1:])
    seq_lens = (starts + num_new).astype(np.int32)
    block_table, num_blocks = block_tables.gather(block_tables.update(scheduled))
    # Which request each token belongs to, and its position within the sequence.
    req_idx = np.repeat(np.arange(num_reqs), num_new)
    positions = np.arange(len(tokens)) - np.repeat(query_start_loc[:-1], num_new)
    positions += np.repeat(starts, num_new)
    # Address translation, host side: position -> (block id, offset) -> slot.
    slot_mapping = block_table[req_idx, positions // bs].astype(np.int64) * bs + positions % bs
    logits_indices = query_start_loc[1:][needs_sample].astype(np.int64) - 1
    spec_metadata = None
    if num_drafts[needs_sample].any():
        drafts = [s.spec_token_ids for s in scheduled if s.needs_sample]
        # Each sampling request's last len(drafts) + 1 tokens are its sampled rows.
        spec_metadata = SpecDecodeMetadata.from_draft_token_ids(
            drafts, device, query_start_loc[1:][needs_sample]
        )
    fill_dst, fill_src = prev.sources(placeholders, num_drafts[in_flight_rows])
    num_decodes = leading_decodes(num_new)
    max_query_len = int(num_new.max())
    # A mixed step's prompt chunks are attended apart from its decodes: their offsets,
    # counted from the first chunk token, ride along in the one copy.
    split_qsl = [query_start_loc[num_decodes:] - num_decodes] if num_decodes else []
    # The decodes' launch order (longest context first), sorted here rather than by a
    # kernel in every step: the lengths are on the host already.
    num_ordered = num_reqs if max_query_len == 1 else num_decodes
    order = [launch_order(seq_lens[:num_ordered])] if num_ordered else []
    on_device = copy_arrays_to_device(
        [
            np.asarray(tokens, np.int64),
            positions,
            slot_mapping,
            logits_indices,
            fill_dst,
            fill_src,
            block_table,
            seq_lens,
            query_start_loc,
            *order,
            *split_qsl,
        ],
        [np.int64] * 6 + [np.int32] * 3 + [np.int64] * len(order) + [np.int32] * len(split_qsl),
        device,
    )
    input_ids, positions_d, slots, logits_idx, dst, src, table, seq_lens_d, qsl = on_device[:9]
    order_d, prefill_qsl = on_device[9 : 9 + len(order)], on_device[9 + len(order) :]
    shift = None
    if placeholders:
        # Queued behind the previous step on the same stream: it reads the ids
        # after they are written, and the host never waits for them.
        input_ids[dst] = prev.tokens()[src]
        shift = prev.position_shift(placeholders, in_flight_rows, num_reqs)
    if shift is not None:
        # Drafts of the step in flight that it rejects: the scheduler counted them
        # as computed, so these requests' tokens sit lower by as many positions.
        req_idx_d = copy_to_device([req_idx], np.int64, device)[0]
        positions_d -= shift[req_idx_d]
        seq_lens_d -= shift.to(torch.int32)
        slots = slots_on_device(table, req_idx_d, positions_d, bs)
    if spec_metadata is not None and placeholders:
        fill_drafts_in_flight(spec_metadata, input_ids)
    attn_metadata = AttentionMetadata(
        slot_mapping=slots,
        block_table=table,
        seq_lens=seq_lens_d,
        query_start_loc=qsl,
        max_query_len=max_query_len,
        max_seq_len=int(seq_lens.max()),
        launch_order=order_d[0] if order_d and not num_decodes else None,
    )
    if num_decodes:
        attn_metadata.decode_split = DecodeSplit.of(
            attn_metadata, num_decodes, prefill_qsl[0],
            int(seq_lens[:num_decodes].max()), int(seq_lens[num_decodes:].max()), order_d[0],
        )  # fmt: skip
    every_token_samples = len(tokens) == num_reqs and len(logits_indices) == num_reqs
    return ModelInputs(
        input_ids=input_ids,
        positions=positions_d,
        attn_metadata=attn_metadata,
        logits_indices=logits_idx if spec_metadata is None else spec_metadata.logits_indices,
        logits_rows=num_reqs if every_token_samples and spec_metadata is None else None,
        placeholder_req_ids=[rid for _, rid in placeholders],
        spec_decode_metadata=spec_metadata,
        batch=TargetBatch(
            query_start_loc, starts, block_table, num_blocks, needs_sample, num_drafts, shift
        ),
    )


def launch_order(seq_lens: np.ndarray) -> np.ndarray:
    """Sequence indices, longest context first (int64: the dtype of the attention
    kernel's compiled ``seq_order`` argument, whichever side sorts)."""
    return np.argsort(-seq_lens.astype(np.int64), kind="stable")


def leading_decodes(num_new: np.ndarray) -> int:
    """How many sequences at the head of a mixed batch have a one-token query (the
    decodes the scheduler lists first), or 0 when the batch is not mixed: all one-token
    queries (a decode step) or none leading (nothing to split off)."""
    longer = np.flatnonzero(num_new != 1)
    return 0 if len(longer) == 0 else int(longer[0])
