"""The two built-in logits processors minivllm keeps: min_tokens and min_p.

Upstream counterparts: ``MinTokensLogitsProcessor`` and ``MinPLogitsProcessor`` in
``vllm/v1/sample/logits_processor/builtin.py``. vLLM sorts its processors into two
kinds: those that can change the argmax (min_tokens, logit_bias), which run before the
greedy draw, and those that cannot (min_p), which only run for random sampling, after
temperature. minivllm keeps that split but writes each processor as a plain function of
batch tensors; vLLM's classes also keep per-row state in sync as requests join and leave
its persistent batch, a bookkeeping minivllm avoids by rebuilding the tensors each step.
"""

from __future__ import annotations

import torch


def apply_min_tokens(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """Forbid stop tokens for requests that have not yet produced ``min_tokens``.

    Args:
        logits: ``[num_reqs, vocab_size]``, modified in place.
        rows: ``[n]`` row index of each (row, token) pair to forbid.
        token_ids: ``[n]`` the token id of each pair (EOS ids and ``stop_token_ids``).

    Returns:
        ``logits``.
    """
    return logits.index_put_((rows, token_ids), torch.tensor(float("-inf"), device=logits.device))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability.

    The threshold scales with the model's confidence: a peaked distribution keeps few
    tokens, a flat one keeps many. Rows with ``min_p = 0`` are untouched.

    Args:
        logits: ``[num_reqs, vocab_size]`` float32 after temperature, modified in place.
        min_p: ``[num_reqs]`` float32 in ``[0, 1]``.

    Returns:
        ``logits``.
    """
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, float("-inf"))
