"""Speculative decoding's bookkeeping in the scheduler: drafts in, verified tokens out.

Upstream counterpart: the speculative-decoding parts of ``Scheduler`` in
``vllm/v1/core/sched/scheduler.py`` (``update_draft_token_ids``, the draft slots in
``schedule`` and the roll-back of rejected drafts in ``update_from_output``).

A request's drafts live in ``Request.spec_token_ids`` between two steps. The scheduler
keeps at most ``k`` of them (``drafts_to_keep``), schedules the ones that fit after the
request's known tokens (``take_drafts``), checks how many the rejection sampler accepted
(``check_num_accepted``), and gives the request the accepted ones plus the sampled token
(``verified_tokens``). These functions hold no state; the ``Scheduler`` calls them.
"""

from __future__ import annotations

from collections.abc import Sequence

from minivllm.core.sched_output import ScheduledRequest
from minivllm.request import Request, RequestStatus
from minivllm.spec_decode.metrics import SpecDecodingStats


def drafts_to_keep(
    request: Request, drafts: Sequence[int], num_speculative_tokens: int
) -> list[int]:
    """The drafts a running request keeps for its next step.

    At most ``num_speculative_tokens``, and never more than it could still emit: a step
    emits its accepted drafts plus one token, so with ``r`` tokens left before
    ``max_tokens`` only ``r - 1`` drafts can matter. That cap also keeps a request within
    the blocks ``Scheduler.add_request`` checked the pool has for it.
    """
    left = max(0, request.max_tokens - request.num_output_tokens - 1)
    return list(drafts[: min(num_speculative_tokens, left)])


def take_drafts(request: Request, num_new: int) -> list[int]:
    """The drafts that fit in this step's ``num_new`` tokens; the request keeps none.

    The budget or ``max_model_len`` may have cut the tail of the drafts; each step's
    drafts are proposed afresh, so the request's list is emptied either way.
    """
    drafts = request.spec_token_ids
    if not drafts:
        return drafts
    request.spec_token_ids = []
    num_known = request.num_tokens + request.num_output_placeholders
    return drafts[: max(0, request.num_computed_tokens + num_new - num_known)]


def check_num_accepted(
    due: list[ScheduledRequest], num_accepted_tokens: Sequence[int] | None
) -> Sequence[int]:
    """Accepted-draft counts aligned with ``due``, checked before anything changes.

    Raises:
        ValueError: A request was scheduled with drafts but no counts were given, the
            counts do not align with ``due``, or a count exceeds the request's drafts.
    """
    if num_accepted_tokens is None:
        with_drafts = [s.request_id for s in due if s.spec_token_ids]
        if with_drafts:
            raise ValueError(
                f"requests {with_drafts} were scheduled with draft tokens, but "
                "num_accepted_tokens was not given"
            )
        return [0] * len(due)
    if len(num_accepted_tokens) != len(due):
        raise ValueError(
            f"num_accepted_tokens has {len(num_accepted_tokens)} entries but {len(due)} "
            "requests were due to sample"
        )
    for s, n in zip(due, num_accepted_tokens):
        if not 0 <= n <= len(s.spec_token_ids):
            raise ValueError(
                f"request {s.request_id}: {n} drafts accepted out of {len(s.spec_token_ids)}"
            )
    return num_accepted_tokens


def verified_tokens(
    s: ScheduledRequest, token: int, num_accepted: int, stats: SpecDecodingStats | None
) -> list[int]:
    """The request's new tokens: its accepted drafts, then the sampled token.

    The step computed K/V at every draft's position; those of the rejected drafts
    belong to tokens that never happened. Counting them as not computed (upstream's
    ``update_from_output`` does the same) makes the next step compute those positions
    again, over the same slots, which stay allocated. ``stats`` counts the drafts.
    """
    drafts = s.spec_token_ids
    if not drafts:
        return [token]
    if s.request.status == RequestStatus.RUNNING:
        s.request.num_computed_tokens -= len(drafts) - num_accepted
    assert stats is not None
    stats.observe_draft(len(drafts), num_accepted)
    return [*drafts[:num_accepted], token]
