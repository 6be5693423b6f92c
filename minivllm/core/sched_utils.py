"""Token-level stop rules, applied by the scheduler after every sampled token.

Upstream counterpart: ``check_stop`` in ``vllm/v1/core/sched/utils.py``.

vLLM splits stopping in two. Everything decidable from token ids lives here and runs in
the scheduler, so a finished request frees its KV blocks in the same step. Stop *strings*
need text, so they are checked later by the detokenizer in the output processor, which
then aborts the request back in the scheduler.
"""

from __future__ import annotations

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
