"""An opt-in recorder of what the engine did in each step: the ``EngineTracer``.

vLLM exposes the same facts as Prometheus counters and KV-cache events
(``vllm/v1/metrics/``, ``BlockPool.take_events``) for dashboards; minivllm keeps them per
step, per request and per block, so that a reader can *see* continuous batching, chunked
prefill, preemption and prefix caching happen (``plots.py`` draws them).

Usage::

    with trace(llm) as tracer:          # an LLM or an LLMEngine
        llm.generate(prompts, params)
    tracer.steps[3].num_prefill_tokens   # what step 3 did

The engine calls :meth:`EngineTracer.record_step` once at the end of every ``step()``
while a tracer is attached; with none attached it pays one ``is None`` test per step.
Records hold plain numbers and ids, never tensors or ``Request`` objects, so a trace
can be kept, saved as JSON and plotted after the engine is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minivllm.core.block_pool import BlockEvent
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.tracing.kv_snapshot import BlockCounts, KVSnapshot, count_block_events, snapshot_kv

# The pool's side of a record lives in kv_snapshot.py; importing it from here still works.
__all__ = [
    "BlockCounts",
    "EngineTracer",
    "KVSnapshot",
    "ScheduledRecord",
    "StepRecord",
    "count_block_events",
    "snapshot_kv",
    "trace",
]

if TYPE_CHECKING:
    from minivllm.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class ScheduledRecord:
    """One request's share of one step, as the scheduler decided it.

    Attributes:
        request_id: The request.
        num_scheduled_tokens: Tokens it ran through the model this step.
        num_computed_tokens: Tokens whose K/V were cached before the step.
        num_prompt_tokens: Length of its prompt.
        is_new: Admitted from the waiting queue this step.
        is_resumed: Admitted again after a preemption.
        needs_sample: The step reached the end of its known tokens, so it sampled.
        num_cached_tokens: Prompt tokens served from the prefix cache when it was last
            admitted (0 for a request that was not admitted in this step).
        spec_token_ids: Draft tokens it verified this step (speculative decoding), the
            last ``len(spec_token_ids)`` of its scheduled tokens.
        num_accepted_tokens: How many of the drafts were accepted (a prefix of them);
            None without drafts, or when the step failed.
        new_token_ids: The tokens the step appended to the request: its accepted drafts,
            then the target model's own token (empty for a prompt chunk that samples
            nothing; shorter when a stop condition cut the run).
    """

    request_id: str
    num_scheduled_tokens: int
    num_computed_tokens: int
    num_prompt_tokens: int
    is_new: bool
    is_resumed: bool
    needs_sample: bool
    num_cached_tokens: int
    spec_token_ids: tuple[int, ...] = ()
    num_accepted_tokens: int | None = None
    new_token_ids: tuple[int, ...] = ()

    @property
    def is_decode(self) -> bool:
        """True for one token past the prompt (with its drafts, if any): a decode step.

        Everything else is prefill work: a prompt chunk, or the recomputation of a
        preempted request's prompt and outputs.
        """
        return (
            self.num_scheduled_tokens - self.num_draft_tokens == 1
            and self.num_computed_tokens >= self.num_prompt_tokens
        )

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of this share that are prefill (or recompute) work."""
        return 0 if self.is_decode else self.num_scheduled_tokens - self.num_draft_tokens

    @property
    def num_decode_tokens(self) -> int:
        """1 for a decode, else 0 (its drafts are counted apart)."""
        return 1 if self.is_decode else 0

    @property
    def num_draft_tokens(self) -> int:
        """Drafts verified this step."""
        return len(self.spec_token_ids)

    @property
    def num_rejected_tokens(self) -> int:
        """Drafts rejected this step (all of them when the step failed)."""
        return self.num_draft_tokens - (self.num_accepted_tokens or 0)


