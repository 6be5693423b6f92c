"""check_stop: each stop rule, and the order in which vLLM applies them."""

from __future__ import annotations

import pytest

from minivllm.core.sched_utils import check_stop
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

EOS = 2
MAX_MODEL_LEN = 64


def _request(outputs: list[int], prompt_len: int = 4, eos: int | None = EOS, **params) -> Request:
    params.setdefault("max_tokens", 10)
    req = Request("r", list(range(10, 10 + prompt_len)), SamplingParams(**params), eos_token_id=eos)
    req.append_output_token_ids(outputs)
    return req


def test_plain_token_does_not_stop():
    req = _request([7])
    assert not check_stop(req, MAX_MODEL_LEN)
    assert req.status == RequestStatus.WAITING
    assert req.stop_reason is None


def test_eos_stops_with_no_stop_reason():
    req = _request([7, EOS])
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason is None
    assert req.get_finished_reason() == "stop"


def test_ignore_eos_keeps_going():
    req = _request([EOS], ignore_eos=True)
    assert not check_stop(req, MAX_MODEL_LEN)


def test_no_eos_token_means_no_eos_stop():
    req = _request([EOS], eos=None)
    assert not check_stop(req, MAX_MODEL_LEN)


def test_stop_token_id_sets_stop_reason():
    req = _request([5, 9], stop_token_ids=[9])
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == 9


def test_generation_config_eos_ids_stop_like_stop_tokens():
    params = SamplingParams(max_tokens=10)
    params.update_from_generation_config({EOS, 99})
    req = Request("r", [1, 3], params, eos_token_id=EOS)
    req.append_output_token_ids(99)
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.stop_reason == 99


def test_min_tokens_suppresses_eos_and_stop_tokens():
    req = _request([EOS], min_tokens=3, stop_token_ids=[9])
    assert not check_stop(req, MAX_MODEL_LEN)
    req.append_output_token_ids(9)
    assert not check_stop(req, MAX_MODEL_LEN)
    req.append_output_token_ids(EOS)  # the third token: min_tokens reached
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.status == RequestStatus.FINISHED_STOPPED


def test_max_tokens_caps_length():
    req = _request([5, 6], max_tokens=3)
    assert not check_stop(req, MAX_MODEL_LEN)
    req.append_output_token_ids(7)
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req.get_finished_reason() == "length"


def test_max_model_len_caps_length():
    req = _request([5, 6], prompt_len=6, max_tokens=50)
    assert check_stop(req, max_model_len=8)
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_max_model_len_wins_over_min_tokens():
    # Upstream would keep the request alive here with no position left to write to.
    req = _request([5, 6], prompt_len=6, max_tokens=20, min_tokens=10)
    assert check_stop(req, max_model_len=8)
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


@pytest.mark.parametrize(
    ("last", "status", "reason"),
    [
        (EOS, RequestStatus.FINISHED_STOPPED, None),
        (9, RequestStatus.FINISHED_STOPPED, 9),
        (5, RequestStatus.FINISHED_LENGTH_CAPPED, None),
    ],
)
def test_token_rules_come_before_the_length_rule(last, status, reason):
    req = _request([1, last], max_tokens=2, stop_token_ids=[9])
    assert check_stop(req, MAX_MODEL_LEN)
    assert req.status == status
    assert req.stop_reason == reason
