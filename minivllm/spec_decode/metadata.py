"""Where each request's draft tokens sit in one step's flat batch of logits.

Upstream counterpart: ``vllm/v1/spec_decode/metadata.py`` (``SpecDecodeMetadata``),
filled by ``GPUModelRunner._calc_spec_decode_metadata`` in
``vllm/v1/worker/gpu_model_runner.py``; here the filling is a classmethod beside the
fields it fills.

A request verifying ``n`` drafts feeds ``n + 1`` tokens to the target model: its last
accepted token, then the drafts. The logits at those ``n + 1`` positions are its
*sampled rows*: row ``j < n`` says what the target would emit where draft ``j`` stands
(it verifies draft ``j``), and row ``n``, the *bonus* row, what it would emit after the
last draft. Requests without drafts have one sampled row, the bonus row, exactly as
in a decode step without speculation. All requests' sampled rows are laid end to end::

    num_draft_tokens       [3, 0, 2]
    sampled rows           d d d b | b | d d b       (d: verifies a draft, b: bonus)
    row index               0 1 2 3   4   5 6 7
    cu_num_draft_tokens    [3, 3, 5]
    cu_num_sampled_tokens  [4, 5, 8]
    target_logits_indices  [0, 1, 2, 5, 6]           (the d rows)
    bonus_logits_indices   [3, 4, 7]                 (the b rows)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SpecDecodeMetadata:
    """One step's draft tokens and the rows of the logits that verify them.

    Attributes:
        draft_token_ids: ``[num_draft_tokens_total]`` int64, every request's drafts end
            to end.
        num_draft_tokens: Drafts per request (may be 0), on the host.
        cu_num_draft_tokens: ``[batch]`` int64 running total of ``num_draft_tokens``.
        cu_num_sampled_tokens: ``[batch]`` int64 running total of ``num_draft_tokens + 1``.
        target_logits_indices: ``[num_draft_tokens_total]`` int64, the sampled row that
            verifies each draft.
        bonus_logits_indices: ``[batch]`` int64, each request's bonus row.
        logits_indices: ``[num_draft_tokens_total + batch]`` int64, the position in the
            step's flat token batch of each sampled row (the hidden states to turn into
            logits).
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor

    def __post_init__(self) -> None:
        self.max_spec_len = max(self.num_draft_tokens, default=0)

    @property
    def num_sampled_rows(self) -> int:
        """Drafts plus one bonus row per request: the height of the sampled logits."""
        return sum(self.num_draft_tokens) + len(self.num_draft_tokens)

    @classmethod
    def from_draft_token_ids(
        cls,
        draft_token_ids: list[list[int]],
        device: torch.device,
        cu_num_scheduled_tokens: np.ndarray | None = None,
    ) -> SpecDecodeMetadata:
        """Lay out one step's drafts.

        Args:
            draft_token_ids: Per request, the drafts it verifies this step (may be empty).
            device: Where the logits live.
            cu_num_scheduled_tokens: Running total of the tokens each request feeds the
                model this step. A request's sampled rows are its last
                ``num_draft_tokens + 1`` tokens. None: the batch holds nothing else
                (``logits_indices`` is then ``0, 1, 2, ...``).
        """
        num_draft = np.array([len(d) for d in draft_token_ids], dtype=np.int64)
        num_sampled = num_draft + 1
        cu_sampled = np.cumsum(num_sampled)
        cu_draft = np.cumsum(num_draft)
        if cu_num_scheduled_tokens is None:
            cu_num_scheduled_tokens = cu_sampled
        # Each request's sampled rows are the last num_sampled of its scheduled tokens.
        logits_indices = np.repeat(cu_num_scheduled_tokens - num_sampled, num_sampled)
        logits_indices += _ranges(num_sampled)
        # A request's draft rows are the first num_draft of its sampled rows.
        target_indices = np.repeat(cu_sampled - num_sampled, num_draft) + _ranges(num_draft)
        flat_drafts = np.fromiter(
            (t for d in draft_token_ids for t in d), dtype=np.int64, count=int(num_draft.sum())
        )
        arrays = [flat_drafts, cu_draft, cu_sampled, target_indices, cu_sampled - 1]
        tensors = [torch.from_numpy(a).to(device) for a in [*arrays, logits_indices]]
        return cls(
            draft_token_ids=tensors[0],
            num_draft_tokens=num_draft.tolist(),
            cu_num_draft_tokens=tensors[1],
            cu_num_sampled_tokens=tensors[2],
            target_logits_indices=tensors[3],
            bonus_logits_indices=tensors[4],
            logits_indices=tensors[5],
        )


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """``[0..lengths[0]), [0..lengths[1]), ...`` concatenated, without a Python loop."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts
