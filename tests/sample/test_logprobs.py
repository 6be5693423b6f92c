"""Logprob gathering and vLLM's per-position dict shape."""

from __future__ import annotations

import torch

from minivllm.request import Request
from minivllm.runner_outputs import Logprob
from minivllm.sample.logprobs import gather_logprobs, make_position_logprobs
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def test_gather_matches_direct_computation() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 20, generator=g)
    tokens = torch.tensor([3, 0, 19, 7])
    out = gather_logprobs(logits.log_softmax(-1), 3, tokens)
    for i in range(4):
        lp = torch.log_softmax(logits[i].double(), 0)
        order = lp.argsort(descending=True).tolist()
        assert out.token_ids[i].tolist() == [tokens[i].item(), *order[:3]]
        torch.testing.assert_close(out.logprobs[i].double(), lp[out.token_ids[i]])
        assert out.ranks[i].item() == order.index(tokens[i].item()) + 1


def test_position_dict_shape_as_vllm() -> None:
    # Sampled token 5 is also the top-1: it appears once, with its top rank.
    d = make_position_logprobs([5, 5, 9, 2], [-0.1, -0.1, -2.0, -3.0], 1, 2, ["a", "a", "b", "c"])
    assert d == {5: Logprob(-0.1, 1, "a"), 9: Logprob(-2.0, 2, "b")}
    # Sampled token outside the top-N: N + 1 entries, the sampled one first.
    d = make_position_logprobs([7, 5, 9], [-4.0, -0.1, -2.0], 6, 1, [None, None, None])
    assert list(d) == [7, 5] and d[7].rank == 6 and d[5].rank == 1


def test_sampler_logprobs_are_raw() -> None:
    """Logprobs describe the model's distribution, before temperature, penalties, top-k."""
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(temperature=0.3, top_k=2, repetition_penalty=1.9, logprobs=2),
        SamplingParams(temperature=0.0, logprobs=0),
    ]
    requests = [Request(str(i), [1, 2, 3], p) for i, p in enumerate(params)]
    md = SamplingMetadata.from_requests(requests, torch.device("cpu"), {}, 16)
    assert md.max_num_logprobs == 2
    out = Sampler(torch.Generator().manual_seed(0))(logits, md)
    raw = logits.log_softmax(-1)
    lists = out.logprobs_tensors.tolists()
    for i in range(2):
        token = out.sampled_token_ids[i].item()
        assert lists.token_ids[i][0] == token
        assert abs(lists.logprobs[i][0] - raw[i, token].item()) < 1e-6
        assert lists.token_ids[i][1:] == raw[i].topk(2).indices.tolist()
