"""The checks a new request must pass before the scheduler may queue it.

Upstream counterparts: ``InputProcessor._validate_model_inputs`` in
``vllm/v1/engine/input_processor.py`` and the length check of ``Scheduler.add_request``.
Both sides of minivllm call this one function: the front end, so that a bad request
fails at the call site (or as an HTTP 400) before anything is queued, and the engine
core, which may receive requests over a socket and must protect itself.
"""

from __future__ import annotations

from minivllm.utils.math_utils import cdiv


def num_blocks_needed(
    num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_size: int
) -> int:
    """Blocks a request holds at its longest, if it runs to its length limit.

    It ends with ``min(prompt + max_tokens, max_model_len)`` tokens, and the K/V of all
    but the last one are computed (the last sampled token is never fed back).
    """
    final_len = min(num_prompt_tokens + max_tokens, max_model_len)
    return cdiv(final_len - 1, block_size)


def check_new_request(
    request_id: str,
    num_prompt_tokens: int,
    max_tokens: int,
    max_model_len: int,
    block_size: int,
    num_kv_blocks: int,
) -> None:
    """Raise ``ValueError`` naming the problem if the request can never run.

    A request needing more than the whole KV pool would preempt itself forever, so it
    is refused. Any request that passes can always finish: once everything admitted
    after it is preempted, it has the pool to itself.
    """
    if num_prompt_tokens == 0:
        raise ValueError(f"request {request_id}: the prompt is empty")
    if num_prompt_tokens + 1 > max_model_len:
        raise ValueError(
            f"request {request_id}: prompt of {num_prompt_tokens} tokens plus one generated "
            f"token exceeds max_model_len={max_model_len}"
        )
    need = num_blocks_needed(num_prompt_tokens, max_tokens, max_model_len, block_size)
    if need > num_kv_blocks:
        raise ValueError(
            f"KV pool too small for request {request_id}: it may grow to {need} blocks of "
            f"{block_size} tokens but the pool has only {num_kv_blocks}; lower max_tokens "
            f"or enlarge the pool"
        )
