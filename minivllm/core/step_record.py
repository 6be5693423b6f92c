"""A picture of one scheduled step, for watching the engine live: the ``StepRecord``.

No upstream counterpart: vLLM exposes the same facts as Prometheus counters and
histograms (``vllm/v1/metrics/``) and as KV-cache events for external indexers
(``BlockPool.take_events``), never as a per-step picture. minivllm's live page
(``minivllm serve``'s ``/``, fed by ``GET /v1/live/stream``) and notebooks read these.

A record is built by the engine core right after ``Scheduler.schedule()``, only while a
viewer asked for records, and at most once per sampling interval, so an engine that
nobody watches pays one ``is None`` test per step. With speculative decoding, the drafts'
fate is known only once the step ran: ``StepRecorder.on_verified`` then writes the
accepted counts into that step's record, before the core sends it. It holds plain ids and numbers (a
``msgspec.Struct``, so it crosses the process boundary and becomes JSON without
pickle) and describes the step *as scheduled*: the batch, the queues after admission,
and the KV pool once this step's blocks were allocated.

The pool may hold 100k+ blocks and the core must not slow down for a viewer, so a
record never walks the pool block by block. It carries what the core already keeps:
the running requests' block tables (``kv_tables``, copied: a C-level list copy each),
the free blocks that still hold a cached prefix (``kv_cached_free``: one pass over the
prefix-cache index) and the blocks held by more than one request (``kv_shared``: only
prefix-cache hits can be shared, so only those are looked at). The per-block picture is
the reader's to draw: :meth:`StepRecord.grid` (and the page's script) turn the three
into one code per block::

    code 0       free, holds no cached prefix
    code 1       free but cached: a later request with the same prefix can take it back
    code 2 + i   held; the i-th request of kv_tables is the first whose table holds it
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

import msgspec

from minivllm.core.sched_output import SchedulerOutput

if TYPE_CHECKING:
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.sched_output import ScheduledRequest
    from minivllm.core.scheduler import Scheduler

# A sampled recorder spends at most 1/COST_CAP of the core's time building records: a
# record that took 5 ms is followed by none for at least 0.5 s, whatever the interval.
COST_CAP = 100

# Codes of StepRecord.grid (see the module docstring).
FREE = 0
CACHED_FREE = 1
FIRST_OWNER = 2


class ScheduledEntry(msgspec.Struct, gc=False):
    """One request's share of the step.

    Attributes:
        request_id: The request.
        num_prefill_tokens: Prompt tokens (or, after a preemption, recomputed tokens)
            run this step.
        num_decode_tokens: 1 for a decode (one token past the prompt, drafts aside),
            else 0.
        num_computed_tokens: Tokens whose K/V were cached before the step.
        num_prompt_tokens: Length of its prompt.
        num_cached_tokens: Prompt tokens served by the prefix cache when it was last
            admitted.
        num_blocks: Blocks in its block table after this step's allocation.
        is_new: Admitted from the waiting queue in this step (fresh or resumed).
        is_resumed: Admitted again after a preemption.
        num_draft_tokens: Draft tokens verified after its decode token (speculative
            decoding); prefill + decode + draft tokens are its share of the batch.
        num_accepted_tokens: How many of those drafts the rejection sampler accepted
            (always a prefix of them); None until the step has run, or without drafts.
    """

    request_id: str
    num_prefill_tokens: int
    num_decode_tokens: int
    num_computed_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_blocks: int
    is_new: bool = False
    is_resumed: bool = False
    num_draft_tokens: int = 0
    num_accepted_tokens: int | None = None


class StepRecord(msgspec.Struct, gc=False):
    """One step as the scheduler built it, and the KV pool right after.

    Attributes:
        step: The scheduler's step counter (steps that scheduled a batch since start);
            an idle record repeats the last step's number.
        timestamp: ``time.time()`` when the record was built.
        token_budget: ``max_num_batched_tokens``.
        num_scheduled_tokens: Tokens in the batch (never above the budget).
        scheduled: The batch, in batch order (running requests first, then admitted).
        running: Running request ids after admission, oldest first.
        waiting: Waiting request ids, head of the queue first.
        preempted: Requests preempted since the previous record (so a sampled view
            misses none).
        finished: Requests finished since the previous record.
        block_size: Tokens per KV block.
        kv_tables: Running request id -> its block ids in token order (requests holding
            blocks, in running order).
        kv_cached_free: Free blocks that still hold a cached prefix (in no order).
        kv_shared: Ids of blocks held by more than one request, ascending.
        num_blocks: Blocks in the pool.
        num_used_blocks: Blocks held by at least one request.
        num_free_blocks: Blocks nobody holds (cached or not).
        num_cached_blocks: Blocks indexed in the prefix cache (held or free).
        num_cached_free_blocks: Free blocks that still hold a cached prefix.
        num_prefix_hit_blocks: Blocks that requests admitted this step took from the
            prefix cache instead of computing.
    """

    step: int
    timestamp: float
    token_budget: int
    num_scheduled_tokens: int
    scheduled: list[ScheduledEntry]
    running: list[str]
    waiting: list[str]
    preempted: list[str]
    finished: list[str]
    block_size: int
    kv_tables: dict[str, list[int]]
    kv_cached_free: list[int]
    kv_shared: list[int]
    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_cached_free_blocks: int
    num_prefix_hit_blocks: int

    def grid(self) -> list[int]:
        """One code per block, in block id order (see the module docstring)."""
        codes = [FREE] * self.num_blocks
        for block_id in self.kv_cached_free:
            codes[block_id] = CACHED_FREE
        for i, table in enumerate(reversed(self.kv_tables.values())):
            code = FIRST_OWNER + len(self.kv_tables) - 1 - i  # the first holder wins
            for block_id in table:
                codes[block_id] = code
        return codes


def make_step_record(
    scheduler_output: SchedulerOutput,
    scheduler: Scheduler,
    kv_cache_manager: KVCacheManager,
    preempted: list[str] | None = None,
    finished: list[str] | None = None,
) -> StepRecord:
    """Describe the step ``scheduler_output`` and the pool as it is now.

    Call it right after ``scheduler.schedule()``; an empty ``SchedulerOutput()`` gives
    an idle record (the queues and the pool, no batch).

    Args:
        scheduler_output: The step just scheduled.
        scheduler: The scheduler that built it (queues, budget, step counter).
        kv_cache_manager: Its KV cache manager (block tables, pool).
        preempted: Preemptions to report (default: the step's own).
        finished: Finishes to report (default: the step's own ``finished_req_ids``).
    """
    kv = kv_cache_manager
    pool = kv.block_pool
    tables: dict[str, list[int]] = {}
    shared: set[int] = set()
    for request in scheduler.running:
        table = kv.get_block_ids(request.request_id)
        if not table:
            continue
        tables[request.request_id] = list(table)  # a copy: the manager's list grows
        # Only prefix-cache hits, the first blocks of a table, can be held twice.
        num_hits = request.num_cached_tokens // kv.block_size
        blocks = kv.req_to_blocks[request.request_id]
        shared.update(b.block_id for b in islice(blocks, num_hits) if b.ref_cnt > 1)
    cached = pool.cached_block_hash_to_block
    cached_free = [b.block_id for b in cached.values() if b.ref_cnt == 0]
    num_free = pool.get_num_free_blocks()
    return StepRecord(
        step=scheduler.num_steps,
        timestamp=time.time(),
        token_budget=scheduler.max_num_batched_tokens,
        num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens,
        scheduled=[_entry(s, kv) for s in scheduler_output.scheduled],
        running=[r.request_id for r in scheduler.running],
        waiting=[r.request_id for r in scheduler.waiting],
        preempted=sorted(scheduler_output.preempted_req_ids if preempted is None else preempted),
        finished=sorted(scheduler_output.finished_req_ids if finished is None else finished),
        block_size=kv.block_size,
        kv_tables=tables,
        kv_cached_free=cached_free,
        kv_shared=sorted(shared),
        num_blocks=kv.num_blocks,
        num_used_blocks=kv.num_blocks - num_free,
        num_free_blocks=num_free,
        num_cached_blocks=len(cached),
        num_cached_free_blocks=len(cached_free),
        num_prefix_hit_blocks=sum(
            s.request.num_cached_tokens // kv.block_size
            for s in scheduler_output.scheduled
            if s.is_new
        ),
    )


class StepRecorder:
    """Decides which steps get a record and remembers what happened in between.

    The engine core holds one only while a viewer asked for records (otherwise None:
    one ``is None`` test per step).

    Args:
        scheduler: The scheduler whose steps are recorded.
        interval_s: At most one record per ``interval_s`` seconds, and no more often
            than keeps their cost under 1 % (``COST_CAP``); 0: every step, whatever it
            costs (notebooks, tests).

    Raises:
        ValueError: ``interval_s`` is negative or not finite.
    """

    def __init__(self, scheduler: Scheduler, interval_s: float) -> None:
        if not (math.isfinite(interval_s) and interval_s >= 0):
            raise ValueError(f"interval_s must be a finite number >= 0, got {interval_s}")
        self.scheduler = scheduler
        self.interval_s = interval_s
        self._next_time = 0.0
        # Preemptions and finishes since the last record, so a sampled view misses none.
        self._preempted: list[str] = []
        self._finished: list[str] = []
        # Finished ids an idle record reported that the next schedule() repeats.
        self._reported: set[str] = set()
        # The last step that got a record, until its drafts' fate is known.
        self._unverified: tuple[SchedulerOutput, StepRecord] | None = None

    def on_schedule(self, scheduler_output: SchedulerOutput) -> StepRecord | None:
        """Called after every ``schedule()``: a record if the interval has passed (and
        the step has a batch: an empty one is not a step)."""
        self._preempted.extend(scheduler_output.preempted_req_ids)
        reported, self._reported = self._reported, set()
        self._finished.extend(r for r in scheduler_output.finished_req_ids if r not in reported)
        now = time.monotonic()
        if now < self._next_time or scheduler_output.is_empty:
            return None
        record = self._make(scheduler_output)
        if scheduler_output.scheduled_spec_decode_tokens:
            self._unverified = (scheduler_output, record)
        if self.interval_s:
            cost = time.monotonic() - now
            self._next_time = now + max(self.interval_s, COST_CAP * cost)
        return record

    def on_verified(
        self, scheduler_output: SchedulerOutput, num_accepted_tokens: Sequence[int] | None
    ) -> None:
        """Called once a step's results were applied: write how many drafts each request
        kept into that step's record, if it got one.

        The record describes the step as scheduled, before the model ran; the drafts'
        fate arrives with the step's results. The engine core sends a step's records
        after processing it, so they leave complete, except under async scheduling,
        where a record can leave before its step ran (its drafts then stay ``None``).

        Args:
            scheduler_output: The step whose results were applied.
            num_accepted_tokens: Accepted drafts per request, aligned with
                ``scheduler_output.sampling_requests()`` (the runner's
                ``num_accepted_tokens``); None when no request had drafts.
        """
        if self._unverified is None or self._unverified[0] is not scheduler_output:
            return
        record = self._unverified[1]
        self._unverified = None
        if num_accepted_tokens is None:
            return
        accepted = {
            s.request_id: n
            for s, n in zip(scheduler_output.sampling_requests(), num_accepted_tokens)
            if s.spec_token_ids
        }
        for entry in record.scheduled:
            if entry.request_id in accepted:
                entry.num_accepted_tokens = accepted[entry.request_id]

    def idle_record(self) -> StepRecord:
        """A record of the queues and the pool now, with no batch: for a viewer that just
        arrived, or once everything finished and the blocks went back to the pool."""
        # Finished ids stay in the scheduler until its next schedule(): report them once.
        pending = self.scheduler.finished_req_ids
        self._finished.extend(r for r in pending if r not in self._reported)
        self._reported = set(pending)
        return self._make(SchedulerOutput())

    def _make(self, scheduler_output: SchedulerOutput) -> StepRecord:
        record = make_step_record(
            scheduler_output,
            self.scheduler,
            self.scheduler.kv_cache_manager,
            preempted=self._preempted,
            finished=self._finished,
        )
        self._preempted, self._finished = [], []
        return record


def _entry(s: ScheduledRequest, kv: KVCacheManager) -> ScheduledEntry:
    request = s.request
    num_drafts = len(s.spec_token_ids)
    num_known = s.num_scheduled_tokens - num_drafts  # drafts come after the known tokens
    is_decode = num_known == 1 and s.num_computed_tokens >= request.num_prompt_tokens
    return ScheduledEntry(
        request_id=request.request_id,
        num_prefill_tokens=0 if is_decode else num_known,
        num_decode_tokens=1 if is_decode else 0,
        num_computed_tokens=s.num_computed_tokens,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens,
        num_blocks=len(kv.get_block_ids(request.request_id)),
        is_new=s.is_new,
        is_resumed=s.is_resumed,
        num_draft_tokens=num_drafts,
    )