@dataclass
class StepRecord:
    """Everything one engine step did.

    Attributes:
        step: Index of the step since the tracer was attached (0-based).
        scheduled: The requests that ran, in batch order.
        preempted_req_ids: Requests preempted (blocks freed) while building the step.
        finished_req_ids: Scheduled requests that finished in this step.
        blocks: Request id -> what happened to its blocks in this step (only requests
            with block events; ``None`` collects events without a request).
        kv: The pool after the step (finished requests already freed).
        events: The raw block events of the step, in order.
    """

    step: int
    scheduled: list[ScheduledRecord]
    preempted_req_ids: list[str]
    finished_req_ids: list[str]
    blocks: dict[str | None, BlockCounts]
    kv: KVSnapshot
    events: list[BlockEvent] = field(repr=False, default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens in the batch."""
        return sum(s.num_scheduled_tokens for s in self.scheduled)

    @property
    def num_prefill_tokens(self) -> int:
        """Prefill (and recompute) tokens in the batch."""
        return sum(s.num_prefill_tokens for s in self.scheduled)

    @property
    def num_decode_tokens(self) -> int:
        """Decode tokens in the batch (one per decoding request)."""
        return sum(s.num_decode_tokens for s in self.scheduled)

    @property
    def num_draft_tokens(self) -> int:
        """Draft tokens verified in the batch (speculative decoding)."""
        return sum(s.num_draft_tokens for s in self.scheduled)

    @property
    def num_accepted_tokens(self) -> int:
        """Of those, the accepted ones."""
        return sum(s.num_accepted_tokens or 0 for s in self.scheduled)

    @property
    def block_totals(self) -> BlockCounts:
        """Block counts of the step summed over requests."""
        total = BlockCounts()
        for counts in self.blocks.values():
            total += counts
        return total


class EngineTracer:
    """Collects a :class:`StepRecord` per engine step.

    Attach it with :func:`trace` (or :meth:`attach`); it switches on the block pool's
    event log for as long as it is attached.

    Attributes:
        steps: The records, one per step, in order.
        max_num_batched_tokens: The scheduler's token budget (for plots), once attached.
        max_num_seqs: The scheduler's sequence budget, once attached.
    """

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.max_num_batched_tokens: int | None = None
        self.max_num_seqs: int | None = None
        self._enabled_events = False

    # ---- attaching --------------------------------------------------------------------

    def attach(self, engine: LLMEngine) -> None:
        """Start recording ``engine``'s steps.

        Raises:
            ValueError: If the engine already has a tracer.
        """
        if getattr(engine, "tracer", None) is not None:
            raise ValueError("this engine already has a tracer attached")
        pool = engine.kv_cache_manager.block_pool
        if pool.events is None:
            # The pool records events into a list when it has one; giving it one is all
            # that "enable_kv_cache_events" does, so a live engine can be traced.
            pool.events = []
            self._enabled_events = True
        else:
            pool.take_events()  # drop what happened before we watched
        self.max_num_batched_tokens = engine.scheduler.max_num_batched_tokens
        self.max_num_seqs = engine.scheduler.max_num_seqs
        engine.tracer = self

    def detach(self, engine: LLMEngine) -> None:
        """Stop recording; the event log goes back off if :meth:`attach` turned it on."""
        if engine.tracer is self:
            engine.tracer = None
        if self._enabled_events:
            engine.kv_cache_manager.block_pool.events = None
            self._enabled_events = False

    # ---- recording --------------------------------------------------------------------

    def record_step(
        self,
        scheduler_output: SchedulerOutput,
        kv_cache_manager: KVCacheManager,
        num_accepted_tokens: Sequence[int] | None = None,
    ) -> StepRecord:
        """Record one step; call it after the step's results were applied.

        Takes the block pool's events since the previous call. Also usable without an
        engine, with a bare ``Scheduler`` and ``KVCacheManager`` (the notebooks do).

        Args:
            scheduler_output: The step.
            kv_cache_manager: The pool it ran against.
            num_accepted_tokens: With speculative decoding, the accepted drafts per
                request, aligned with ``scheduler_output.sampling_requests()`` (what
                the runner returned and the scheduler was given).
        """
        events = kv_cache_manager.take_events()
        accepted: dict[str, int] = {}
        if num_accepted_tokens is not None:
            due = scheduler_output.sampling_requests()
            accepted = {s.request_id: n for s, n in zip(due, num_accepted_tokens, strict=True)}
        record = StepRecord(
            step=len(self.steps),
            scheduled=[
                _scheduled_record(s, accepted.get(s.request_id)) for s in scheduler_output.scheduled
            ],
            preempted_req_ids=sorted(scheduler_output.preempted_req_ids, key=_id_key),
            finished_req_ids=[
                s.request_id for s in scheduler_output.scheduled if s.request.is_finished()
            ],
            blocks=count_block_events(events),
            kv=snapshot_kv(kv_cache_manager),
            events=events,
        )
        self.steps.append(record)
        return record

    # ---- reading ----------------------------------------------------------------------

    def request_ids(self) -> list[str]:
        """Every request seen in a batch, in order of first appearance."""
        seen: dict[str, None] = {}
        for record in self.steps:
            for s in record.scheduled:
                seen.setdefault(s.request_id, None)
        return list(seen)

    def block_totals(self) -> dict[str | None, BlockCounts]:
        """Per request: block counts summed over all steps."""
        totals: dict[str | None, BlockCounts] = {}
        for record in self.steps:
            for rid, counts in record.blocks.items():
                totals.setdefault(rid, BlockCounts())
                totals[rid] += counts
        return totals

    def summary(self) -> str:
        """A few lines that say what the trace contains."""
        if not self.steps:
            return "no steps recorded"
        total = BlockCounts()
        for record in self.steps:
            total += record.block_totals
        prefill = sum(r.num_prefill_tokens for r in self.steps)
        decode = sum(r.num_decode_tokens for r in self.steps)
        peak = max(r.kv.num_blocks_in_use for r in self.steps)
        preemptions = sum(len(r.preempted_req_ids) for r in self.steps)
        text = (
            f"{len(self.steps)} steps, {len(self.request_ids())} requests: "
            f"{prefill} prefill + {decode} decode tokens\n"
            f"blocks: {total.allocated} allocated, {total.reused} reused from the prefix "
            f"cache, {total.freed} freed, {total.cached} cached, {total.evicted} evicted\n"
            f"peak {peak} / {self.steps[0].kv.num_blocks} blocks in use, "
            f"{preemptions} preemptions"
        )
        drafted = sum(r.num_draft_tokens for r in self.steps)
        if drafted:
            accepted = sum(r.num_accepted_tokens for r in self.steps)
            text += f"\ndrafts: {drafted} tokens verified, {accepted} accepted"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The trace as plain JSON-able data (events left out: they are long)."""
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "steps": [
                {
                    "step": r.step,
                    "scheduled": [dataclasses.asdict(s) for s in r.scheduled],
                    "preempted_req_ids": r.preempted_req_ids,
                    "finished_req_ids": r.finished_req_ids,
                    "blocks": {str(rid): dataclasses.asdict(c) for rid, c in r.blocks.items()},
                    "block_tables": r.kv.block_tables,
                    "num_blocks_in_use": r.kv.num_blocks_in_use,
                    "num_cached_free_blocks": r.kv.num_cached_free_blocks,
                    "num_blocks": r.kv.num_blocks,
                }
                for r in self.steps
            ],
        }


