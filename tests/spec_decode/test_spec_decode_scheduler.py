"""The scheduler with draft tokens, driven by a fake model that verifies them greedily.

The fake model's next token is a function of the context (as in
tests/core/test_scheduler.py), so a request's output does not depend on how it was
batched. With speculation the
scheduler schedules each request's drafts after its last token; the fake verifier
accepts drafts while they equal the fake model's next token, and adds one token of its
own, as the greedy rejection sampler does. Whatever the drafts (n-gram, or random ones
that are mostly wrong), the outputs must equal a run without speculation, and the pool
must stay consistent through preemptions, aborts and shared prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.request import Request, RequestStatus
from minivllm.spec_decode.ngram_proposer import NgramProposer
from tests.core.test_scheduler import assert_pool_consistent, make_request

MAX_MODEL_LEN = 48
EOS = 0


# The fake model's next token after each token: two cycles (1 2 3, 4 5 6) where n-gram
# drafts soon come true, and a path 7 8 9 into EOS (0), so that an accepted run of drafts
# can hold an EOS (prompts contain 0 too) and must be cut right after it.
NEXT = [1, 2, 3, 1, 5, 6, 4, 8, 9, 0]


def next_token(context: list[int]) -> int:
    """The fake model: a function of the context (here, of its last token)."""
    return NEXT[context[-1]]


def verify(request: Request, drafts: list[int]) -> tuple[int, int]:
    """Greedy verification: (accepted drafts, the token after them)."""
    context = list(request.all_token_ids)
    for i, draft in enumerate(drafts):
        if next_token(context) != draft:
            return i, next_token(context)
        context.append(draft)
    return len(drafts), next_token(context)


def run_step(sched: Scheduler, out: SchedulerOutput) -> None:
    due = out.sampling_requests()
    verified = [verify(s.request, s.spec_token_ids) for s in due]
    sched.update_from_output(
        out, [t for _, t in verified], num_accepted_tokens=[a for a, _ in verified]
    )


@dataclass
class Workload:
    block_size: int
    num_blocks: int
    max_num_seqs: int
    budget: int
    k: int
    garbage_drafts: bool
    # (arrival step, prompt, max_tokens, abort step or None)
    requests: list[tuple[int, list[int], int, int | None]] = field(default_factory=list)


@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.sampled_from([1, 2, 4]))
    # Few distinct tokens: prompts repeat themselves and share prefixes.
    shared = draw(st.lists(st.integers(0, 9), max_size=16))
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        prefix = shared[: draw(st.integers(0, len(shared)))]
        own = draw(st.lists(st.integers(0, 9), min_size=1, max_size=10))
        if draw(st.booleans()):  # the path into EOS, for the proposer to copy
            own = [7, 8, 9, 0, *own]
        prompt = (prefix + own)[: MAX_MODEL_LEN - 1]
        abort = draw(st.none() | st.integers(0, 30))
        requests.append((draw(st.integers(0, 5)), prompt, draw(st.integers(1, 20)), abort))
    longest = max(min(len(p) + m, MAX_MODEL_LEN) for _, p, m, _ in requests)
    return Workload(
        block_size=block_size,
        num_blocks=-(-longest // block_size) + draw(st.integers(0, 3)),
        max_num_seqs=draw(st.integers(1, 5)),
        budget=draw(st.integers(1, 24)),
        k=draw(st.integers(1, 5)),
        garbage_drafts=draw(st.booleans()),
        requests=requests,
    )


def run_workload(w: Workload, speculate: bool, big: bool = False) -> dict[str, list[int]]:
    config = SchedulerConfig(
        max_num_seqs=64 if big else w.max_num_seqs,
        max_num_batched_tokens=4096 if big else w.budget,
        enable_chunked_prefill=True,
        max_model_len=MAX_MODEL_LEN,
    )
    kv = KVCacheManager(1024 if big else w.num_blocks, w.block_size, True)
    sched = Scheduler(config, kv, num_speculative_tokens=w.k if speculate else 0)
    proposer = NgramProposer(w.k, 1, 3, MAX_MODEL_LEN)
    reqs: dict[str, Request] = {}
    for step_no in range(3000):
        for i, (arrival, prompt, max_tokens, abort) in enumerate(w.requests):
            rid = f"r{i}"
            if arrival == step_no:
                reqs[rid] = make_request(sched, rid, prompt, max_tokens=max_tokens, eos=EOS)
                sched.add_request(reqs[rid])
            if abort is not None and not big and arrival + abort == step_no:
                sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        last_arrival = max(a for a, _, _, _ in w.requests)
        if step_no > last_arrival and not sched.has_unfinished_requests():
            break
        pending = sched.has_unfinished_requests()
        out = sched.schedule()
        assert out.is_empty != pending, "no progress while requests are pending"
        assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
        for s in out.scheduled:
            # Drafts ride after the request's known tokens, never past max_model_len.
            assert s.num_computed_tokens_after <= MAX_MODEL_LEN
            assert len(s.token_ids) == s.num_scheduled_tokens
            assert s.token_ids[len(s.token_ids) - len(s.spec_token_ids) :] == s.spec_token_ids
        run_step(sched, out)
        if speculate:
            drafts = {}
            for r in sched.running:
                d = proposer.propose_one(r.all_token_ids)
                if w.garbage_drafts and step_no % 2:
                    d = [(t + 1) % 10 for t in d] or [1]
                drafts[r.request_id] = d[: w.k]
            sched.update_draft_token_ids(drafts)
        assert_pool_consistent(sched)
    else:
        raise AssertionError("the workload did not finish")
    assert all(r.is_finished() for r in reqs.values())
    assert kv.num_free_blocks == kv.num_blocks and not any(kv.req_to_blocks.values())
    return {rid: list(r.output_token_ids) for rid, r in reqs.items()}


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(workloads())
def test_speculation_changes_nothing_and_leaks_no_block(w: Workload) -> None:
    with_spec = run_workload(w, speculate=True)
    without = run_workload(w, speculate=False)
    reference = run_workload(w, speculate=False, big=True)
    for rid, tokens in reference.items():
        i = int(rid[1:])
        if w.requests[i][3] is None:  # never aborted: the whole output must agree
            assert with_spec[rid] == tokens and without[rid] == tokens
        else:  # aborted somewhere: whatever it produced is a prefix of the real output
            assert tokens[: len(with_spec[rid])] == with_spec[rid]


def _one_running_request(max_tokens: int, k: int = 4) -> tuple[Scheduler, Request]:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=48)
    sched = Scheduler(config, KVCacheManager(32, 4, True), num_speculative_tokens=k)
    request = make_request(sched, "r", [1, 2, 3], max_tokens=max_tokens, eos=EOS)
    sched.add_request(request)
    run_step(sched, sched.schedule())  # the prefill samples the first token
    return sched, request


def test_drafts_are_capped_by_k_and_by_what_max_tokens_leaves() -> None:
    sched, request = _one_running_request(max_tokens=10)
    sched.update_draft_token_ids({"r": [1, 2, 3, 1, 2, 3], "gone": [5]})
    assert request.spec_token_ids == [1, 2, 3, 1]  # k = 4; an unknown id is ignored
    sched, request = _one_running_request(max_tokens=3)
    sched.update_draft_token_ids({"r": [1, 2, 3]})
    assert request.spec_token_ids == [1]  # one output, two left: one draft can matter
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"r": [1]}
    assert out.scheduled[0].num_scheduled_tokens == 2
    assert request.spec_token_ids == []  # each step's drafts are proposed afresh


def test_accepted_counts_are_checked_before_anything_changes() -> None:
    sched, request = _one_running_request(max_tokens=10)
    sched.update_draft_token_ids({"r": [5, 6]})
    out = sched.schedule()
    computed = request.num_computed_tokens
    with pytest.raises(ValueError, match="num_accepted_tokens was not given"):
        sched.update_from_output(out, [7])
    with pytest.raises(ValueError, match="3 drafts accepted out of 2"):
        sched.update_from_output(out, [7], num_accepted_tokens=[3])
    assert request.num_computed_tokens == computed and request.output_token_ids != []
    # One of the two drafts accepted: the second draft's position is given back.
    before = list(request.output_token_ids)
    sched.update_from_output(out, [7], num_accepted_tokens=[1])
    assert request.output_token_ids == [*before, 5, 7]
    assert request.num_computed_tokens == computed - 1 == request.num_tokens - 1
    assert sched.spec_decoding_stats.num_accepted_tokens_per_pos == [1, 0, 0, 0]
