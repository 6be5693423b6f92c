"""The engine tracer: its records must agree with the engine's own state, step by step.

Two drivers: the real engine on a tiny random Llama (the hook in ``LLMEngine.step``),
and a bare scheduler with a fake model over random workloads (many more steps, no
model cost). A pool that is too small, a small token budget and shared prompt prefixes
make sure preemption, chunked prefill and prefix-cache reuse all happen, and the tests
assert that they did.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from minivllm.config import SchedulerConfig
from minivllm.core.block_pool import BlockEvent
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.tracing.tracer import (
    BlockCounts,
    EngineTracer,
    StepRecord,
    count_block_events,
    snapshot_kv,
    trace,
)
from tests.tiny_models import make_tiny_model

BLOCK_SIZE = 4


def check_record_against_state(
    record: StepRecord, output: SchedulerOutput, kv: KVCacheManager, held_refs: int
) -> None:
    """Everything a record claims, checked against the scheduler output and the pool."""
    # Tokens: per request and in total, as scheduled; the split covers every token.
    assert [s.request_id for s in record.scheduled] == output.req_ids
    for s in record.scheduled:
        assert s.num_scheduled_tokens == output.num_scheduled_tokens[s.request_id]
    assert record.num_scheduled_tokens == output.total_num_scheduled_tokens
    assert record.num_prefill_tokens + record.num_decode_tokens == record.num_scheduled_tokens
    assert set(record.preempted_req_ids) == output.preempted_req_ids
    # Blocks per request equal the manager's block tables.
    held = {rid: kv.get_block_ids(rid) for rid, blocks in kv.req_to_blocks.items() if blocks}
    assert record.kv.block_tables == held
    # Ref counts derived from the tables equal the pool's.
    pool = kv.block_pool
    refs = record.kv.ref_counts()
    for block in pool.blocks:
        assert refs.get(block.block_id, 0) == block.ref_cnt
    assert record.kv.num_blocks_in_use == kv.num_blocks - kv.num_free_blocks
    assert record.kv.num_free_blocks == kv.num_free_blocks
    assert record.kv.cached_block_ids == {
        b.block_id for b in pool.blocks if b.block_hash is not None
    }
    # Totals add up: references taken minus references dropped == references held.
    assert held_refs == sum(len(t) for t in held.values())
    # A newly admitted request's reused blocks are exactly its prefix-cache hit.
    for s in record.scheduled:
        if s.is_new:
            reused = record.blocks.get(s.request_id, BlockCounts()).reused
            assert reused * kv.block_size == s.num_cached_tokens


def check_whole_trace(tracer: EngineTracer, kv: KVCacheManager) -> None:
    """After the run: all blocks returned, and the run did exercise every mechanism."""
    totals = BlockCounts()
    for counts in tracer.block_totals().values():
        totals += counts
    assert totals.allocated + totals.reused == totals.freed
    assert kv.num_free_blocks == kv.num_blocks
    assert tracer.steps[-1].kv.block_tables == {}
    assert sum(len(r.preempted_req_ids) for r in tracer.steps) > 0, "no preemption happened"
    assert totals.reused > 0, "no prefix-cache hit happened"
    assert totals.evicted > 0, "no cached block was evicted"
    chunked = [s for r in tracer.steps for s in r.scheduled if s.num_prefill_tokens and
               not s.needs_sample]
    assert chunked, "no prompt was chunked"


# --------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("tracer") / "llama")


def make_llm(model: Path):
    from minivllm.llm import LLM

    return LLM(
        str(model), device="cpu", block_size=BLOCK_SIZE, num_kv_blocks=14,
        max_num_batched_tokens=16, max_model_len=48, max_num_seqs=4,
    )


def engine_prompts() -> list[dict]:
    shared = list(range(3, 15))  # three full blocks every request can share
    lengths = [3, 6, 1, 9, 2]
    return [{"prompt_token_ids": shared + [100 + 10 * i + j for j in range(n)]}
            for i, n in enumerate(lengths)]


def test_engine_trace_matches_engine_state(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(tiny_llama)
    front = llm.llm_engine
    engine = front.engine_core.engine_core  # the EngineCore behind the LLM
    outputs: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def schedule_and_keep() -> SchedulerOutput:
        outputs.append(schedule())
        return outputs[-1]

    monkeypatch.setattr(engine.scheduler, "schedule", schedule_and_keep)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with trace(llm) as tracer:
        for prompt in engine_prompts():
            front.add_request(prompt, params)
        held_refs = 0
        while front.has_unfinished_requests():
            front.step()
            record = tracer.steps[-1]
            held_refs += record.block_totals.net_held
            check_record_against_state(record, outputs[-1], engine.kv_cache_manager, held_refs)
    assert len(tracer.steps) == len(outputs) == front.stats.num_steps
    assert sum(len(r.preempted_req_ids) for r in tracer.steps) == front.stats.num_preemptions
    finished = [rid for r in tracer.steps for rid in r.finished_req_ids]
    assert sorted(finished) == sorted(tracer.request_ids())
    check_whole_trace(tracer, engine.kv_cache_manager)
    # Detached: the engine no longer calls the tracer and the event log is off again.
    assert engine.tracer is None
    assert engine.kv_cache_manager.block_pool.events is None


def test_trace_rejects_bad_targets(tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="LLM or an LLMEngine"), trace(object()):
        pass
    llm = make_llm(tiny_llama)
    with trace(llm), pytest.raises(ValueError, match="already has a tracer"), trace(llm):
        pass


# --------------------------------------------------------------------------- scheduler


def run_scheduler_workload(seed: int) -> tuple[EngineTracer, KVCacheManager]:
    """Random prompts (half sharing a prefix) through a bare scheduler and a fake model."""
    rng = random.Random(seed)
    kv = KVCacheManager(16, BLOCK_SIZE, enable_caching=True, enable_kv_cache_events=True)
    config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=12,
                             enable_chunked_prefill=True, max_model_len=48)
    sched = Scheduler(config, kv)
    hasher = get_request_block_hasher(BLOCK_SIZE)
    prefix = [rng.randrange(50) for _ in range(2 * BLOCK_SIZE)]
    for i in range(10):
        own = [rng.randrange(50) for _ in range(rng.randint(1, 14))]
        prompt = prefix + own if i % 2 == 0 else own
        params = SamplingParams(max_tokens=rng.randint(1, 16), ignore_eos=True)
        sched.add_request(Request(str(i), prompt, params, None, None, hasher))
    tracer = EngineTracer()
    held_refs = 0
    while sched.has_unfinished_requests():
        output = sched.schedule()
        tokens = [zlib.crc32(bytes(s.request.all_token_ids)) % 50
                  for s in output.sampling_requests()]
        sched.update_from_output(output, tokens)
        record = tracer.record_step(output, kv)
        held_refs += record.block_totals.net_held
        check_record_against_state(record, output, kv, held_refs)
    return tracer, kv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scheduler_trace_matches_pool_state(seed: int) -> None:
    tracer, kv = run_scheduler_workload(seed)
    check_whole_trace(tracer, kv)


def test_count_block_events_charges_evictions_to_the_allocating_request() -> None:
    events = [
        BlockEvent("allocate", 0, "a"), BlockEvent("cache", 0, "a"),
        BlockEvent("free", 0, "a"), BlockEvent("touch", 0, "b"), BlockEvent("free", 0, "b"),
        BlockEvent("evict", 0), BlockEvent("allocate", 0, "c"), BlockEvent("reset", -1),
    ]
    counts = count_block_events(events)
    assert counts["a"] == BlockCounts(allocated=1, cached=1, freed=1)
    assert counts["b"] == BlockCounts(reused=1, freed=1)
    assert counts["c"] == BlockCounts(allocated=1, evicted=1)
    assert None not in counts


def test_snapshot_sees_sharing_and_cached_free_blocks() -> None:
    kv = KVCacheManager(8, BLOCK_SIZE, enable_caching=True)
    hasher = get_request_block_hasher(BLOCK_SIZE)
    params = SamplingParams(max_tokens=1)
    a = Request("a", list(range(9)), params, None, None, hasher)
    kv.allocate_slots(a, 9)
    b = Request("b", list(range(8)) + [99], params, None, None, hasher)
    hits, n = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 9 - n, hits, n)
    snap = snapshot_kv(kv)
    assert snap.shared_block_ids == {0, 1}
    assert snap.num_blocks_in_use == 4
    kv.free(b)
    kv.free(a)
    snap = snapshot_kv(kv)
    assert snap.block_tables == {} and snap.num_blocks_in_use == 0
    assert snap.num_cached_free_blocks == 2  # the two full prefix blocks stay cached


# --------------------------------------------------------------------------- plots, CLI


def test_plots_and_cli_write_pictures(tiny_llama: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minivllm.cli import main
    from minivllm.tracing.plots import (
        busiest_step,
        plot_batch_timeline,
        plot_block_table,
        save_trace_figures,
    )

    tracer, _ = run_scheduler_workload(0)
    busy = busiest_step(tracer)
    fig = plot_block_table(busy)
    # One row per request that holds blocks at that step.
    assert len(fig.axes[1].get_yticks()) == len(busy.kv.block_tables)
    plt.close(fig)
    fig = plot_batch_timeline(tracer, by_request=False)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert sum(heights) == sum(r.num_scheduled_tokens for r in tracer.steps)
    plt.close(fig)
    written = save_trace_figures(tracer, tmp_path / "plots")
    assert all(p.stat().st_size > 0 for p in written)
    with pytest.raises(ValueError, match="no steps"):
        save_trace_figures(EngineTracer(), tmp_path / "empty")

    out = tmp_path / "cli"
    rc = main(["trace", "--model", str(tiny_llama), "--out-dir", str(out), "--max-tokens", "3"])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"timeline.png", "kv_usage.png", "block_table.png", "trace.json"}
