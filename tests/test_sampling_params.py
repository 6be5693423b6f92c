"""SamplingParams validates every field when built, naming the field and the value."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from minivllm.sampling_params import RequestOutputKind, SamplingParams, SamplingType

NAN, INF = float("nan"), float("inf")
INT64_MAX = 2**63 - 1
FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
INT_FIELDS = ("n", "top_k", "min_tokens", "seed", "max_tokens", "logprobs", "prompt_logprobs")
BOOL_FIELDS = ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens")

# Out-of-range values of the right type.
RANGE_CASES = [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=-0.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(n=0), "n"),
    (dict(n=16385, temperature=1.0), "n"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
    (dict(logprobs=-1), "logprobs"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"),
    (dict(prompt_logprobs=-2), "prompt_logprobs"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(n=2, temperature=0.0), "n"),
    (dict(stop=["ok", ""]), "stop"),
    (dict(stop=""), "stop"),
]

# Values of the wrong type, NaN and infinities: the list and more.
TYPE_CASES = [
    *[(dict(**{f: v}), f) for f in FLOAT_FIELDS for v in (NAN, INF, -INF, 1e39, "0.5", None)],
    *[(dict(**{f: True}), f) for f in FLOAT_FIELDS],
    *[
        (dict(**{f: v}), f)
        for f in INT_FIELDS
        for v in (True, False, 2.0, "3", 1.5, NAN)
        if not (v is True and f.endswith("logprobs"))  # vLLM's True = 1 convenience
    ],
    *[(dict(**{f: v}), f) for f in ("n", "top_k", "min_tokens") for v in (None, [1])],
    *[(dict(**{f: v}), f) for f in INT_FIELDS for v in (2**63, -(2**63) - 1, 2**70)],
    *[(dict(**{f: v}), f) for f in BOOL_FIELDS for v in (1, 0, "false", None)],
    (dict(seed=INT64_MAX, n=2, temperature=1.0), "seed"),
    (dict(seed=INT64_MAX - 2, n=4, temperature=1.0), "seed"),
    (dict(stop=[5]), "stop"),
    (dict(stop=5), "stop"),
    (dict(stop=["a", None]), "stop"),
    (dict(stop={"a"}), "stop"),
    (dict(stop=b"end"), "stop"),
    (dict(stop_token_ids=5), "stop_token_ids"),
    (dict(stop_token_ids="5"), "stop_token_ids"),
    (dict(stop_token_ids=[1, "2"]), "stop_token_ids"),
    (dict(stop_token_ids=[1, 2.0]), "stop_token_ids"),
    (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop_token_ids=[2**64]), "stop_token_ids"),
    (dict(stop_token_ids={3}), "stop_token_ids"),
    (dict(output_kind=3), "output_kind"),
    (dict(output_kind="DELTA"), "output_kind"),
    (dict(output_kind=True), "output_kind"),
    (dict(output_kind=None), "output_kind"),
]


@pytest.mark.parametrize("kwargs, field", RANGE_CASES + TYPE_CASES, ids=repr)
def test_invalid_values_name_the_field(kwargs, field: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    # The message starts with the field's name, so the server can report it as is.
    assert str(err.value).startswith(f"SamplingParams.{field} "), str(err.value)
    assert ", got " in str(err.value)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(temperature=NAN), "SamplingParams.temperature must be a finite number"),
        (dict(seed=True), "SamplingParams.seed must be an integer or None, got True (bool)"),
        (dict(n=2.0), "SamplingParams.n must be an integer, got 2.0 (float)"),
        (dict(max_tokens=3.0), "SamplingParams.max_tokens must be an integer or None, got 3.0"),
        (dict(top_p="0.9"), "SamplingParams.top_p must be a number, got '0.9' (str)"),
        (dict(seed=2**70), "SamplingParams.seed must fit in a signed 64-bit integer"),
        (dict(stop=[5]), "SamplingParams.stop must be a string or a list of strings, got [5]"),
        (dict(stop_token_ids=5), "SamplingParams.stop_token_ids must be a list of"),
    ],
)
def test_messages_name_the_field_and_the_value(kwargs, expected: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value).startswith(expected), str(err.value)


def test_seed_plus_n_overflow_names_both() -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(seed=INT64_MAX - 1, n=3, temperature=1.0)
    assert "seed + n - 1" in str(err.value) and "n=3" in str(err.value)
    # The largest legal seed for n samples: child n - 1 gets exactly INT64_MAX.
    assert SamplingParams(seed=INT64_MAX - 2, n=3, temperature=1.0).seed == INT64_MAX - 2
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_accepted_types_are_normalised() -> None:
    """Ints for float fields, numpy scalars and tuples are taken and stored as builtins."""
    p = SamplingParams(
        temperature=1,
        top_p=np.float32(0.5),
        n=np.int64(2),
        seed=np.int32(3),
        max_tokens=None,
        stop=("a", "b"),
        stop_token_ids=(4, np.int64(5)),
        output_kind=1,
    )
    assert type(p.temperature) is float and p.temperature == 1.0
    assert type(p.top_p) is float and p.top_p == 0.5
    assert type(p.n) is int and type(p.seed) is int
    assert p.max_tokens is None
    assert p.stop == ["a", "b"] and p.stop_token_ids == [4, 5]
    assert all(type(t) is int for t in p.stop_token_ids)
    assert p.output_kind is RequestOutputKind.DELTA
    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    assert SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY).output_kind == 2


def test_greedy_normalisation_and_types() -> None:
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=5)
    assert greedy.sampling_type == SamplingType.GREEDY
    assert (greedy.top_p, greedy.top_k) == (1.0, 0)
    assert SamplingParams(temperature=0.8).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.8, seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop=None, stop_token_ids=None).stop_token_ids == []


def test_eos_from_generation_config_respects_ignore_eos() -> None:
    p = SamplingParams(stop_token_ids=[7])
    q = SamplingParams(stop_token_ids=[7], ignore_eos=True)
    p.update_from_generation_config({2})
    q.update_from_generation_config({2})
    assert p.all_stop_token_ids == {2, 7}
    assert q.all_stop_token_ids == {7}
    # A shallow copy (what n > 1 children get) keeps its own set.
    r = copy.copy(SamplingParams(stop_token_ids=[7]))
    r.update_from_generation_config({3})
    assert r.all_stop_token_ids == {3, 7}


def test_vllm_normalisations() -> None:
    """Boundary values are legal, and vLLM's input conveniences are honoured."""
    SamplingParams(top_p=1.0, min_p=0.0, min_tokens=4, max_tokens=4, logprobs=0)
    SamplingParams(min_p=1.0, top_k=1, n=3, temperature=0.5)
    SamplingParams(n=16384, temperature=1.0, presence_penalty=-2, frequency_penalty=2)
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(logprobs=True).logprobs == 1
    assert SamplingParams(prompt_logprobs=True).prompt_logprobs == 1
    # None means "up to max_model_len", resolved by the engine; min_tokens has no bound.
    assert SamplingParams(max_tokens=None, min_tokens=100).max_tokens is None
    # A tiny positive temperature is raised to 0.01 (random), not turned greedy.
    tiny = SamplingParams(temperature=1e-4)
    assert tiny.temperature == 0.01 and tiny.sampling_type == SamplingType.RANDOM


