"""The batched sampler against the direct, one-row-at-a-time oracle of reference.py."""

from __future__ import annotations

import pytest
import torch

from minivllm.request import Request
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from tests.sample.reference import penalized_logits, target_distribution

VOCAB = 32
EOS = 1


def make_request(i: int, params: SamplingParams, prompt: list[int], output: list[int]) -> Request:
    params.update_from_generation_config({EOS})
    request = Request(str(i), prompt, params, eos_token_id=EOS)
    if output:
        request.append_output_token_ids(output)
    return request


def make_generators(requests: list[Request]) -> dict[str, torch.Generator]:
    gens = {}
    for r in requests:
        if r.sampling_params.seed is not None:
            gens[r.request_id] = torch.Generator().manual_seed(r.sampling_params.seed)
    return gens


# One of each option, alone and combined; prompts/outputs repeat tokens on purpose.
CASES = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.6),
    SamplingParams(temperature=0.9, min_p=0.2),
    SamplingParams(temperature=1.0, repetition_penalty=1.7),
    SamplingParams(temperature=1.0, repetition_penalty=0.6),
    SamplingParams(temperature=1.0, frequency_penalty=0.8),
    SamplingParams(temperature=1.0, presence_penalty=-1.1),
    SamplingParams(
        temperature=0.8,
        top_k=7,
        top_p=0.7,
        min_p=0.05,
        frequency_penalty=0.3,
        presence_penalty=0.4,
        repetition_penalty=1.2,
        seed=11,
    ),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0),
    SamplingParams(temperature=1.0, min_tokens=4, stop_token_ids=[3]),
]


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(CASES), VOCAB, generator=g) * 3
    requests = []
    for i, params in enumerate(CASES):
        prompt = torch.randint(0, VOCAB, (5 + i,), generator=g).tolist()
        output = torch.randint(0, VOCAB, (i % 4,), generator=g).tolist() + prompt[:2]
        requests.append(make_request(i, params, prompt, output))
    return logits, requests


def test_each_row_matches_direct_computation() -> None:
    logits, requests = _batch()
    md = SamplingMetadata.from_requests(
        requests, torch.device("cpu"), make_generators(requests), VOCAB
    )
    sampler = Sampler()
    processed = Sampler.apply_logits_processors(logits.float().clone(), md)
    greedy_rows = [i for i, r in enumerate(requests) if r.sampling_params.temperature == 0]
    probs = sampler.compute_probs(processed.clone(), md)
    for i, r in enumerate(requests):
        p = r.sampling_params
        expected = target_distribution(
            logits[i], p, r.prompt_token_ids, r.output_token_ids, p.min_tokens_stop_ids
        )
        if i in greedy_rows:
            assert processed[i].argmax() == expected.argmax()
            continue
        torch.testing.assert_close(probs[i].double(), expected, atol=1e-5, rtol=1e-4)
        # The zero pattern must be exact: a filter keeping one token too many or too
        # few changes it.
        assert torch.equal(probs[i] > 0, expected > 0), f"row {i}: {p}"


def test_penalties_alone_match_direct_computation() -> None:
    logits, requests = _batch(1)
    md = SamplingMetadata.from_requests(
        requests, torch.device("cpu"), make_generators(requests), VOCAB
    )
    processed = Sampler.apply_logits_processors(logits.float().clone(), md)
    for i, r in enumerate(requests):
        p = r.sampling_params
        expected = penalized_logits(
            logits[i], p, r.prompt_token_ids, r.output_token_ids, p.min_tokens_stop_ids
        )
        torch.testing.assert_close(processed[i].double(), expected, atol=1e-5, rtol=1e-5)


