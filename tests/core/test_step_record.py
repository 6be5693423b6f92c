"""Step records for the live view: each must agree with the scheduler and the KV pool at
the moment it was taken, and sampling must drop no preemption or finish.

Two drivers, as for the tracer (tests/tracing/test_tracer.py): a bare scheduler with a
fake model over random workloads (many steps, no model cost), and the real engine on a
tiny random Llama through ``LLMEngine.start_step_records``. A pool that is too small, a
small token budget and shared prompt prefixes make preemption, chunked prefill and
prefix-cache sharing happen, and the tests assert that they did.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import msgspec
import pytest

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.core.step_record import (
    CACHED_FREE,
    FIRST_OWNER,
    FREE,
    StepRecord,
    StepRecorder,
    make_step_record,
)
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def check_record(record: StepRecord, output: SchedulerOutput, sched: Scheduler) -> None:
    """Everything a record claims, checked against the scheduler and its pool now."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    # The batch, as scheduled, within the budget.
    assert [s.request_id for s in record.scheduled] == output.req_ids
    for s in record.scheduled:
        assert (
            s.num_prefill_tokens + s.num_decode_tokens == output.num_scheduled_tokens[s.request_id]
        )
        assert s.num_blocks == len(kv.get_block_ids(s.request_id))
    assert record.num_scheduled_tokens == output.total_num_scheduled_tokens
    assert record.num_scheduled_tokens <= record.token_budget == sched.max_num_batched_tokens
    # The queues, in order.
    assert record.running == [r.request_id for r in sched.running]
    assert record.waiting == [r.request_id for r in sched.waiting]
    # Blocks per request equal the manager's block tables (copies, in running order).
    held = {r.request_id: kv.get_block_ids(r.request_id) for r in sched.running}
    assert record.kv_tables == {rid: ids for rid, ids in held.items() if ids}
    assert all(record.kv_tables[rid] is not kv.get_block_ids(rid) for rid in record.kv_tables)
    # Each block's code agrees with its ref count and its prefix-cache entry.
    grid = record.grid()
    assert len(grid) == record.num_blocks == kv.num_blocks
    owners = list(record.kv_tables)
    for block in pool.blocks:
        code = grid[block.block_id]
        if block.ref_cnt:
            holders = [rid for rid, ids in record.kv_tables.items() if block.block_id in ids]
            assert len(holders) == block.ref_cnt
            assert code == FIRST_OWNER + owners.index(holders[0])
        else:
            assert code == (CACHED_FREE if block.block_hash is not None else FREE)
    assert record.kv_shared == sorted(b.block_id for b in pool.blocks if b.ref_cnt > 1)
    # Totals equal the pool's counts.
    num_held = sum(c >= FIRST_OWNER for c in grid)
    assert record.num_used_blocks == num_held == kv.num_blocks - kv.num_free_blocks
    assert record.num_free_blocks == kv.num_free_blocks
    assert record.num_cached_blocks == len(pool.cached_block_hash_to_block)
    assert record.num_cached_free_blocks == grid.count(CACHED_FREE)
    hits = sum(s.num_cached_tokens // BLOCK_SIZE for s in record.scheduled if s.is_new)
    assert record.num_prefix_hit_blocks == hits


# --------------------------------------------------------------------------- scheduler


def make_scheduler(seed: int) -> Scheduler:
    """Ten random prompts (half sharing a two-block prefix) on a too-small pool."""
    rng = random.Random(seed)
    kv = KVCacheManager(16, BLOCK_SIZE, enable_caching=True)
    config = SchedulerConfig(
        max_num_seqs=6, max_num_batched_tokens=12, enable_chunked_prefill=True, max_model_len=48
    )
    sched = Scheduler(config, kv)
    hasher = get_request_block_hasher(BLOCK_SIZE)
    prefix = [rng.randrange(50) for _ in range(2 * BLOCK_SIZE)]
    for i in range(10):
        own = [rng.randrange(50) for _ in range(rng.randint(1, 14))]
        prompt = prefix + own if i % 2 == 0 else own
        params = SamplingParams(max_tokens=rng.randint(1, 16), ignore_eos=True)
        sched.add_request(Request(str(i), prompt, params, None, None, hasher))
    return sched


def run_steps(sched: Scheduler, recorder: StepRecorder) -> list[StepRecord]:
    """Schedule until done with a fake model; check each record the moment it is made."""
    records = []
    while sched.has_unfinished_requests():
        output = sched.schedule()
        record = recorder.on_schedule(output)
        if record is not None:
            check_record(record, output, sched)
            records.append(record)
        tokens = [
            zlib.crc32(bytes(s.request.all_token_ids)) % 50 for s in output.sampling_requests()
        ]
        sched.update_from_output(output, tokens)
    records.append(recorder.idle_record())
    check_record(records[-1], SchedulerOutput(), sched)
    return records


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_step_record_matches_the_pool(seed: int) -> None:
    sched = make_scheduler(seed)
    records = run_steps(sched, StepRecorder(sched, interval_s=0.0))
    assert len(records) == sched.num_steps + 1  # every step, then the idle pool
    assert [r.step for r in records[:-1]] == list(range(1, sched.num_steps + 1))
    assert sum(len(r.preempted) for r in records) == sched.num_preemptions > 0
    assert sorted(rid for r in records for rid in r.finished) == sorted(map(str, range(10)))
    assert any(r.kv_shared for r in records), "no prefix block was shared"
    assert any(r.num_prefix_hit_blocks for r in records), "no prefix-cache hit"
    assert any(
        s.num_prefill_tokens and s.num_decode_tokens == 0
        for r in records
        for s in r.scheduled
        if s.num_computed_tokens
    ), "no prompt was chunked"
    assert any(s.is_resumed for r in records for s in r.scheduled), "nothing resumed"
    last = records[-1]
    assert last.scheduled == [] and last.running == [] and last.num_used_blocks == 0
    assert last.num_cached_free_blocks > 0  # freed prefixes stay cached


def test_a_sampled_recorder_still_reports_every_preemption_and_finish() -> None:
    sched = make_scheduler(0)
    # An interval longer than the run: only the first step and the idle pool get records.
    records = run_steps(sched, StepRecorder(sched, interval_s=3600.0))
    assert len(records) == 2 and records[0].step == 1
    assert sum(len(r.preempted) for r in records) == sched.num_preemptions > 0
    assert sorted(rid for r in records for rid in r.finished) == sorted(map(str, range(10)))


def test_a_costly_record_stretches_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.core import step_record

    sched = make_scheduler(0)
    clock = iter([100.0, 100.5, 100.6, 149.0, 151.0, 151.1])  # the first took 0.5 s
    monkeypatch.setattr(step_record.time, "monotonic", lambda: next(clock))
    recorder = StepRecorder(sched, interval_s=0.25)
    output = sched.schedule()
    assert recorder.on_schedule(output) is not None  # built from 100.0 to 100.5
    # The next one no sooner than 100 x 0.5 s later, not 0.25 s.
    assert recorder.on_schedule(output) is None  # at 100.6
    assert recorder.on_schedule(output) is None  # at 149.0
    assert recorder.on_schedule(output) is not None  # at 151.0


def test_recorder_rejects_bad_intervals() -> None:
    sched = make_scheduler(0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="interval_s"):
            StepRecorder(sched, bad)


def test_records_cross_the_wire_and_stay_compact() -> None:
    from minivllm.engine import EngineCoreOutputs
    from minivllm.engine.serial_utils import decode_outputs, encode

    num_blocks = 100_000
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_caching=True)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv
    )
    hasher = get_request_block_hasher(BLOCK_SIZE)
    sched.add_request(Request("a", list(range(40)), SamplingParams(max_tokens=4), None, 0, hasher))
    output = sched.schedule()
    record = make_step_record(output, sched, kv)
    check_record(record, output, sched)
    wire = encode(EngineCoreOutputs(step_records=[record]))
    # The size follows the blocks in use, not the pool: ten blocks held, nothing cached.
    assert len(wire) < 1000
    assert decode_outputs(wire).step_records == [record]
    as_json = msgspec.json.decode(msgspec.json.encode(record))
    assert as_json["kv_tables"] == {"a": list(range(10))} and as_json["kv_cached_free"] == []
    assert record.grid()[:11] == [FIRST_OWNER] * 10 + [FREE]


