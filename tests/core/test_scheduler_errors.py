"""Requests that fail inside a step: a row the runner reports failed, and a whole failed
step. Only the failed requests finish (with ``FINISHED_ERROR`` and the message), their
blocks go back, and every other request continues with the tokens it would have had.
"""

from __future__ import annotations

from minivllm.core.scheduler import Scheduler
from minivllm.request import RequestStatus
from tests.core.test_scheduler import (
    add,
    assert_pool_consistent,
    fake_next_token,
    make_request,
    make_scheduler,
    step,
)


def _run_to_end(sched: Scheduler) -> None:
    while sched.has_unfinished_requests():
        step(sched)
        assert_pool_consistent(sched)


def _solo_outputs(prompts: dict[str, int]) -> dict[str, list[int]]:
    sched = make_scheduler()
    requests = {rid: add(sched, rid, n, max_tokens=6) for rid, n in prompts.items()}
    _run_to_end(sched)
    return {rid: r.output_token_ids for rid, r in requests.items()}


PROMPTS = {"a": 5, "bad": 9, "c": 3, "d": 12}


def test_a_failed_row_finishes_alone() -> None:
    sched = make_scheduler()
    requests = {rid: add(sched, rid, n, max_tokens=6) for rid, n in PROMPTS.items()}
    step(sched)  # prefill: one token each
    out = sched.schedule()
    tokens = {s.request_id: fake_next_token(s.request) for s in out.sampling_requests()}
    finished = sched.update_from_output(out, tokens, {"bad": "logits not finite"})
    bad = requests["bad"]
    assert finished == [bad]
    assert bad.status == RequestStatus.FINISHED_ERROR and bad.get_finished_reason() == "error"
    assert bad.stop_reason == "logits not finite"
    assert bad.num_output_tokens == 1  # the failed step's token was not appended
    assert "bad" in sched.finished_req_ids and "bad" not in sched.requests
    assert_pool_consistent(sched)
    _run_to_end(sched)
    expected = _solo_outputs({k: v for k, v in PROMPTS.items() if k != "bad"})
    assert {rid: r.output_token_ids for rid, r in requests.items() if rid != "bad"} == expected
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks


def test_a_failed_step_fails_exactly_its_requests() -> None:
    # A budget of 16 tokens: "d" (12 tokens) waits while a, bad and (a chunk of) c run.
    sched = make_scheduler(max_num_batched_tokens=16)
    requests = {rid: add(sched, rid, n, max_tokens=6) for rid, n in PROMPTS.items()}
    out = sched.schedule()
    assert [s.request_id for s in out.scheduled] == ["a", "bad", "c"]
    failed = sched.fail_step(out, "RuntimeError: injected", resend_finished=False)
    assert failed == [requests["a"], requests["bad"], requests["c"]]
    for r in failed:
        assert r.status == RequestStatus.FINISHED_ERROR
        assert r.stop_reason == "RuntimeError: injected"
    assert sched.finished_req_ids == {"a", "bad", "c"}
    assert_pool_consistent(sched)
    # Failing the same step again (its tokens arriving late, say) changes nothing.
    assert sched.fail_step(out, "again", resend_finished=False) == []
    _run_to_end(sched)
    assert requests["d"].output_token_ids == _solo_outputs({"d": 12})["d"]
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks


def test_a_failed_step_names_its_finished_requests_again() -> None:
    """The runner may never have read the failed step's finished ids: send them again."""
    sched = make_scheduler()
    add(sched, "short", 3, max_tokens=1)
    add(sched, "long", 3, max_tokens=5)
    step(sched)  # "short" finishes
    out = sched.schedule()
    assert out.finished_req_ids == {"short"}
    sched.fail_step(out, "boom", resend_finished=True)
    assert sched.schedule().finished_req_ids == {"short", "long"}


def test_a_reused_id_is_not_failed_by_an_old_step() -> None:
    sched = make_scheduler()
    first = add(sched, "x", 4, max_tokens=1)
    out = sched.schedule()
    sched.update_from_output(out, {"x": 1})
    assert first.is_finished()
    second = add(sched, "x", 4, max_tokens=3)
    assert sched.fail_step(out, "late failure", resend_finished=False) == []
    assert second.status == RequestStatus.WAITING


def test_a_failed_requests_blocks_leave_the_prefix_cache() -> None:
    """Blocks are indexed when allocated, before the step writes them: after a failed
    step a request with the same prompt must not hit them."""
    sched = make_scheduler()
    kv = sched.kv_cache_manager
    shared = [1, 2, 3, 4]  # one full block of 4
    add(sched, "first", [*shared, 9, 9, 9, 9, 5])
    step(sched)  # "first" computed both its full blocks in a good step
    add(sched, "second", [*shared, 6, 6, 6, 6, 7])  # hits the shared block
    out = sched.schedule()
    assert [s.request_id for s in out.scheduled] == ["first", "second"]
    sched.fail_step(out, "boom", resend_finished=False)
    for prompt in ([*shared, 9, 9, 9, 9, 5], [*shared, 6, 6, 6, 6, 8]):
        _, num_hit = kv.get_computed_blocks(make_request(sched, "probe", prompt))
        assert num_hit == 0  # every holder failed: nothing of theirs is trusted
    assert kv.num_free_blocks == kv.num_blocks


def test_a_failed_row_keeps_a_block_a_live_request_holds() -> None:
    """Only the failed request's own blocks leave the index; one it shares with a live
    request (written by an earlier, good step) stays a prefix-cache hit."""
    sched = make_scheduler()
    kv = sched.kv_cache_manager
    shared = [1, 2, 3, 4]
    add(sched, "live", [*shared, 9, 9, 9, 9, 5], max_tokens=6)
    step(sched)
    add(sched, "bad", [*shared, 6, 6, 6, 6, 7])
    out = sched.schedule()
    tokens = {s.request_id: fake_next_token(s.request) for s in out.sampling_requests()}
    sched.update_from_output(out, tokens, {"bad": "logits not finite"})
    _, hit_shared = kv.get_computed_blocks(make_request(sched, "p1", [*shared, 6, 6, 6, 6, 8]))
    assert hit_shared == 4  # the shared block, not bad's own second block
    _run_to_end(sched)
    assert kv.num_free_blocks == kv.num_blocks
