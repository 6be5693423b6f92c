"""The scheduler driven by a fake model whose next token is a function of the context.

Because the fake token depends only on the tokens so far, a request must produce the same
output however it was batched, chunked or preempted; the property-based tests at the end
use that to check preemption by recompute against a run with a pool too big to preempt.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

VOCAB = 50


def fake_next_token(request: Request) -> int:
    """The 'model': a deterministic hash of every token of the request so far."""
    data = b",".join(str(t).encode() for t in request.all_token_ids)
    return zlib.crc32(data) % VOCAB


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    enable_chunked_prefill: bool = True,
    enable_caching: bool = True,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        max_model_len=max_model_len,
    )
    return Scheduler(config, KVCacheManager(num_blocks, block_size, enable_caching))


def make_request(
    sched: Scheduler,
    rid: str,
    prompt: list[int] | int,
    max_tokens: int = 4,
    eos: int | None = None,
    **params,
) -> Request:
    if isinstance(prompt, int):
        prompt = [(7 * i + zlib.crc32(rid.encode())) % VOCAB for i in range(prompt)]
    hasher = get_request_block_hasher(sched.kv_cache_manager.block_size)
    return Request(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens, **params),
        eos_token_id=eos,
        block_hasher=hasher,
    )


def add(sched: Scheduler, rid: str, prompt: list[int] | int, **kwargs) -> Request:
    req = make_request(sched, rid, prompt, **kwargs)
    sched.add_request(req)
    return req


def step(sched: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    """One engine step: schedule, 'run the model', feed the tokens back."""
    out = sched.schedule()
    tokens = {s.request_id: fake_next_token(s.request) for s in out.sampling_requests()}
    return out, sched.update_from_output(out, tokens)


def scheduled_tokens(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request_id, s.num_scheduled_tokens) for s in out.scheduled]


def held_block_ids(sched: Scheduler) -> Counter:
    return Counter(
        b.block_id for blocks in sched.kv_cache_manager.req_to_blocks.values() for b in blocks
    )


def assert_pool_consistent(sched: Scheduler) -> None:
    """Ref counts equal holders; a block is free exactly when nobody holds it."""
    kv = sched.kv_cache_manager
    holders = held_block_ids(sched)
    blocks = {b.block_id: b for bs in kv.req_to_blocks.values() for b in bs}
    for block_id, n in holders.items():
        assert blocks[block_id].ref_cnt == n, f"block {block_id}"
    free_ids = {b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()}
    assert not free_ids & set(holders), "a block is both free and held"
    assert all(b.ref_cnt == 0 for b in kv.block_pool.free_block_queue.get_all_free_blocks())
    assert kv.num_free_blocks == len(free_ids)
    assert kv.num_free_blocks + len(holders) == kv.num_blocks
    # Only running requests hold blocks (waiting and preempted ones hold none).
    assert {rid for rid, bs in kv.req_to_blocks.items() if bs} <= {
        r.request_id for r in sched.running
    }


# --------------------------------------------------------------------------- budgets


def test_chunked_prefill_splits_a_long_prompt_by_the_budget():
    sched = make_scheduler(max_num_batched_tokens=8)
    req = add(sched, "a", 20, max_tokens=2)
    plan = []
    for _ in range(3):
        out, _ = step(sched)
        (s,) = out.scheduled
        plan.append((s.num_computed_tokens, s.num_scheduled_tokens, s.needs_sample))
    assert plan == [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert req.num_output_tokens == 1  # partial prefills produced no token
    out, finished = step(sched)
    assert scheduled_tokens(out) == [("a", 1)]
    assert finished == [req] and req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_running_requests_first_then_new_ones_share_one_batch():
    sched = make_scheduler(max_num_batched_tokens=10)
    add(sched, "a", 4, max_tokens=5)
    out, _ = step(sched)
    assert scheduled_tokens(out) == [("a", 4)]
    add(sched, "b", 20, max_tokens=2)
    out, _ = step(sched)
    # A decode of a and the first chunk of b's prompt in the same batch, a first.
    assert scheduled_tokens(out) == [("a", 1), ("b", 9)]
    assert out.total_num_scheduled_tokens == 10
    assert out.new_req_ids == ["b"]
    assert [s.request_id for s in out.sampling_requests()] == ["a"]
    out, _ = step(sched)
    assert scheduled_tokens(out) == [("a", 1), ("b", 9)]
    out, _ = step(sched)
    assert scheduled_tokens(out) == [("a", 1), ("b", 2)]
    assert [s.request_id for s in out.sampling_requests()] == ["a", "b"]


def test_output_snapshots_the_positions_before_the_step():
    sched = make_scheduler(max_num_batched_tokens=5)
    req = add(sched, "a", 7)
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.num_computed_tokens, s.num_computed_tokens_after) == (0, 5)
    assert s.token_ids == req.prompt_token_ids[:5]
    # Advanced before the model runs, so the next chunk could be scheduled right away.
    assert req.num_computed_tokens == 5
    assert s.block_ids == sched.kv_cache_manager.get_block_ids("a")
    assert len(s.block_ids) == 2  # 5 tokens in blocks of 4


def test_max_num_seqs_limits_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    reqs = [add(sched, rid, 3, max_tokens=3) for rid in "abc"]
    out, _ = step(sched)
    assert out.req_ids == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]
    while not reqs[0].is_finished():
        out, _ = step(sched)
        assert len(out.scheduled) <= 2
    out, _ = step(sched)
    assert "c" in out.new_req_ids


def test_waiting_requests_are_admitted_in_arrival_order():
    sched = make_scheduler(max_num_batched_tokens=6)
    for rid in "abcd":
        add(sched, rid, 3, max_tokens=1)
    out, _ = step(sched)
    assert out.req_ids == ["a", "b"]
    out, _ = step(sched)
    assert out.req_ids == ["c", "d"]


def test_head_of_line_blocks_when_its_blocks_do_not_fit():
    sched = make_scheduler(num_blocks=6, block_size=4)
    add(sched, "a", 12, max_tokens=4)  # 3 blocks now
    step(sched)
    add(sched, "b", 16, max_tokens=1)  # needs 4 blocks: does not fit in the 3 left
    add(sched, "c", 2, max_tokens=1)  # would fit, but must not overtake b
    out, _ = step(sched)
    assert out.req_ids == ["a"]
    assert [r.request_id for r in sched.waiting] == ["b", "c"]


def test_chunked_prefill_disabled_stops_admission():
    sched = make_scheduler(
        max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False
    )
    add(sched, "a", 10, max_tokens=2)
    add(sched, "b", 10, max_tokens=2)  # 10 > 6 left: not split, not admitted
    add(sched, "c", 2, max_tokens=2)  # fits, but FCFS stops at b
    out, _ = step(sched)
    assert scheduled_tokens(out) == [("a", 10)]
    out, _ = step(sched)
    assert scheduled_tokens(out) == [("a", 1), ("b", 10), ("c", 2)]


def test_chunked_prefill_disabled_needs_a_budget_of_max_model_len():
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        make_scheduler(max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=False)


# --------------------------------------------------------------------------- preemption


def _fill_pool_then_grow() -> tuple[Scheduler, list[Request]]:
    """Three requests that exactly fill an 6-block pool, all about to need a 3rd block."""
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    reqs = [add(sched, rid, 8, max_tokens=6) for rid in "abc"]
    out, _ = step(sched)  # prefill: 8 tokens = 2 full blocks each
    assert out.req_ids == ["a", "b", "c"] and sched.kv_cache_manager.num_free_blocks == 0
    return sched, reqs


def test_preemption_evicts_the_most_recently_admitted_and_requeues_it_first():
    sched, (a, b, c) = _fill_pool_then_grow()
    late = add(sched, "late", 2, max_tokens=1)
    out, _ = step(sched)
    # a needs a block: c (the tail) is preempted; b then needs one: c's second block.
    assert out.preempted_req_ids == {"c"}
    assert out.req_ids == ["a", "b"]
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0 and c.num_preemptions == 1
    assert sched.kv_cache_manager.get_block_ids("c") == []
    # Front of the queue, ahead of the request that was already waiting; and nothing was
    # admitted in a step that preempted.
    assert list(sched.waiting) == [c, late]
    assert sched.num_preemptions == 1
    assert_pool_consistent(sched)


def test_a_request_that_cannot_grow_preempts_itself():
    sched = make_scheduler(num_blocks=4, block_size=4)
    a = add(sched, "a", 4, max_tokens=4)
    b = add(sched, "b", 7, max_tokens=6)
    step(sched)  # a: 1 block, b: 2 blocks
    step(sched)  # a's first decode opens its 2nd block; pool full
    assert sched.kv_cache_manager.num_free_blocks == 0
    out, _ = step(sched)  # b needs a 3rd block and is itself the tail: it preempts itself
    assert out.req_ids == ["a"] and out.preempted_req_ids == {"b"}
    assert b.status == RequestStatus.PREEMPTED and sched.running == [a]
    assert list(sched.waiting) == [b]


def test_preempted_request_resumes_recomputes_and_matches_an_unpreempted_run():
    sched, reqs = _fill_pool_then_grow()
    outs = []
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        outs.append(out)
        assert_pool_consistent(sched)
    preempted = [rid for out in outs for rid in sorted(out.preempted_req_ids)]
    resumed = [s for out in outs for s in out.scheduled if s.is_resumed]
    assert preempted[:2] == ["c", "b"]  # c in the first growth step, then b (a stays)
    # Everyone preempted came back, the latest victim first (it went to the front).
    assert [s.request_id for s in resumed] == preempted[::-1][: len(resumed)]
    assert sorted(s.request_id for s in resumed) == sorted(preempted)
    # It recomputes its prompt and the tokens it had generated, minus any prefix hit.
    for s in resumed:
        assert s.is_new
        assert s.num_computed_tokens == s.request.num_cached_tokens
        assert s.needs_sample  # it caught up with all its tokens in one go ...
        assert s.num_computed_tokens_after > s.request.num_prompt_tokens  # ... outputs too

    big = make_scheduler(num_blocks=64)
    ref = [add(big, r.request_id, r.prompt_token_ids, max_tokens=6) for r in reqs]
    while big.has_unfinished_requests():
        step(big)
    assert big.num_preemptions == 0
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in ref]


# --------------------------------------------------------------------------- prefix cache


def test_shared_prefix_is_reused_at_admission():
    sched = make_scheduler(block_size=4)
    prefix = list(range(12))
    add(sched, "a", prefix + [40, 41], max_tokens=1)
    step(sched)
    b = add(sched, "b", prefix + [42], max_tokens=1)
    out, _ = step(sched)
    (s,) = out.scheduled
    assert b.num_cached_tokens == 12
    assert (s.num_computed_tokens, s.num_scheduled_tokens) == (12, 1)
    assert s.block_ids[:3] == out.scheduled[0].block_ids[:3]
    stats = sched.make_stats()
    assert stats.prefix_cache_hits >= 12 and stats.prefix_cache_hit_rate > 0


# --------------------------------------------------------------------------- stopping


def test_eos_finishes_and_frees_the_request():
    sched = make_scheduler()
    probe = make_request(sched, "a", 5)
    eos = fake_next_token(probe)  # the first token the fake model will produce
    req = add(sched, "a", probe.prompt_token_ids, max_tokens=10, eos=eos)
    out, finished = step(sched)
    assert finished == [req]
    assert req.status == RequestStatus.FINISHED_STOPPED and req.output_token_ids == [eos]
    assert not sched.has_unfinished_requests() and "a" not in sched.requests
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks
    out = sched.schedule()
    assert out.finished_req_ids == {"a"} and out.is_empty
    assert sched.schedule().finished_req_ids == set()


def test_stop_token_id_finishes_with_a_stop_reason():
    sched = make_scheduler()
    probe = make_request(sched, "a", 5)
    tok = fake_next_token(probe)
    req = add(sched, "a", probe.prompt_token_ids, max_tokens=10, stop_token_ids=[tok])
    _, finished = step(sched)
    assert finished == [req] and req.stop_reason == tok


def test_max_model_len_caps_generation():
    sched = make_scheduler(max_model_len=12)
    req = add(sched, "a", 9, max_tokens=10)  # may grow to 12 tokens: 3 outputs
    while sched.has_unfinished_requests():
        step(sched)
    assert req.num_tokens == 12 and req.status == RequestStatus.FINISHED_LENGTH_CAPPED


# --------------------------------------------------------------------------- API edges


def test_add_request_rejects_a_prompt_without_room_to_generate():
    sched = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match=r"request long: prompt of 16 tokens.*max_model_len=16"):
        add(sched, "long", 16)
    assert not sched.has_unfinished_requests() and sched.requests == {}


def test_add_request_rejects_a_request_the_pool_can_never_hold():
    sched = make_scheduler(num_blocks=3, block_size=4)
    with pytest.raises(ValueError, match="KV pool too small for request big"):
        add(sched, "big", 10, max_tokens=4)  # grows to 13 computed tokens: 4 blocks
    add(sched, "ok", 10, max_tokens=3)  # 12 computed tokens: exactly 3 blocks
    assert [r.request_id for r in sched.waiting] == ["ok"]


def test_add_request_rejects_a_duplicate_id():
    sched = make_scheduler()
    add(sched, "a", 3)
    with pytest.raises(ValueError, match="already in use"):
        add(sched, "a", 3)


def test_finish_requests_aborts_running_and_waiting_requests():
    sched = make_scheduler(max_num_seqs=1)
    a = add(sched, "a", 5, max_tokens=8)
    b = add(sched, "b", 5, max_tokens=8)
    step(sched)
    done = sched.finish_requests(["a", "b", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert done == [a, b]
    assert a.get_finished_reason() == "abort" and b.is_finished()
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks
    assert sched.schedule().finished_req_ids == {"a", "b"}
    with pytest.raises(ValueError, match="finished status"):
        sched.finish_requests("a", RequestStatus.RUNNING)


def test_a_request_aborted_during_its_step_drops_its_token():
    sched = make_scheduler()
    a = add(sched, "a", 5)
    out = sched.schedule()
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(out, {"a": 3}) == []
    assert a.output_token_ids == []


def test_update_from_output_checks_the_tokens_before_changing_anything():
    sched = make_scheduler()
    a = add(sched, "a", 5)
    b = add(sched, "b", 5)
    out = sched.schedule()
    with pytest.raises(ValueError, match="2 requests were due to sample"):
        sched.update_from_output(out, [1])
    with pytest.raises(ValueError, match="due to sample"):
        sched.update_from_output(out, {"a": 1, "zz": 2})
    assert a.output_token_ids == [] and b.output_token_ids == []
    sched.update_from_output(out, [11, 12])  # a list aligned with sampling_requests()
    assert (a.output_token_ids, b.output_token_ids) == ([11], [12])


# --------------------------------------------------------------------------- async


def test_async_schedules_the_next_decode_before_its_input_token_is_known():
    sched = make_scheduler()
    a = add(sched, "a", 5, max_tokens=3)
    first = sched.schedule()  # the prefill, which samples
    assert a.num_output_placeholders == 1
    second = sched.schedule()  # scheduled ahead: its input is the token in flight
    (s,) = second.scheduled
    assert (s.num_computed_tokens, s.num_scheduled_tokens, s.needs_sample) == (5, 1, True)
    assert s.token_ids == []  # not known on the host yet: the runner fills it on the device
    assert a.num_output_placeholders == 2
    sched.update_from_output(first, {"a": 7})
    assert a.output_token_ids == [7] and a.num_output_placeholders == 1
    assert s.token_ids == [7]


def test_async_does_not_schedule_a_step_past_max_tokens():
    sched = make_scheduler()
    a = add(sched, "a", 5, max_tokens=2)
    first, second = sched.schedule(), sched.schedule()
    # Two tokens are in flight, as many as max_tokens: a third step would be wasted.
    assert sched.schedule().is_empty
    sched.update_from_output(first, {"a": 7})
    assert sched.update_from_output(second, {"a": 8}) == [a]
    assert a.output_token_ids == [7, 8] and a.get_finished_reason() == "length"


def test_async_drops_the_token_of_a_step_scheduled_after_the_request_stopped():
    sched = make_scheduler()
    a = add(sched, "a", 5, max_tokens=10, eos=0)
    first, second = sched.schedule(), sched.schedule()
    assert sched.update_from_output(first, {"a": 0}) == [a]  # EOS
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks
    assert sched.update_from_output(second, {"a": 9}) == []
    assert a.output_token_ids == [0] and sched.num_generated_tokens == 1


def _preempt_with_a_token_in_flight(c_max_tokens: int) -> tuple[Scheduler, SchedulerOutput]:
    """Three prefills fill a 6-block pool; the step scheduled ahead of their tokens needs
    a 3rd block for each, so it preempts c, whose first token is still in flight."""
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    for rid in "ab":
        add(sched, rid, 8, max_tokens=6)
    add(sched, "c", 8, max_tokens=c_max_tokens)
    prefill = sched.schedule()
    ahead = sched.schedule()
    assert ahead.preempted_req_ids == {"c"} and ahead.req_ids == ["a", "b"]
    return sched, prefill


def test_async_preempted_request_keeps_the_token_of_its_step_in_flight():
    sched, prefill = _preempt_with_a_token_in_flight(c_max_tokens=6)
    c = sched.requests["c"]
    assert c.status == RequestStatus.PREEMPTED and c.num_output_placeholders == 1
    # Even with room to spare, c is not readmitted before its token is known.
    sched.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert sched.schedule().is_empty and list(sched.waiting) == [c]
    sched.update_from_output(prefill, {"a": 5, "b": 5, "c": 6})
    assert c.output_token_ids == [6] and c.num_output_placeholders == 0
    (s,) = sched.schedule().scheduled  # now it recomputes, its token included
    assert s.is_resumed and s.num_scheduled_tokens == 9 and s.token_ids[-1] == 6


def test_async_preempted_request_can_finish_from_the_waiting_queue():
    sched, prefill = _preempt_with_a_token_in_flight(c_max_tokens=1)
    c = sched.requests["c"]
    finished = sched.update_from_output(prefill, {"a": 5, "b": 5, "c": 6})
    assert finished == [c] and c.get_finished_reason() == "length"
    assert not sched.waiting and "c" not in sched.requests
    assert_pool_consistent(sched)


def test_stats_track_preemptions_and_peak_usage():
    sched, _ = _fill_pool_then_grow()
    step(sched)
    stats = sched.make_stats()
    assert stats.num_preemptions == 1 and stats.peak_blocks_in_use == 6
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (2, 1)
    assert stats.kv_cache_usage == pytest.approx(1.0)
    assert stats.num_steps == 2


# --------------------------------------------------------------------------- properties


@dataclass
class Workload:
    block_size: int
    num_blocks: int
    max_num_seqs: int
    budget: int
    chunked: bool
    caching: bool
    # (arrival step, prompt, max_tokens)
    requests: list[tuple[int, list[int], int]] = field(default_factory=list)


MAX_MODEL_LEN = 48
EOS = 0


@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.sampled_from([1, 2, 4]))
    shared = draw(st.lists(st.integers(1, VOCAB - 1), min_size=0, max_size=20))
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        prefix = shared[: draw(st.integers(0, len(shared)))]
        own = draw(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=12))
        prompt = (prefix + own)[: MAX_MODEL_LEN - 1]
        requests.append((draw(st.integers(0, 6)), prompt, draw(st.integers(1, 16))))
    longest = max(min(len(p) + m, MAX_MODEL_LEN) - 1 for _, p, m in requests)
    min_blocks = -(-longest // block_size)  # the smallest pool every request fits alone
    chunked = draw(st.booleans())
    return Workload(
        block_size=block_size,
        # Barely enough for the longest request alone: forces preemptions.
        num_blocks=min_blocks + draw(st.integers(0, 3)),
        max_num_seqs=draw(st.integers(1, 6)),
        budget=draw(st.integers(1, 24)) if chunked else MAX_MODEL_LEN,
        chunked=chunked,
        caching=draw(st.booleans()),
        requests=requests,
    )


def run_workload(
    w: Workload, big: bool = False, async_scheduling: bool = False
) -> tuple[Scheduler, dict[str, list[int]]]:
    """Run to completion, checking the invariants after every step.

    With ``async_scheduling`` the loop is the engine's: step N+1 is scheduled before step
    N's tokens come back. The fake model reads its context when the step's tokens are
    handed back, which is when a real device would have read it: after every earlier
    step's token was written.
    """
    sched = make_scheduler(
        num_blocks=1024 if big else w.num_blocks,
        block_size=w.block_size,
        max_num_seqs=64 if big else w.max_num_seqs,
        max_num_batched_tokens=4096 if big else w.budget,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=w.chunked,
        enable_caching=w.caching,
    )
    reqs: dict[str, Request] = {}
    in_flight: SchedulerOutput | None = None
    for step_no in range(2000):
        for i, (arrival, prompt, max_tokens) in enumerate(w.requests):
            if arrival == step_no:
                reqs[f"r{i}"] = add(sched, f"r{i}", prompt, max_tokens=max_tokens, eos=EOS)
        if step_no > max(a for a, _, _ in w.requests) and not sched.has_unfinished_requests():
            break
        pending = sched.has_unfinished_requests()
        out = sched.schedule()
        if not async_scheduling:
            assert out.is_empty != pending, "no progress while requests are pending"
        elif out.is_empty and pending:
            assert in_flight is not None, "no progress while requests are pending"
        assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        assert len(out.scheduled) <= sched.max_num_seqs
        assert len(sched.running) <= sched.max_num_seqs
        assert len(set(out.req_ids)) == len(out.req_ids)
        if out.preempted_req_ids:  # a step that preempts admits nobody
            assert not out.new_req_ids
        assert not set(out.req_ids) & out.preempted_req_ids
        if async_scheduling:
            out, in_flight = in_flight, out
        if out is not None:
            tokens = {s.request_id: fake_next_token(s.request) for s in out.sampling_requests()}
            sched.update_from_output(out, tokens)
        assert_pool_consistent(sched)
    else:
        pytest.fail("the workload did not finish")
    if in_flight is not None:  # only tokens past the requests' ends are left
        sched.update_from_output(in_flight, [0] * len(in_flight.sampling_requests()))
    assert all(r.is_finished() and r.num_output_placeholders == 0 for r in reqs.values())
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks and not any(kv.req_to_blocks.values())
    return sched, {rid: list(r.output_token_ids) for rid, r in reqs.items()}


@settings(
    max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(workloads())
def test_random_workloads_keep_invariants_and_match_an_unconstrained_run(w: Workload):
    sched, outputs = run_workload(w)
    target(float(sched.num_preemptions), label="preemptions")  # steer towards preemption
    _, reference = run_workload(w, big=True)
    assert outputs == reference
    _, async_outputs = run_workload(w, async_scheduling=True)
    assert async_outputs == reference
    for i, (_, prompt, max_tokens) in enumerate(w.requests):
        toks = outputs[f"r{i}"]
        assert 1 <= len(toks) <= min(max_tokens, MAX_MODEL_LEN - len(prompt))
        assert EOS not in toks[:-1]
