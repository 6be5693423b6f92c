"""The scheduler's stateless helpers: token-level stop rules and checks of a step's tokens.

Upstream counterpart: ``vllm/v1/core/sched/utils.py`` (``check_stop``).

vLLM splits stopping in two. Everything decidable from token ids lives here and runs in
the scheduler, so a finished request frees its KV blocks in the same step. Stop *strings*
need text, so they are checked later by the detokenizer in the output processor, which
then aborts the request back in the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from minivllm.core.sched_output import ScheduledRequest
from minivllm.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether ``request`` is finished after its newest output token.

    The rules run in vLLM's order:

    1. ``min_tokens`` guard: before that many tokens exist, nothing stops the request,
       except the hard ``max_model_len`` limit (see below).
    2. The model's end-of-sequence token (unless ``ignore_eos``): ``FINISHED_STOPPED``
       with ``stop_reason`` None.
    3. A stop token id (``stop_token_ids``, or the extra EOS ids of the generation config
       gathered in ``all_stop_token_ids``): ``FINISHED_STOPPED`` with ``stop_reason``
       set to that id.
    4. Length: ``num_tokens >= max_model_len`` or ``num_output_tokens >= max_tokens``:
       ``FINISHED_LENGTH_CAPPED``.

    Args:
        request: A request whose last output token was just appended.
        max_model_len: Longest sequence (prompt plus output) the model accepts.

    Returns:
        True when the request is finished; its ``status`` (and ``stop_reason``) are set.
    """
    params = request.sampling_params
    if request.num_output_tokens < params.min_tokens:
        # vLLM returns False here unconditionally. A request that reached max_model_len
        # before min_tokens would then have no position left for its next token, so the
        # hard length limit wins over min_tokens.
        if request.num_tokens >= max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    last_token_id = request.output_token_ids[-1]
    if (
        not params.ignore_eos
        and request.eos_token_id is not None
        and last_token_id == request.eos_token_id
    ):
        request.status = RequestStatus.FINISHED_STOPPED
        return True

    if last_token_id in params.all_stop_token_ids or last_token_id in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True

    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def append_and_check_stop(request: Request, new_tokens: list[int], max_model_len: int) -> int:
    """Append tokens one at a time and stop at the first that ends the request, so a
    run of accepted drafts ends exactly where token-by-token decoding would.

    Returns:
        How many of ``new_tokens`` were appended; ``request.is_finished()`` says whether
        one of them finished it.
    """
    for num_appended, token in enumerate(new_tokens, 1):
        request.append_output_token_ids(token)
        if check_stop(request, max_model_len):
            return num_appended
    return len(new_tokens)


def reaches_max_tokens(request: Request) -> bool:
    """Whether the steps already scheduled sample the request's ``max_tokens``-th token.

    Only true with async scheduling (a step still in flight): scheduling another step
    would compute a token that ``check_stop`` is certain to discard.
    """
    return (
        request.num_output_placeholders > 0
        and request.num_output_tokens + request.num_output_placeholders >= request.max_tokens
    )


def tokens_in_batch_order(
    due: list[ScheduledRequest], sampled: Mapping[str, int] | Sequence[int]
) -> Sequence[int]:
    """The runner's tokens aligned with ``due``, checked to cover exactly ``due``.

    Raises:
        ValueError: ``sampled`` has a different length than ``due``, or (a mapping)
            names other requests.
    """
    if not isinstance(sampled, Mapping):
        if len(sampled) != len(due):
            raise ValueError(
                f"sampled_token_ids has {len(sampled)} tokens but {len(due)} requests "
                f"were due to sample"
            )
        return sampled
    due_ids = [s.request_id for s in due]
    if set(sampled) != set(due_ids):
        raise ValueError(
            f"sampled_token_ids covers requests {sorted(sampled)} but the requests due "
            f"to sample are {sorted(due_ids)}"
        )
    return [sampled[rid] for rid in due_ids]
