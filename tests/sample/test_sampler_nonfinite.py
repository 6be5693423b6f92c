"""A logits row that is not finite is flagged, and it changes no other row's token.

The sampler's ``logits_finite`` is what the model runner turns into a per-request error
(``ModelRunnerOutput.errors``); the fast all-greedy path and the general path must agree
on it, and the rows that are finite must get exactly the tokens they get without the
bad rows in the batch.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from tests.sample.test_sampler import VOCAB, make_generators, make_request

NAN, INF = float("nan"), float("inf")

# Each kind of bad row: one NaN, one +inf, all -inf. A lone -inf is a masked token
# (finite maximum), not a failure.
BAD_ROWS = {1: (5, NAN), 3: (7, INF), 4: (None, -INF)}
SETTINGS = {
    "all-greedy (fast path)": lambda i: SamplingParams(temperature=0.0),
    "greedy with logprobs": lambda i: SamplingParams(temperature=0.0, logprobs=2),
    "seeded random with filters and penalties": lambda i: SamplingParams(
        temperature=0.9, top_k=8, top_p=0.9, repetition_penalty=1.2, seed=100 + i
    ),
}


def _logits(num_rows: int) -> torch.Tensor:
    logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, 2] = -INF
    return logits


def _sample(logits: torch.Tensor, rows: list[int], setting: str):
    params = [SETTINGS[setting](i) for i in rows]
    requests = [make_request(i, p, [2, 3, 4], [5]) for i, p in zip(rows, params)]
    md = SamplingMetadata.from_requests(
        requests, torch.device("cpu"), make_generators(requests), VOCAB
    )
    return Sampler(torch.Generator().manual_seed(0))(logits[rows], md)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_bad_rows_are_flagged_and_leave_the_others_alone(setting: str) -> None:
    num_rows = 6
    logits = _logits(num_rows)
    for row, (col, value) in BAD_ROWS.items():
        if col is None:
            logits[row] = value
        else:
            logits[row, col] = value
    out = _sample(logits, list(range(num_rows)), setting)
    assert out.logits_finite is not None
    assert out.logits_finite.tolist() == [i not in BAD_ROWS for i in range(num_rows)]
    # Every token is a valid id, even for a bad row: async scheduling feeds it to the
    # next step's input before the host has seen the flag.
    assert ((out.sampled_token_ids >= 0) & (out.sampled_token_ids < VOCAB)).all()
    good = [i for i in range(num_rows) if i not in BAD_ROWS]
    alone = _sample(logits, good, setting)
    assert alone.logits_finite is not None and alone.logits_finite.all()
    assert out.sampled_token_ids[good].tolist() == alone.sampled_token_ids.tolist()
