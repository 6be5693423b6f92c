"""Top-k / top-p truncation and the host-sync-free random draw.

Upstream counterparts: ``apply_top_k_top_p_pytorch`` and ``random_sample`` in
``vllm/v1/sample/ops/topk_topp_sampler.py``. vLLM also has FlashInfer and Triton paths
for the same two steps; minivllm keeps only the sort-based PyTorch path, which is the
definition the fast paths are tested against.
"""

from __future__ import annotations

import torch


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k and top-p set.

    One ascending sort serves both filters:

    * top-k: everything below the k-th largest value goes (ties with it stay);
    * top-p: a token goes when the probability mass of the tokens *below* it (its
      cumulative sum in ascending order) is at most ``1 - p``; what is kept is then the
      smallest set of top tokens whose mass reaches ``p``. The largest token always
      stays, so a row is never empty.

    Top-p is computed on what top-k left, as in vLLM. Rows that disable a filter carry
    ``k = vocab_size`` and ``p = 1``.

    Args:
        logits: ``[num_reqs, vocab_size]`` float32 (temperature already applied).
        k: ``[num_reqs]`` int64 in ``[1, vocab_size]``, or None when no row uses top-k.
        p: ``[num_reqs]`` float32 in ``(0, 1]``, or None when no row uses top-p.

    Returns:
        The masked logits (the input tensor, modified in place).
    """
    if k is None and p is None:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_index = (logits_sort.size(1) - k).unsqueeze(1)  # position of the k-th largest
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, float("-inf"))
    if p is not None:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
        top_p_mask[:, -1] = False  # keep at least the most likely token
        logits_sort.masked_fill_(top_p_mask, float("-inf"))
    # Undo the sort: write each sorted value back to its vocabulary position.
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def random_sample(
    probs: torch.Tensor,
    generators: dict[int, torch.Generator],
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row of ``probs`` by the exponential race.

    With ``q_i ~ Exp(1)`` independent, ``argmax_i p_i / q_i`` is distributed exactly as
    ``Categorical(p)``: ``q_i / p_i`` is ``Exp(p_i)``, the arrival time of a clock of
    rate ``p_i``, and the first of independent exponential clocks to ring is clock ``i``
    with probability ``p_i / sum(p)``. The draw is one elementwise divide and one argmax,
    all on the device, so unlike ``torch.multinomial`` nothing waits for the host.

    Rows without a seed share ``default_generator``; a seeded row's noise is then
    overwritten from its own generator, so its draw depends on nothing else in the batch.

    Args:
        probs: ``[num_reqs, vocab_size]`` probabilities (zeros where masked).
        generators: Row index -> that request's generator.
        default_generator: The engine's generator for unseeded rows (None: torch's).

    Returns:
        ``[num_reqs]`` int64 token ids.
    """
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_(generator=default_generator)
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div(q).argmax(dim=-1)
