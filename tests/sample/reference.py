"""The target distribution of one request, computed directly: one row, no batching.

This is the oracle of the sampler tests. It follows the definitions (vLLM's order:
min_tokens, penalties, temperature, min_p, top-k, top-p) with plain Python loops over
tokens and float64 arithmetic, sharing no code with ``minivllm.sample``.
"""

from __future__ import annotations

from collections import Counter

import torch

from minivllm.sampling_params import SamplingParams


def penalized_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: list[int],
    output: list[int],
    min_tokens_stop_ids: set[int] = frozenset(),
) -> torch.Tensor:
    """min_tokens mask and the three penalties, token by token, in float64."""
    x = logits.double().clone()
    if len(output) < params.min_tokens:
        for t in min_tokens_stop_ids:
            x[t] = float("-inf")
    rp = params.repetition_penalty
    for t in set(prompt) | set(output):
        x[t] = x[t] / rp if x[t] > 0 else x[t] * rp
    for t, count in Counter(output).items():
        x[t] -= params.frequency_penalty * count + params.presence_penalty
    return x


def target_distribution(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: list[int] = (),
    output: list[int] = (),
    min_tokens_stop_ids: set[int] = frozenset(),
) -> torch.Tensor:
    """The probabilities the request should draw its next token from (float64)."""
    x = penalized_logits(logits, params, list(prompt), list(output), min_tokens_stop_ids)
    vocab = x.numel()
    if params.temperature == 0.0:
        return torch.nn.functional.one_hot(x.argmax(), vocab).double()
    p = torch.softmax(x / params.temperature, dim=0)
    keep = torch.ones(vocab, dtype=torch.bool)
    if params.min_p > 0:
        keep &= p >= params.min_p * p.max()
    order = sorted(range(vocab), key=lambda t: -float(p[t]))
    if params.top_k > 0:
        survivors = [t for t in order if keep[t]]
        for t in survivors[params.top_k :]:
            keep[t] = False
    if params.top_p < 1.0:
        mass = float(p[keep].sum())
        above = 0.0
        for t in order:
            if not keep[t]:
                continue
            if above >= params.top_p:  # the mass above already reaches top_p
                keep[t] = False
            above += float(p[t]) / mass
    q = torch.where(keep, p, 0.0)
    return q / q.sum()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness-of-fit p-value of ``counts`` against ``probs``.

    Tokens with zero probability must have zero counts (else p = 0); bins with a tiny
    expectation are merged into one so the chi-square approximation holds.
    """
    counts, probs = counts.double(), probs.double()
    n = counts.sum()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big & (probs > 0)].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    if dof == 0:
        return 1.0
    # Survival function of chi2(dof): the regularized upper incomplete gamma function.
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))
