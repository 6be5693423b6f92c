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

The rejection sampler answers with a grid, a row per request and a column per place a
token can take (``max_spec_len + 1``). Everything about that grid that does not depend
on the logits is laid out here, on the host, and travels with the rest in one copy::

    sampled_rows           [[0, 1, 2, 3],            (the row behind each cell; after a
                            [4, 4, 4, 4],             request's drafts, its bonus row)
                            [5, 6, 7, 7]]
    draft_grid             [[x, x, x, -1],           (each request's drafts, then -1)
                            [-1, -1, -1, -1],
                            [x, x, -1, -1]]

so that a greedy step's verdict is a handful of whole-grid operations, each a kernel
launch the host pays for on a GPU (see ``RejectionSampler.forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.utils.torch_utils import copy_to_device


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
        sampled_rows: ``[batch, max_spec_len + 1]`` int64, the sampled row behind each
            cell of the output grid: draft ``j``'s verifying row at column ``j < n``,
            the bonus row from column ``n`` on.
        draft_grid: ``[batch, max_spec_len + 1]`` int64, each request's drafts, then -1
            (never a token, so no argmax equals it).
        draft_index_grid: ``[batch, max_spec_len + 1]`` int64, each cell's index in
            ``draft_token_ids``; ``num_draft_tokens_total`` where the cell holds none.
        grid_cols: ``[max_spec_len + 1]`` int64, ``0, 1, ...``: each column's index.
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor
    sampled_rows: torch.Tensor
    draft_grid: torch.Tensor
    draft_index_grid: torch.Tensor
    grid_cols: torch.Tensor

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
        total = int(cu_draft[-1]) if len(cu_draft) else 0
        if cu_num_scheduled_tokens is None:
            cu_num_scheduled_tokens = cu_sampled
        # Each request's sampled rows are the last num_sampled of its scheduled tokens:
        # sampled row r of a request sits (its scheduled end - its sampled end) after r.
        logits_indices = np.repeat(cu_num_scheduled_tokens - cu_sampled, num_sampled)
        logits_indices += np.arange(len(logits_indices))
        first_row = cu_sampled - num_sampled
        flat_drafts = np.fromiter(
            (t for d in draft_token_ids for t in d), dtype=np.int64, count=total
        )
        # The output grid: cells left of a request's n drafts hold them (row-major, the
        # order of flat_drafts); from column n on, the bonus row answers. A request's
        # draft rows are the first num_draft of its sampled rows, so the draft cells'
        # rows, in order, are target_logits_indices.
        cols = np.arange(int(num_draft.max(initial=0)) + 1, dtype=np.int64)
        holds_draft = cols < num_draft[:, None]
        sampled_rows = first_row[:, None] + np.minimum(cols, num_draft[:, None])
        draft_grid = np.full(holds_draft.shape, -1, dtype=np.int64)
        draft_grid[holds_draft] = flat_drafts
        draft_index_grid = np.full(holds_draft.shape, total, dtype=np.int64)
        draft_index_grid[holds_draft] = np.arange(total)
        target_indices = sampled_rows[holds_draft]
        # One host-to-device copy for all of them (each separate copy from ordinary
        # memory would make the host wait for the device).
        arrays = {
            "draft_token_ids": flat_drafts,
            "cu_num_draft_tokens": cu_draft,
            "cu_num_sampled_tokens": cu_sampled,
            "target_logits_indices": target_indices,
            "bonus_logits_indices": cu_sampled - 1,
            "logits_indices": logits_indices,
            "sampled_rows": sampled_rows,
            "draft_grid": draft_grid,
            "draft_index_grid": draft_index_grid,
            "grid_cols": cols,
        }
        tensors = copy_to_device(list(arrays.values()), np.int64, device)
        return cls(num_draft_tokens=num_draft.tolist(), **dict(zip(arrays, tensors)))
