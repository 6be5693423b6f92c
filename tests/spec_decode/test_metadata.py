"""SpecDecodeMetadata: the flat layout of drafts, sampled rows and logits positions."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.spec_decode.metadata import SpecDecodeMetadata


def test_layout_of_a_mixed_batch() -> None:
    # Five requests feeding 4, 100, 3, 100 and 2 tokens; 3, 0, 2, 0 and 1 drafts.
    drafts = [[11, 12, 13], [], [21, 22], [], [31]]
    cu_scheduled = np.array([4, 104, 107, 207, 209])
    md = SpecDecodeMetadata.from_draft_token_ids(drafts, torch.device("cpu"), cu_scheduled)
    assert md.draft_token_ids.tolist() == [11, 12, 13, 21, 22, 31]
    assert md.num_draft_tokens == [3, 0, 2, 0, 1]
    assert md.max_spec_len == 3
    assert md.num_sampled_rows == 11
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    # Each request's last num_drafts + 1 scheduled tokens are its sampled rows.
    assert md.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]


def test_no_drafts_at_all_is_a_plain_decode_batch() -> None:
    md = SpecDecodeMetadata.from_draft_token_ids([[], []], torch.device("cpu"))
    assert md.max_spec_len == 0
    assert md.draft_token_ids.numel() == 0 and md.target_logits_indices.numel() == 0
    assert md.bonus_logits_indices.tolist() == [0, 1]
    assert md.logits_indices.tolist() == [0, 1]
