"""Repetition, frequency and presence penalties, for a whole batch at once.

Upstream counterparts: ``apply_penalties`` and ``get_token_bin_counts_and_mask`` in
``vllm/model_executor/layers/utils.py``, called from ``apply_all_penalties`` in
``vllm/v1/sample/ops/penalties.py``.

The trick that makes this batched is a histogram: every row's token ids (padded to a
common length with the id ``vocab_size``, which names no real token) are scattered into
a ``[num_reqs, vocab_size + 1]`` count tensor in one ``scatter_add_``; the padding
column is then cut off. Counts give the frequency penalty, ``counts > 0`` the presence
penalty, and the union of the prompt's and the output's masks the repetition penalty.
"""

from __future__ import annotations

import torch


def get_token_bin_counts_and_mask(
    tokens: torch.Tensor, vocab_size: int, num_seqs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count each token id per row.

    Args:
        tokens: ``[num_seqs, max_len]`` int64 ids, padded with ``vocab_size``.
        vocab_size: Number of real token ids.
        num_seqs: Number of rows.

    Returns:
        ``(counts, mask)``: ``[num_seqs, vocab_size]`` occurrence counts (int64) and
        ``counts > 0``.
    """
    # One extra column catches the padding id, then is dropped.
    counts = torch.zeros((num_seqs, vocab_size + 1), dtype=torch.long, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalize tokens already seen, in place, with vLLM's (and OpenAI's) definitions.

    * repetition (prompt and output): a seen token's logit is divided by the penalty
      when positive and multiplied by it when negative, so ``> 1`` always makes it less
      likely (the CTRL paper's rule, as in Hugging Face's ``repetition_penalty``);
    * frequency (output only): ``logit -= frequency_penalty * count``;
    * presence (output only): ``logit -= presence_penalty`` once if the token occurred.

    Args:
        logits: ``[num_seqs, vocab_size]`` float32, modified in place.
        prompt_token_ids: ``[num_seqs, max_prompt_len]`` padded with ``vocab_size``.
        output_token_ids: ``[num_seqs, max_output_len]`` padded with ``vocab_size``.
        presence_penalties: ``[num_seqs]``; 0 disables.
        frequency_penalties: ``[num_seqs]``; 0 disables.
        repetition_penalties: ``[num_seqs]``; 1 disables.

    Returns:
        ``logits``.
    """
    num_seqs, vocab_size = logits.shape
    _, prompt_mask = get_token_bin_counts_and_mask(prompt_token_ids, vocab_size, num_seqs)
    output_counts, output_mask = get_token_bin_counts_and_mask(
        output_token_ids, vocab_size, num_seqs
    )
    # Rows without a repetition penalty carry 1.0, which leaves every logit unchanged.
    penalty = torch.where(prompt_mask | output_mask, repetition_penalties.unsqueeze(1), 1.0).to(
        logits.dtype
    )
    logits.copy_(torch.where(logits > 0, logits / penalty, logits * penalty))
    logits -= frequency_penalties.unsqueeze(1) * output_counts
    logits -= presence_penalties.unsqueeze(1) * output_mask
    return logits
