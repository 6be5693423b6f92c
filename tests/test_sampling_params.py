"""SamplingParams validates every field when built, naming the field."""

from __future__ import annotations

import pytest

from minivllm.sampling_params import SamplingParams, SamplingType


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(n=0), "n"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(logprobs=-1), "logprobs"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(stop=["ok", ""]), "stop"),
        (dict(stop=""), "stop"),
        (dict(top_p=-0.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(prompt_logprobs=-2), "prompt_logprobs"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(n=2, temperature=0.0), "n"),
        (dict(stop_token_ids=[1, "2"]), "stop_token_ids"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field: str) -> None:
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**kwargs)


def test_greedy_normalisation_and_types() -> None:
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=5)
    assert greedy.sampling_type == SamplingType.GREEDY
    assert (greedy.top_p, greedy.top_k) == (1.0, 0)
    assert SamplingParams(temperature=0.8).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.8, seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="x").stop == ["x"]


def test_eos_from_generation_config_respects_ignore_eos() -> None:
    p = SamplingParams(stop_token_ids=[7])
    q = SamplingParams(stop_token_ids=[7], ignore_eos=True)
    p.update_from_generation_config({2})
    q.update_from_generation_config({2})
    assert p.all_stop_token_ids == {2, 7}
    assert q.all_stop_token_ids == {7}


def test_vllm_normalisations() -> None:
    """Boundary values are legal, and vLLM's input conveniences are honoured."""
    SamplingParams(top_p=1.0, min_p=0.0, min_tokens=4, max_tokens=4, logprobs=0)
    SamplingParams(min_p=1.0, top_k=1, n=3, temperature=0.5)
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(logprobs=True).logprobs == 1
    # A tiny positive temperature is raised to 0.01 (random), not turned greedy.
    tiny = SamplingParams(temperature=1e-4)
    assert tiny.temperature == 0.01 and tiny.sampling_type == SamplingType.RANDOM


def test_min_tokens_stop_ids_include_eos_even_with_ignore_eos() -> None:
    """vLLM masks EOS during min_tokens regardless of ignore_eos."""
    q = SamplingParams(stop_token_ids=[7], ignore_eos=True, min_tokens=2)
    q.update_from_generation_config({2, 3})
    assert q.min_tokens_stop_ids == {2, 3, 7}
    assert q.all_stop_token_ids == {7}
