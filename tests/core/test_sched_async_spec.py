"""How many drafts the scheduler gives a request whose previous step is still in flight:
what synchronous scheduling would give it, or nothing this step."""

from __future__ import annotations

from minivllm.core.sched_async_spec import num_drafts_in_flight
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def _in_flight(
    num_outputs: int, num_prev_drafts: int, max_tokens: int = 50, prompt_len: int = 10
) -> Request:
    """A request whose step in flight verifies ``num_prev_drafts`` drafts, scheduled as
    the scheduler does: every draft counted as computed."""
    request = Request("r", list(range(prompt_len)), SamplingParams(max_tokens=max_tokens))
    request.append_output_token_ids(list(range(num_outputs)))
    request.num_computed_tokens = request.num_tokens + num_prev_drafts
    request.num_output_placeholders = 1 + num_prev_drafts
    return request


def test_far_from_every_limit_it_gets_all_k() -> None:
    assert num_drafts_in_flight(_in_flight(3, 0), 4, 1000) == 4
    assert num_drafts_in_flight(_in_flight(3, 4), 4, 1000) == 4


def test_after_a_step_without_drafts_the_cap_is_known() -> None:
    # 50 - (45 + 1) - 1 = 3 drafts can still matter: as drafts_to_keep would say.
    assert num_drafts_in_flight(_in_flight(45, 0), 4, 1000) == 3
    assert num_drafts_in_flight(_in_flight(48, 0), 4, 1000) == 0


def test_near_max_tokens_with_drafts_in_flight_it_waits() -> None:
    # The step in flight brings between 1 and 3 tokens: synchronously the request would
    # get 50 - 45 - 1 = 4, 3 or 2 drafts, which only the step's result decides.
    assert num_drafts_in_flight(_in_flight(44, 2), 4, 1000) is None
    # Even if all are accepted, 50 - 43 - 1 = 6 >= k: no doubt.
    assert num_drafts_in_flight(_in_flight(40, 2), 4, 1000) == 4


def test_near_max_model_len_with_drafts_in_flight_it_waits() -> None:
    request = _in_flight(5, 2)  # 15 tokens, computed counted as 17
    assert num_drafts_in_flight(request, 3, max_model_len=21) == 3  # positions up to 20
    assert num_drafts_in_flight(request, 3, max_model_len=20) is None
    # Without drafts in flight the length cut is exact, as schedule()'s.
    assert num_drafts_in_flight(_in_flight(5, 0), 3, max_model_len=18) == 2
