"""Async scheduling on the worker's side: the step in flight's results, kept on the device
for the next step's inputs (its sampled tokens; with a draft model also its drafts and
the drafts it rejected).

Upstream counterparts: in ``vllm/v1/worker/gpu_model_runner.py``, ``_prepare_input_ids``
(the previous step's sampled and draft tokens copied into the next step's input ids on
the device) and the async speculative-decoding path of ``_update_states``
(``prev_num_draft_len``, ``valid_sampled_token_count``: ``num_computed_tokens`` and
positions corrected for the drafts the previous step rejected).

The scheduler builds step N+1 before step N's result reaches the host. A request that
step N sampled has placeholders in step N+1: its input token, and with a draft model
its drafts too (``core/sched_async_spec.py``). Their values are on the device: the
token step N sampled and the drafts the draft model proposed in step N. And the
scheduler counted all of step N's drafts as accepted, so the request's positions in
step N+1 are too high by the number step N rejected, which is also only on the device.
``PrevStep`` keeps those tensors from one step to the next; the model runner gathers
the tokens from it, subtracts the shift from positions and sequence lengths, and
recomputes the slots, all on the device: the host never waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.core.sched_async_spec import DRAFT_PLACEHOLDER
from minivllm.core.sched_output import ScheduledRequest
from minivllm.request import Request
from minivllm.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RequestAtRow
from minivllm.spec_decode.metadata import SpecDecodeMetadata
from minivllm.utils.torch_utils import copy_to_device


@dataclass
class PrevStep:
    """What the next step needs from this one, on the device (rows: this step's
    sampling requests, in batch order).

    Attributes:
        sampled: ``[S]`` the token each request gained last (-1: its row failed).
        rows: request id -> its row.
        drafts: ``[S, k]`` the draft model's proposals, or None (no draft model).
        num_rejected: ``[S]`` drafts each request rejected, or None (none verified).
        emitted: ``[S, w]`` each request's accepted drafts, its token, then
            ``PLACEHOLDER_TOKEN_ID`` (the rejection sampler's grid), or None (each
            request gained its sampled token only).
    """

    sampled: torch.Tensor | None = None
    rows: dict[str, int] = field(default_factory=dict)
    drafts: torch.Tensor | None = None
    num_rejected: torch.Tensor | None = None
    emitted: torch.Tensor | None = None

    @classmethod
    def after_step(
        cls,
        req_ids: list[str],
        sampled: torch.Tensor,
        drafts: torch.Tensor | None,
        emitted: torch.Tensor | None = None,
        num_accepted: torch.Tensor | None = None,
        num_draft_tokens: list[int] | None = None,
    ) -> PrevStep:
        """Keep a step's tensors; ``emitted``, ``num_accepted`` and (on the host)
        ``num_draft_tokens`` describe its verification, None when it verified nothing."""
        num_rejected = None
        if num_accepted is not None and num_draft_tokens is not None:
            verified = copy_to_device([np.asarray(num_draft_tokens)], np.int64, sampled.device)
            num_rejected = verified[0] - num_accepted
        rows = {rid: i for i, rid in enumerate(req_ids)}
        return cls(sampled, rows, drafts, num_rejected, emitted)

    def sources(
        self, placeholders: list[tuple[int, str]], num_drafts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each placeholder token (a request's input token in flight, then its
        ``num_drafts`` drafts in flight): its index in the flat batch, and its index in
        ``tokens()``."""
        missing = [rid for _, rid in placeholders if rid not in self.rows]
        if placeholders and (missing or self.sampled is None):
            raise RuntimeError(
                f"requests {missing} have an input token in flight, but the previous step "
                f"did not sample for them"
            )
        if placeholders and num_drafts.any() and self.drafts is None:
            raise RuntimeError("drafts in flight, but the previous step proposed none")
        width = 1 + (0 if self.drafts is None else self.drafts.shape[1])
        count = num_drafts + 1
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        start = np.fromiter((i for i, _ in placeholders), np.int64, len(placeholders))
        row = np.fromiter((self.rows[rid] for _, rid in placeholders), np.int64, len(start))
        return np.repeat(start, count) + within, np.repeat(row * width, count) + within

    def tokens(self) -> torch.Tensor:
        """Row-major ``[S * width]``: each request's sampled token, then its drafts."""
        assert self.sampled is not None
        if self.drafts is None:
            return self.sampled
        return torch.cat([self.sampled.unsqueeze(1), self.drafts], dim=1).flatten()

    def position_shift(
        self, placeholders: list[tuple[int, str]], batch_rows: list[int], num_reqs: int
    ) -> torch.Tensor | None:
        """``[num_reqs]`` int64 on the device: how far below the scheduler's count the
        tokens of each request of the next batch sit (the drafts this step rejected), or
        None (all zero)."""
        if self.num_rejected is None:
            return None
        prev_rows = [self.rows[rid] for _, rid in placeholders]
        device = self.num_rejected.device
        src, dst = copy_to_device([np.asarray(prev_rows), np.asarray(batch_rows)], np.int64, device)
        shift = torch.zeros(num_reqs, dtype=torch.int64, device=device)
        shift[dst] = self.num_rejected[src]
        return shift

    def sampled_rows(
        self, sampling: list[ScheduledRequest], in_flight_ids: list[str], with_drafts: bool
    ) -> list[RequestAtRow]:
        """The sampler's view of each sampled row: one per request, or (``with_drafts``)
        one per draft plus one, each seeing the drafts before it as generated
        (``RequestAtRow``, in ``SpecDecodeMetadata``'s order).

        A request whose input was in flight also sees the tokens it gained in the step
        in flight, and its drafts' values: only when its penalties or ``min_tokens``
        read them (``reads_output_tokens``), or, without drafts, when it is seeded (the
        sampler's one-pass kernel draws a seeded row's noise at its position, which
        counts them), since the values make the host wait for this step (after the next
        step's forward pass is queued, so the device stays busy). Other rows see token 0
        for each draft in flight: their own penalties and ``min_tokens`` read nothing,
        but a batch's penalty pass counts every row's tokens, so each must be a valid id.
        """
        in_flight = set(in_flight_ids)
        needs = [
            s
            for s in sampling
            if s.request_id in in_flight
            and (
                reads_output_tokens(s.request)
                or (not with_drafts and s.request.sampling_params.seed is not None)
            )
        ]
        gained, drafts = self._read_outputs(needs) if needs else ({}, {})
        rows = []
        for s in sampling:
            d = drafts.get(s.request_id, s.spec_token_ids) if with_drafts else []
            if d[:1] == [DRAFT_PLACEHOLDER]:
                d = [0] * len(d)
            before = gained.get(s.request_id, [])
            rows += [RequestAtRow(s.request, [*before, *d[:j]]) for j in range(len(d) + 1)]
        return rows

    def _read_outputs(
        self, requests: list[ScheduledRequest]
    ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """On the host (waits for this step): for each request, the tokens it gained in
        this step and the drafts it verifies next (a failed row's -1 reads as 0, as
        the next step feeds it)."""
        assert self.sampled is not None
        rows = [self.rows[s.request_id] for s in requests]
        if self.emitted is None:
            emitted = [[max(t, 0)] for t in self.sampled[rows].tolist()]
        else:
            grid = self.emitted[rows].tolist()
            emitted = [[max(t, 0) for t in row if t != PLACEHOLDER_TOKEN_ID] for row in grid]
        proposed = [[]] * len(rows) if self.drafts is None else self.drafts[rows].tolist()
        ids = [s.request_id for s in requests]
        drafts = {s.request_id: p[: len(s.spec_token_ids)] for s, p in zip(requests, proposed)}
        return dict(zip(ids, emitted)), drafts


def fill_drafts_in_flight(spec_metadata: SpecDecodeMetadata, input_ids: torch.Tensor) -> None:
    """Give the rejection sampler the drafts' values, which the host has only as
    placeholders: each draft sits in the flat batch right after the token whose row
    verifies it (the input ids, filled on the device)."""
    flat = spec_metadata.logits_indices[spec_metadata.target_logits_indices]
    drafts = input_ids[flat + 1]
    spec_metadata.draft_token_ids = drafts
    # The output grid's draft cells, laid out on the host from the placeholders.
    spec_metadata.draft_grid = torch.cat([drafts, drafts.new_full((1,), -1)])[
        spec_metadata.draft_index_grid
    ]


def reads_output_tokens(request: Request) -> bool:
    """Whether sampling for ``request`` reads its output tokens' values (penalties) or
    their number (``min_tokens`` not yet reached, as far as the host knows)."""
    params = request.sampling_params
    return (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
        or params.min_tokens > request.num_output_tokens
    )


def slots_on_device(
    block_table: torch.Tensor, req_idx: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Each token's KV slot from its position, computed where the positions are."""
    block = block_table[req_idx, positions // block_size].to(torch.int64)
    return block * block_size + positions % block_size
