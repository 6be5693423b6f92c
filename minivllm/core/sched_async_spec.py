"""Async scheduling with a draft model: scheduling drafts that are still on the device.

Upstream counterpart: ``AsyncScheduler`` in ``vllm/v1/core/sched/async_scheduler.py``
(placeholder drafts, ``num_output_placeholders`` counting ``1 + k`` per step) and the
``num_output_placeholders`` branch of ``Scheduler.schedule``.

With async scheduling, step N+1 is scheduled while step N still runs. A request that
verifies ``k_N`` drafts in step N gains between 1 and ``1 + k_N`` tokens from it, and the
draft model proposes its next drafts in the same step, on the device. So when step N+1
is built, neither the request's new tokens, nor their number, nor the drafts are on the
host. The scheduler schedules the request *optimistically*: its input token and its
drafts are placeholders (``DRAFT_PLACEHOLDER``), and ``num_computed_tokens`` counts every
draft of step N as accepted. When step N's result arrives, ``verified_tokens`` takes the
rejected ones back, exactly as without async scheduling; the model runner has meanwhile
shifted step N+1's positions by the same amount on the device.

The one thing optimism cannot decide is how many drafts step N+1 may carry when a limit
is near: ``max_tokens`` (``drafts_to_keep``) and ``max_model_len`` cap a request's drafts
by its *real* length, which depends on how many of step N's drafts are accepted. Such a
request sits the step out and is scheduled once step N's result is in, with exactly the
drafts synchronous scheduling would give it. That keeps every step's draft count, and
so the speculation statistics and every seeded random stream, identical with async
scheduling on and off; it costs one step of latency only in a request's last ``~2k``
tokens.
"""

from __future__ import annotations

from minivllm.request import Request

DRAFT_PLACEHOLDER = -1
"""A draft the scheduler schedules before its value exists (the model runner fills it in
from the previous step's proposals on the device; the engine core writes the value into
the step's ``ScheduledRequest`` once the previous step's output reaches the host)."""


def num_drafts_in_flight(
    request: Request, num_speculative_tokens: int, max_model_len: int
) -> int | None:
    """Drafts to schedule for a running request whose previous step is still in flight.

    The step in flight sampled for the request, so the draft model proposed
    ``num_speculative_tokens`` drafts for it there (on the device), or none.

    Args:
        request: A running request with ``num_output_placeholders > 0``; its
            ``num_computed_tokens`` counts the in-flight step's drafts as accepted.
        num_speculative_tokens: ``k``, or 0 when the step in flight proposes no drafts
            (a step above ``disable_by_batch_size``).
        max_model_len: No position at or past it is computed.

    Returns:
        How many of those drafts to schedule: what synchronous scheduling would give it,
        when that number does not depend on the step in flight; otherwise None (do not
        schedule the request this step).
    """
    # 1 + the drafts of the step in flight (only one step is ever in flight here).
    num_prev_drafts = request.num_output_placeholders - 1
    # Outputs once the step in flight is applied, if it accepts all its drafts.
    most_outputs = request.num_output_tokens + request.num_output_placeholders
    num = min(
        num_speculative_tokens,
        request.max_tokens - most_outputs - 1,  # as drafts_to_keep
        max_model_len - request.num_computed_tokens - 1,  # as schedule()'s length cut
    )
    if num_prev_drafts == 0:
        return max(num, 0)  # the step in flight gains exactly one token: nothing unknown
    # Every draft of the step in flight may be rejected, which would allow more drafts
    # than the optimistic count: only the full k is the same either way.
    return num if num == num_speculative_tokens else None
