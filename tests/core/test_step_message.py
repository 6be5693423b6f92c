"""The per-step diff: a worker's mirror must rebuild exactly what the engine scheduled.

Drives a real scheduler through prefill chunks, decodes, a preemption (blocks freed and
reallocated) and finished requests, and after every step compares the decoded
``SchedulerOutput`` with the original, field by field.
"""

from __future__ import annotations

import pickle

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.step_message import RequestMirror, StepMessageEncoder
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def _view(out) -> list[tuple]:
    return [
        (s.request_id, s.token_ids, s.num_computed_tokens, s.num_scheduled_tokens,
         list(s.block_ids), s.is_new, s.is_resumed, s.needs_sample,
         s.request.output_token_ids, s.request.prompt_token_ids)
        for s in out.scheduled
    ]


def test_mirror_tracks_the_scheduler_through_preemption() -> None:
    # 7 blocks of 4 tokens: three 10-token prompts growing to 16 tokens cannot all fit.
    manager = KVCacheManager(num_blocks=7, block_size=4, enable_caching=False)
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64), manager
    )
    for i in range(3):
        params = SamplingParams(temperature=0.0, max_tokens=6)
        scheduler.add_request(Request(str(i), list(range(10 * i + 3, 10 * i + 13)), params))
    encoder, mirror = StepMessageEncoder(), RequestMirror()
    steps = preempted = 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        # Through pickle, as over the pipe: the mirror must not share the engine's lists.
        decoded = mirror.decode(pickle.loads(pickle.dumps(encoder.encode(out))))
        assert _view(decoded) == _view(out)
        assert decoded.total_num_scheduled_tokens == out.total_num_scheduled_tokens
        assert decoded.finished_req_ids == out.finished_req_ids
        preempted += len(out.preempted_req_ids)
        sampled = [100 + steps for _ in out.sampling_requests()]
        scheduler.update_from_output(out, sampled)
        steps += 1
    assert preempted > 0
    # The last finished ids reach the workers with the next step.
    mirror.decode(encoder.encode(scheduler.schedule()))
    assert mirror.requests == {} and mirror.block_ids == {}


def test_decode_step_message_is_small() -> None:
    manager = KVCacheManager(num_blocks=64, block_size=4, enable_caching=False)
    scheduler = Scheduler(SchedulerConfig(max_model_len=512), manager)
    scheduler.add_request(Request("a", list(range(3, 203)), SamplingParams(max_tokens=4)))
    encoder = StepMessageEncoder()
    out = scheduler.schedule()
    first = len(pickle.dumps(encoder.encode(out)))
    scheduler.update_from_output(out, [7])
    decode = len(pickle.dumps(encoder.encode(scheduler.schedule())))
    assert first > 800  # the prompt travels once
    assert decode < 600  # then one token and no block ids


def test_mirror_carries_the_drafts_every_rank_verifies() -> None:
    """Speculative decoding under tensor parallelism: each scheduled request's drafts
    reach the workers (its input tokens end with them), and the accepted ones arrive as
    ordinary tokens with the next message."""
    manager = KVCacheManager(num_blocks=32, block_size=4, enable_caching=False)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    scheduler = Scheduler(config, manager, num_speculative_tokens=3)
    for i in range(3):
        params = SamplingParams(temperature=0.0, max_tokens=10)
        scheduler.add_request(Request(str(i), list(range(10 * i + 3, 10 * i + 9)), params))
    encoder, mirror = StepMessageEncoder(), RequestMirror()
    steps = verified = 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        decoded = mirror.decode(pickle.loads(pickle.dumps(encoder.encode(out))))
        assert _view(decoded) == _view(out)
        assert [s.spec_token_ids for s in decoded.scheduled] == [
            s.spec_token_ids for s in out.scheduled
        ]
        verified += len(out.scheduled_spec_decode_tokens)
        due = out.sampling_requests()
        accepted = [min(steps % 3, len(s.spec_token_ids)) for s in due]  # 0, 1 or 2
        scheduler.update_from_output(out, [100 + steps] * len(due), None, accepted)
        about_to_decode = [
            r for r in scheduler.running if r.num_computed_tokens == r.num_tokens - 1
        ]
        scheduler.update_draft_token_ids({r.request_id: [7, 8, 9] for r in about_to_decode})
        steps += 1
    assert verified > 0