def test_min_tokens_stop_ids_include_eos_even_with_ignore_eos() -> None:
    """vLLM masks EOS during min_tokens regardless of ignore_eos."""
    q = SamplingParams(stop_token_ids=[7], ignore_eos=True, min_tokens=2)
    q.update_from_generation_config({2, 3})
    assert q.min_tokens_stop_ids == {2, 3, 7}
    assert q.all_stop_token_ids == {7}


def test_engine_filled_fields_are_not_arguments() -> None:
    with pytest.raises(TypeError):
        SamplingParams(all_stop_token_ids={1})  # type: ignore[call-arg]


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_msgspec_round_trip_keeps_every_field(ignore_eos: bool) -> None:
    """The params cross to the engine core as msgpack; decoding re-runs __post_init__."""
    msgspec = pytest.importorskip("msgspec")
    p = SamplingParams(
        temperature=0.7,
        seed=11,
        n=2,
        stop="x",
        stop_token_ids=[7],
        max_tokens=None,
        ignore_eos=ignore_eos,
        output_kind=RequestOutputKind.DELTA,
    )
    p.update_from_generation_config({2})
    q = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams)
    assert q == p
    assert q.output_kind is RequestOutputKind.DELTA
    assert q.all_stop_token_ids == p.all_stop_token_ids == ({7} if ignore_eos else {2, 7})
    assert q.eos_token_ids == {2}
