"""Pictures of speculative decoding: the tracer's records and the live view's step records
say which drafts each step verified and how many it kept, as the scheduler saw them.

A bare scheduler with a fake model drives both (no model cost): the fake model's next
token is a function of the last token, the n-gram proposer drafts from each request's
tokens, and the fake verifier accepts drafts while they equal the fake model's tokens,
as the greedy rejection sampler does. Its cycles make drafts come true, its
path into a dead end makes them fail, so both happen and the tests assert they did.
"""

from __future__ import annotations

import matplotlib
import pytest

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.scheduler import Scheduler
from minivllm.core.step_record import StepRecord, StepRecorder
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.tracing.plots import plot_batch_timeline, plot_drafts, save_trace_figures
from minivllm.tracing.tracer import EngineTracer

matplotlib.use("Agg")

BLOCK_SIZE = 4
K = 3
# The fake model's next token after each token: a cycle 1 2 3 where drafts come true,
# a cycle 4 5 6 7 8 that prompts copy wrongly (4 5 9 in them), so drafts fail there.
NEXT = [1, 2, 3, 1, 5, 6, 7, 8, 4, 4]


def verify(request: Request, drafts: list[int]) -> tuple[int, int]:
    """Greedy verification: (accepted drafts, the fake model's token after them)."""
    last = request.all_token_ids[-1]
    for i, draft in enumerate(drafts):
        if NEXT[last] != draft:
            return i, NEXT[last]
        last = draft
    return len(drafts), NEXT[last]


def run(
    prompts: list[list[int]], max_tokens: int = 14
) -> tuple[EngineTracer, list[StepRecord], list]:
    """Schedule, verify, record and propose until every request finished."""
    kv = KVCacheManager(64, BLOCK_SIZE, enable_caching=True)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64)
    sched = Scheduler(config, kv, num_speculative_tokens=K)
    hasher = get_request_block_hasher(BLOCK_SIZE)
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sched.add_request(Request(str(i), prompt, params, None, None, hasher))
    proposer = NgramProposer(K, 1, 3, 64)
    tracer, recorder = EngineTracer(), StepRecorder(sched, interval_s=0.0)
    records, outputs = [], []
    while sched.has_unfinished_requests():
        output = sched.schedule()
        record = recorder.on_schedule(output)
        assert record is not None
        # As scheduled: drafts counted apart from the decode token, none accepted yet.
        for entry, s in zip(record.scheduled, output.scheduled, strict=True):
            assert entry.num_draft_tokens == len(s.spec_token_ids)
            assert entry.num_accepted_tokens is None
            assert (
                entry.num_prefill_tokens + entry.num_decode_tokens + entry.num_draft_tokens
                == s.num_scheduled_tokens
            )
        due = output.sampling_requests()
        verified = [verify(s.request, s.spec_token_ids) for s in due]
        accepted = [a for a, _ in verified]
        sched.update_from_output(output, [t for _, t in verified], num_accepted_tokens=accepted)
        tracer.record_step(output, kv, accepted)
        recorder.on_verified(output, accepted)
        records.append(record)
        outputs.append((output, dict(zip([s.request_id for s in due], verified, strict=True))))
        sched.update_draft_token_ids(
            {
                r.request_id: proposer.propose_one(r.all_token_ids)
                for r in sched.running
                if r.num_computed_tokens == r.num_tokens - 1
            }
        )
    return tracer, records, outputs


PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 9, 4, 5, 9, 4, 5], [1, 2, 3, 4, 5, 6]]


