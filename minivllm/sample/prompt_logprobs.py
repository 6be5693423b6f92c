"""Prompt logprobs: how likely the model found each prompt token, given the ones before.

Upstream counterparts: ``GPUModelRunner._get_prompt_logprobs_dict`` in
``vllm/v1/worker/gpu_model_runner.py`` and Model Runner V2's
``vllm/v1/worker/gpu/sample/prompt_logprob.py``.

Normally only the last position of each request is turned into logits (one row per
request). A request that asks for prompt logprobs needs the logits at *every* prompt
position ``p`` (they score prompt token ``p + 1``), so its prefill chunks are projected
through the LM head too. Two consequences shape the design, the same ones vLLM has:

* a prompt position served from the prefix cache never runs through the model, so
  its logits do not exist: requests with ``prompt_logprobs`` never read the prefix
  cache (``KVCacheManager.get_computed_blocks`` returns no hits for them);
* with chunked prefill the positions arrive chunk by chunk; each chunk's rows are
  stored by position, so the engine assembles the full list in any number of steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minivllm.core.sched_output import SchedulerOutput
from minivllm.runner_outputs import PromptLogprobsChunk
from minivllm.sample.logprobs import compute_logprobs, gather_logprobs


def compute_prompt_logprobs(
    hidden_states: torch.Tensor,
    scheduler_output: SchedulerOutput,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, PromptLogprobsChunk]:
    """Compute this step's prompt logprobs for every request that wants them.

    Args:
        hidden_states: ``[num_tokens, hidden]``, the flat batch of the step.
        scheduler_output: The step (batch order = order in ``hidden_states``).
        compute_logits: The model's LM head, ``hidden [n, H] -> logits [n, vocab]``.

    Returns:
        request id -> the chunk computed for it (requests without any are absent).
    """
    chunks: dict[str, PromptLogprobsChunk] = {}
    offset = 0
    for s in scheduler_output.scheduled:
        request, n, start = s.request, s.num_scheduled_tokens, s.num_computed_tokens
        num_prompt_logprobs = request.sampling_params.prompt_logprobs
        # Positions start .. start+n-1 that score a *prompt* token (the last prompt
        # position scores the first output token: that is the sample logprob). A
        # request that already has outputs was resumed after a preemption: its
        # prompt logprobs were all computed before.
        end = min(start + n, request.num_prompt_tokens - 1)
        if num_prompt_logprobs is not None and end > start and request.num_output_tokens == 0:
            rows = hidden_states[offset : offset + end - start]
            logprobs = compute_logprobs(compute_logits(rows))
            targets = torch.tensor(
                request.prompt_token_ids[start + 1 : end + 1],
                dtype=torch.int64,
                device=logprobs.device,
            )
            tensors = gather_logprobs(logprobs, num_prompt_logprobs, targets)
            chunks[request.request_id] = PromptLogprobsChunk(start, tensors.tolists())
        offset += n
    return chunks
