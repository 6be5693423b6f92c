"""SamplingMetadataCache (sample/metadata.py): the last step's metadata is reused only for
the very same requests, in the same order, and only when nothing in it moves with their
progress (seeds, penalties, min_tokens masks)."""

from __future__ import annotations

import torch

from minivllm.sample.metadata import SamplingMetadata, SamplingMetadataCache
from minivllm.sampling_params import SamplingParams
from tests.sample.test_sampler import make_request

CPU = torch.device("cpu")
VOCAB = 32


def _cached(cache: SamplingMetadataCache, requests) -> SamplingMetadata:
    return cache.get(requests, lambda: SamplingMetadata.from_requests(requests, CPU, {}, VOCAB))


def test_same_requests_reuse_and_any_change_rebuilds() -> None:
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_k=4)]  # fmt: skip
    requests = [make_request(i, p, [1, 2], []) for i, p in enumerate(params)]
    cache = SamplingMetadataCache()
    first = _cached(cache, requests)
    assert first.reusable and _cached(cache, list(requests)) is first and cache.hits == 1
    for r in requests:  # progress does not matter to this batch's metadata
        r.append_output_token_ids(3)
    assert _cached(cache, requests) is first
    reordered = _cached(cache, requests[::-1])
    assert reordered is not first
    assert reordered.temperature.tolist() == [1.0, 0.0, 0.5]
    fewer = _cached(cache, requests[1:])
    assert fewer is not reordered and fewer.temperature.tolist() == [0.0, 1.0]
    newcomer = make_request(9, SamplingParams(temperature=0.25), [1], [])
    grown = _cached(cache, [*requests[1:], newcomer])
    assert grown is not fewer and grown.temperature.tolist() == [0.0, 1.0, 0.25]


def test_metadata_that_moves_with_progress_is_never_reused() -> None:
    moving = {
        "seed": SamplingParams(temperature=0.7, seed=5),
        "penalty": SamplingParams(temperature=0.7, presence_penalty=0.5),
        "min_tokens": SamplingParams(temperature=0.7, min_tokens=3, stop_token_ids=[4]),
    }
    for name, params in moving.items():
        requests = [make_request(0, SamplingParams(temperature=0.5), [1], []),
                    make_request(1, params, [1, 2], [])]  # fmt: skip
        generators = {"1": torch.Generator().manual_seed(5)} if name == "seed" else {}
        cache = SamplingMetadataCache()

        def build(requests=requests, generators=generators) -> SamplingMetadata:
            return SamplingMetadata.from_requests(requests, CPU, generators, VOCAB)

        first = cache.get(requests, build)
        assert not first.reusable, name
        requests[1].append_output_token_ids(6)
        second = cache.get(requests, build)
        assert second is not first and cache.hits == 0, name
        if name == "seed":  # the position the row samples moved on
            assert second.seeds[1][1] == first.seeds[1][1] + 1


def test_min_tokens_met_is_reusable_and_only_the_same_objects_hit() -> None:
    """Once min_tokens is met nothing masks the row; and a request equal in every field
    but another object (a new request under the same id) is not a hit."""
    done = make_request(0, SamplingParams(temperature=0.7, min_tokens=1, stop_token_ids=[4]),
                        [1], [2])  # fmt: skip
    cache = SamplingMetadataCache()
    first = _cached(cache, [done])
    assert first.reusable and _cached(cache, [done]) is first
    twin = make_request(0, SamplingParams(temperature=0.7, min_tokens=1, stop_token_ids=[4]),
                        [1], [2])  # fmt: skip
    assert _cached(cache, [twin]) is not first and cache.hits == 1
    fresh = make_request(0, SamplingParams(temperature=0.0), [1], [])
    assert _cached(cache, [fresh]).all_greedy


def test_engine_decode_steps_reuse_the_metadata(llm) -> None:
    """Through the engine: the runner reuses the metadata across a decode phase, and a
    greedy request beside sampled ones still gets the argmax (its row's temperature 0
    travels in the reused tensor)."""
    hits = llm.collective_rpc(lambda runner: runner._metadata_cache.hits)[0]
    prompts = ["the cat sat", "hello world", "a b c", "one two three"]
    params = [SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True) for _ in prompts]
    params[1] = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    alone = llm.generate([prompts[1]], params[1], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [8] * 4
    assert outs[1].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert llm.collective_rpc(lambda runner: runner._metadata_cache.hits)[0] > hits