def test_greedy_rows_unaffected_by_other_rows() -> None:
    logits, requests = _batch(2)
    greedy = [i for i, r in enumerate(requests) if r.sampling_params.temperature == 0]
    sampler = Sampler(torch.Generator().manual_seed(0))
    md = SamplingMetadata.from_requests(
        requests, torch.device("cpu"), make_generators(requests), VOCAB
    )
    batched = sampler(logits, md).sampled_token_ids
    for i in greedy:
        alone = [requests[i]]
        md1 = SamplingMetadata.from_requests(alone, torch.device("cpu"), {}, VOCAB)
        assert md1.all_greedy
        assert sampler(logits[i : i + 1], md1).sampled_token_ids.item() == batched[i].item()
        expected = penalized_logits(
            logits[i],
            requests[i].sampling_params,
            requests[i].prompt_token_ids,
            requests[i].output_token_ids,
        )
        assert batched[i].item() == expected.argmax().item()


def test_seeded_row_independent_of_batch_and_position() -> None:
    """A seeded request draws the same tokens alone, first, or last in any batch."""
    g = torch.Generator().manual_seed(5)
    row = torch.randn(VOCAB, generator=g)
    noise = torch.randn(6, VOCAB, generator=g)
    seeded = SamplingParams(temperature=1.0, top_k=10, seed=1234)

    def draw(batch_logits: torch.Tensor, batch_params: list[SamplingParams], row_idx: int):
        requests = [make_request(i, p, [2, 3], []) for i, p in enumerate(batch_params)]
        gens = make_generators(requests)
        sampler = Sampler(torch.Generator().manual_seed(len(batch_params)))
        tokens = []
        for _ in range(20):  # 20 steps: the generator stream continues across steps
            md = SamplingMetadata.from_requests(requests, torch.device("cpu"), gens, VOCAB)
            tokens.append(sampler(batch_logits, md).sampled_token_ids[row_idx].item())
        return tokens

    alone = draw(row.unsqueeze(0), [seeded], 0)
    others = [
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=2.0, seed=7),
    ]
    first = draw(torch.cat([row.unsqueeze(0), noise[:3]]), [seeded, *others], 0)
    last = draw(torch.cat([noise[3:], row.unsqueeze(0)]), [*others, seeded], 3)
    assert alone == first == last
    assert len(set(alone)) > 1  # it really is sampling


def test_sampler_leaves_callers_logits_alone() -> None:
    logits, requests = _batch(3)
    before = logits.clone()
    md = SamplingMetadata.from_requests(
        requests, torch.device("cpu"), make_generators(requests), VOCAB
    )
    Sampler()(logits, md)
    assert torch.equal(logits, before)


def test_unused_passes_are_skipped() -> None:
    """A plain batch builds no filter or penalty tensors at all."""
    requests = [
        make_request(i, SamplingParams(temperature=t), [4, 5], []) for i, t in enumerate((0.0, 0.8))
    ]
    md = SamplingMetadata.from_requests(requests, torch.device("cpu"), {}, VOCAB)
    assert md.no_penalties and md.top_k is None and md.top_p is None and md.min_p is None
    assert md.max_num_logprobs is None and md.min_tokens_rows is None
    assert not md.all_greedy and not md.all_random
    greedy = [make_request(0, SamplingParams(temperature=0.0, top_k=3), [4], [])]
    md = SamplingMetadata.from_requests(greedy, torch.device("cpu"), {}, VOCAB)
    assert md.all_greedy and md.temperature is None and md.top_k is None


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_forbids_eos_and_stop_ids(ignore_eos: bool) -> None:
    """Until min_tokens, EOS (even with ignore_eos, as vLLM) and stop ids are masked."""
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = 50.0
    logits[0, 3] = 40.0
    params = SamplingParams(
        temperature=0.0, min_tokens=2, stop_token_ids=[3], ignore_eos=ignore_eos
    )
    request = make_request(0, params, [5], [7])
    md = SamplingMetadata.from_requests([request], torch.device("cpu"), {}, VOCAB)
    assert Sampler()(logits, md).sampled_token_ids.item() not in (EOS, 3)
    request.append_output_token_ids(8)  # min_tokens reached: nothing masked any more
    md = SamplingMetadata.from_requests([request], torch.device("cpu"), {}, VOCAB)
    assert md.min_tokens_rows is None
    assert Sampler()(logits, md).sampled_token_ids.item() == EOS
