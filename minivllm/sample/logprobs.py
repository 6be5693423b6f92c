"""Log-probabilities: computed on the device, handed to the engine as plain lists.

Upstream counterparts: ``Sampler.compute_logprobs`` and ``Sampler.gather_logprobs`` in
``vllm/v1/sample/sampler.py``. The containers they fill (``LogprobsTensors``,
``LogprobsLists``, ``Logprob``) are in ``minivllm/runner_outputs.py``, as upstream keeps
them in ``vllm/v1/outputs.py`` and ``vllm/logprobs.py``.

Which distribution? vLLM's default ``logprobs_mode`` is ``"raw_logprobs"``: the
log-softmax of the model's logits *before* penalties, temperature and the top-k/top-p/
min_p filters. A logprob then says what the model thinks of a token, independent of the
sampling knobs (and a token that top-k removed still has a finite logprob). minivllm
implements only that mode.
"""

from __future__ import annotations

import torch

from minivllm.runner_outputs import Logprob, LogprobsTensors


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` in float32 over the vocabulary."""
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """Pick each row's given token and its top ``num_logprobs`` tokens.

    Args:
        logprobs: ``[num_rows, vocab_size]`` from ``compute_logprobs``.
        num_logprobs: How many of the most likely tokens to return (may be 0).
        token_ids: ``[num_rows]`` int64, the sampled (or prompt) token of each row.

    Returns:
        Tensors whose column 0 is ``token_ids`` and columns 1.. the top-N.
    """
    # Never more than the vocabulary (a request may ask for more than exists).
    top_logprobs, top_ids = torch.topk(logprobs, min(num_logprobs, logprobs.shape[-1]), dim=-1)
    token_ids = token_ids.unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, token_ids)
    # Rank = how many tokens are at least as likely (so the argmax has rank 1).
    ranks = (logprobs >= token_logprobs).sum(dim=-1)
    return LogprobsTensors(
        token_ids=torch.cat((token_ids, top_ids), dim=1),
        logprobs=torch.cat((token_logprobs, top_logprobs), dim=1),
        ranks=ranks,
    )


def make_position_logprobs(
    token_ids: list[int],
    logprobs: list[float],
    rank: int,
    num_logprobs: int,
    decoded: list[str | None],
) -> dict[int, Logprob]:
    """Build one position's ``{token_id: Logprob}`` as vLLM does.

    The first entry is the sampled (or prompt) token with its own rank; then the top
    ``num_logprobs`` with ranks 1, 2, ... A sampled token that is also in the top-N
    appears once, so a position holds ``num_logprobs`` or ``num_logprobs + 1`` entries.
    ``token_ids`` may hold more top entries than this request asked for (the batch
    computes the largest N any request wants); the extra ones are dropped here.
    """
    ranks = [rank, *range(1, num_logprobs + 1)]
    keep = num_logprobs + 1
    return {
        tok: Logprob(lp, r, text)
        for tok, lp, r, text in zip(token_ids[:keep], logprobs[:keep], ranks, decoded[:keep])
    }