def _scheduled_record(s: ScheduledRequest, num_accepted: int | None) -> ScheduledRecord:
    return ScheduledRecord(
        request_id=s.request_id,
        num_scheduled_tokens=s.num_scheduled_tokens,
        num_computed_tokens=s.num_computed_tokens,
        num_prompt_tokens=s.request.num_prompt_tokens,
        is_new=s.is_new,
        is_resumed=s.is_resumed,
        needs_sample=s.needs_sample,
        num_cached_tokens=s.request.num_cached_tokens if s.is_new else 0,
        spec_token_ids=tuple(s.spec_token_ids),
        num_accepted_tokens=num_accepted if s.spec_token_ids else None,
        # Recorded after the step's tokens were appended: what lies past the tokens
        # known when it was scheduled is what this step added.
        new_token_ids=tuple(
            s.request.all_token_ids[s.num_computed_tokens_after - len(s.spec_token_ids) :]
        )
        if s.needs_sample
        else (),
    )


def _id_key(request_id: str) -> tuple[int, str]:
    """Sort numeric ids numerically ("2" before "10"), others after, by text."""
    return (int(request_id), "") if request_id.isdigit() else (1 << 62, request_id)


@contextmanager
def trace(llm_or_engine: Any) -> Iterator[EngineTracer]:
    """Record every step of an ``LLM``, ``LLMEngine`` or ``EngineCore`` in the ``with`` block.

    Example::

        with trace(llm) as tracer:
            llm.generate(prompts, params)
        print(tracer.summary())
    """
    # LLM -> LLMEngine -> its InprocClient -> the EngineCore that schedules and steps.
    engine = getattr(llm_or_engine, "llm_engine", llm_or_engine)
    engine = getattr(getattr(engine, "engine_core", None), "engine_core", engine)
    if not hasattr(engine, "kv_cache_manager") or not hasattr(engine, "scheduler"):
        raise ValueError(
            f"trace() needs an LLM or an LLMEngine, got {type(llm_or_engine).__name__}"
        )
    tracer = EngineTracer()
    tracer.attach(engine)
    try:
        yield tracer
    finally:
        tracer.detach(engine)