# --------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_models import make_tiny_model

    return make_tiny_model("llama", tmp_path_factory.mktemp("step_record") / "llama")


def test_engine_records_match_the_engine(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.llm import LLM

    llm = LLM(
        str(tiny_llama),
        device="cpu",
        block_size=BLOCK_SIZE,
        num_kv_blocks=14,
        max_num_batched_tokens=16,
        max_model_len=48,
        max_num_seqs=4,
    )
    front = llm.llm_engine
    engine = front.engine_core.engine_core
    assert engine.step_recorder is None  # off by default
    checked = []
    on_schedule = StepRecorder.on_schedule

    def check_at_schedule(self: StepRecorder, output: SchedulerOutput) -> StepRecord | None:
        record = on_schedule(self, output)
        if record is not None:  # checked the moment it is made, before the model runs
            check_record(record, output, engine.scheduler)
            checked.append(record.step)
        return record

    monkeypatch.setattr(StepRecorder, "on_schedule", check_at_schedule)
    front.start_step_records(0.0)
    shared = list(range(3, 15))  # three full blocks every request can share
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i, n in enumerate([3, 6, 1, 9, 2]):
        front.add_request(
            {"prompt_token_ids": shared + [100 + 10 * i + j for j in range(n)]}, params
        )
    while front.has_unfinished_requests():
        front.step()
    records = list(front.step_records)
    stats = front.stats
    assert [r.step for r in records[:-1]] == checked == list(range(1, stats.num_steps + 1))
    assert sum(len(r.preempted) for r in records) == stats.num_preemptions > 0
    assert max(r.num_used_blocks for r in records) <= stats.peak_blocks_in_use
    assert all(r.num_blocks == stats.num_kv_blocks for r in records)
    assert any(r.kv_shared for r in records), "no prefix block was shared"
    idle = records[-1]
    assert idle.scheduled == [] and idle.num_used_blocks == 0 and len(idle.finished) > 0
    front.stop_step_records()
    front.add_request({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2))
    while front.has_unfinished_requests():
        front.step()
    assert engine.step_recorder is None and len(front.step_records) == len(records)
    with pytest.raises(ValueError, match="interval_s"):
        front.start_step_records(-1.0)
