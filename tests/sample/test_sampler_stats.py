"""Statistical proof: the tokens drawn follow the target distribution.

Each case samples one request many times at once (the same row repeated; unseeded rows
draw independent noise from the engine generator) on a small vocabulary with fixed
seeds, and a chi-square goodness-of-fit test compares the counts with the direct
computation of reference.py. A negative control shows that the test has the power to
catch a plausible bug: a top-p that keeps one token too few.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.request import Request
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sample.topk_topp_sampler import random_sample
from minivllm.sampling_params import SamplingParams
from tests.sample.reference import chi_square_pvalue, target_distribution

VOCAB = 8
DRAWS = 20_000
ALPHA = 1e-3
# Fixed logits with well separated probabilities, so each filter's cut is unambiguous.
LOGITS = torch.tensor([2.0, 1.6, 1.1, 0.9, 0.3, -0.2, -0.9, -1.5])
PROMPT = [0, 0, 3]
OUTPUT = [1, 4, 4]

CASES = {
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(temperature=1.0, top_k=3),
    "top_p": SamplingParams(temperature=1.0, top_p=0.75),
    "min_p": SamplingParams(temperature=1.2, min_p=0.3),
    "repetition": SamplingParams(temperature=1.0, repetition_penalty=1.8),
    "frequency": SamplingParams(temperature=1.0, frequency_penalty=0.6),
    "presence": SamplingParams(temperature=1.0, presence_penalty=0.9),
    "everything": SamplingParams(
        temperature=0.9,
        top_k=6,
        top_p=0.9,
        min_p=0.1,
        repetition_penalty=1.3,
        frequency_penalty=0.2,
        presence_penalty=0.3,
    ),
}


def _draw(params: SamplingParams, seed: int = 0) -> torch.Tensor:
    requests = []
    for i in range(DRAWS):
        r = Request(str(i), PROMPT, params)
        r.append_output_token_ids(OUTPUT)
        requests.append(r)
    md = SamplingMetadata.from_requests(requests, torch.device("cpu"), {}, VOCAB)
    sampler = Sampler(torch.Generator().manual_seed(seed))
    tokens = sampler(LOGITS.expand(DRAWS, VOCAB), md).sampled_token_ids
    return torch.bincount(tokens, minlength=VOCAB)


@pytest.mark.parametrize("name", list(CASES))
def test_samples_follow_target_distribution(name: str) -> None:
    params = CASES[name]
    counts = _draw(params)
    target = target_distribution(LOGITS, params, PROMPT, OUTPUT)
    assert chi_square_pvalue(counts, target) > ALPHA, (counts, target * DRAWS)


def test_seeded_requests_follow_target_distribution() -> None:
    """The per-request generator path, not only the shared one, draws correctly."""
    params = SamplingParams(temperature=1.0, top_p=0.9)
    tokens = []
    for seed in range(2_000):
        p = SamplingParams(temperature=1.0, top_p=0.9, seed=seed)
        r = Request(str(seed), PROMPT, p)
        gens = {r.request_id: torch.Generator().manual_seed(seed)}
        md = SamplingMetadata.from_requests([r], torch.device("cpu"), gens, VOCAB)
        tokens.append(Sampler()(LOGITS.unsqueeze(0), md).sampled_token_ids.item())
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB)
    assert chi_square_pvalue(counts, target_distribution(LOGITS, params)) > ALPHA


def _top_p_one_too_few(logits: torch.Tensor, p: float) -> torch.Tensor:
    """A plausible bug: drop the token that makes the kept mass reach p."""
    probs = logits.softmax(-1)
    sorted_probs, idx = probs.sort(descending=True)
    cum = sorted_probs.cumsum(-1)
    drop_sorted = cum >= p  # wrong: the token crossing p is dropped too
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def test_negative_control_top_p_one_token_too_few_is_caught() -> None:
    params = CASES["top_p"]
    target = target_distribution(LOGITS, params)
    buggy = _top_p_one_too_few(LOGITS.expand(DRAWS, VOCAB).clone(), params.top_p)
    tokens = random_sample(buggy.softmax(-1), {}, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=VOCAB)
    assert chi_square_pvalue(counts, target) < ALPHA
    # ... while a fair draw from the target itself passes the same test.
    fair = random_sample(target.float().expand(DRAWS, VOCAB), {}, torch.Generator().manual_seed(0))
    assert chi_square_pvalue(torch.bincount(fair, minlength=VOCAB), target) > ALPHA


def test_negative_control_wrong_temperature_is_caught() -> None:
    """A wrong temperature (0.8 instead of 0.7) is also detected at this sample size."""
    counts = _draw(SamplingParams(temperature=0.8))
    target = target_distribution(LOGITS, SamplingParams(temperature=0.7))
    assert chi_square_pvalue(counts, target) < ALPHA