def test_tracer_and_step_records_show_each_draft_and_its_fate() -> None:
    tracer, records, outputs = run(PROMPTS)
    seen_accepted = seen_rejected = 0
    for step, record, (output, verified) in zip(tracer.steps, records, outputs, strict=True):
        for traced, entry, s in zip(
            step.scheduled, record.scheduled, output.scheduled, strict=True
        ):
            drafts = list(s.spec_token_ids)
            assert list(traced.spec_token_ids) == drafts
            assert traced.num_draft_tokens == entry.num_draft_tokens == len(drafts)
            assert (
                traced.num_prefill_tokens + traced.num_decode_tokens + traced.num_draft_tokens
                == s.num_scheduled_tokens
            )
            if s.request_id not in verified:  # a prompt chunk: nothing sampled
                assert traced.new_token_ids == () and not drafts
                continue
            num_accepted, token = verified[s.request_id]
            # The step gained its accepted drafts, then the target's token (max_tokens
            # may cut the run short: the scheduler caps drafts so it never needs to).
            assert list(traced.new_token_ids) == drafts[:num_accepted] + [token]
            if drafts:
                assert traced.is_decode
                assert traced.num_accepted_tokens == entry.num_accepted_tokens == num_accepted
                assert traced.num_rejected_tokens == len(drafts) - num_accepted
                seen_accepted += num_accepted
                seen_rejected += len(drafts) - num_accepted
            else:
                assert traced.num_accepted_tokens is None is entry.num_accepted_tokens
        assert step.num_draft_tokens == sum(e.num_draft_tokens for e in record.scheduled)
    assert seen_accepted > 0 and seen_rejected > 0, "drafts must be both kept and rejected"
    assert f"{seen_accepted} accepted" in tracer.summary()
    # Each request's gains, step after step, are its whole output.
    for rid in ("0", "1", "2"):
        gained = [t for step in tracer.steps for s in step.scheduled if s.request_id == rid
                  for t in s.new_token_ids]  # fmt: skip
        assert len(gained) == 14


def test_a_record_is_completed_only_by_its_own_step() -> None:
    kv = KVCacheManager(16, BLOCK_SIZE, enable_caching=False)
    config = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=32)
    sched = Scheduler(config, kv, num_speculative_tokens=K)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=8), None, None, None))
    recorder = StepRecorder(sched, interval_s=0.0)
    first = sched.schedule()
    recorder.on_schedule(first)
    sched.update_from_output(first, [1])
    sched.update_draft_token_ids({"a": [2, 3]})
    second = sched.schedule()
    record = recorder.on_schedule(second)
    assert record is not None and record.scheduled[0].num_draft_tokens == 2
    recorder.on_verified(first, [0])  # an older step: not this record's
    assert record.scheduled[0].num_accepted_tokens is None
    recorder.on_verified(second, [1])
    assert record.scheduled[0].num_accepted_tokens == 1


def test_draft_pictures(tmp_path) -> None:
    tracer, _, _ = run(PROMPTS)
    fig = plot_drafts(tracer, decode=lambda t: f"t{t}")
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"t1", "t2", "t3"} <= texts
    ax = plot_batch_timeline(tracer).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "drafts accepted" in labels and "drafts rejected" in labels
    names = {p.name for p in save_trace_figures(tracer, tmp_path)}
    assert "drafts.png" in names
    with pytest.raises(ValueError, match="request 'nope'"):
        plot_drafts(tracer, request_id="nope")
    plain, _, _ = run([[4, 5, 6]], max_tokens=1)  # one token: never a draft
    with pytest.raises(ValueError, match="no step verified a draft"):
        plot_drafts(plain)
    assert "drafts.png" not in {p.name for p in save_trace_figures(plain, tmp_path / "plain")}


def test_engine_trace_counts_the_engines_drafts() -> None:
    """Through the engine core's hook: the trace's drafts and acceptances add up to the
    engine's own speculative-decoding counters, request by request and in total."""
    from minivllm.demo import demo_model_path
    from minivllm.llm import LLM
    from minivllm.tracing.tracer import trace

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    llm = LLM(str(demo_model_path()), dtype="float32", max_model_len=256,
              speculative_config=spec)  # fmt: skip
    prompts = ["And God said, Let there be light: and there was light. And God said,", "Amen"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    with trace(llm) as tracer:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.llm_engine.stats.spec_decoding_stats
    shares = [s for step in tracer.steps for s in step.scheduled]
    assert sum(s.num_draft_tokens for s in shares) == stats.num_draft_tokens > 0
    assert sum(s.num_accepted_tokens or 0 for s in shares) == stats.num_accepted_tokens > 0
    for rid, out in zip(tracer.request_ids(), outputs, strict=True):
        gained = [t for s in shares if s.request_id == rid for t in s.new_token_ids]
        assert gained == list(out.outputs[0].token_ids)
