"""What one scheduling step hands to the model runner.

Upstream counterpart: ``vllm/v1/core/sched/output.py`` (``SchedulerOutput``,
``NewRequestData``, ``CachedRequestData``).

vLLM runs the scheduler and the GPU workers in different processes, so its output is a
*diff*: full data for requests a worker has never seen (``NewRequestData``) and only the
changes for the others (``CachedRequestData``), which the worker applies to its own
persistent copy of the batch. minivllm runs everything in one process, so the output
simply carries the ``Request`` objects, with the few numbers that change during the
step snapshotted at scheduling time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.request import Request
from minivllm.spec_decode.metrics import SpecDecodingStats


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    Attributes:
        request: The request itself (its token lists are read, never written, by the
            runner).
        num_scheduled_tokens: How many of its tokens run through the model this step.
        num_computed_tokens: Tokens whose K/V were already cached *before* this step; the
            scheduled tokens occupy positions ``num_computed_tokens ..
            num_computed_tokens + num_scheduled_tokens - 1``. A snapshot: the scheduler
            advances ``request.num_computed_tokens`` as soon as the step is built.
        block_ids: The request's KV block ids, in order, after this step's allocation.
            This is the KV cache manager's own list, not a copy (the scheduler builds an
            output for every running request every step): read it during the step it was
            scheduled for; later steps may append to it.
        is_new: Admitted from the waiting queue in this step (fresh or resumed).
        is_resumed: Admitted again after a preemption (implies ``is_new``).
        needs_sample: This step reaches the end of the request's known tokens, so the
            runner samples a token at its last scheduled position. False for a chunk of
            a prompt that is not the last one.
        spec_token_ids: Draft tokens scheduled after the request's known tokens, to be
            verified this step (speculative decoding); they are the last
            ``len(spec_token_ids)`` of the scheduled tokens.
    """

    request: Request
    num_scheduled_tokens: int
    num_computed_tokens: int
    block_ids: list[int]
    is_new: bool = False
    is_resumed: bool = False
    needs_sample: bool = False
    spec_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_request(
        cls,
        request: Request,
        num_new: int,
        block_ids: list[int],
        is_new: bool = False,
        resumed: bool = False,
        drafts: list[int] | None = None,
    ) -> ScheduledRequest:
        """Snapshot what the runner needs about ``request``, scheduled for ``num_new``
        tokens (``drafts`` among them), before the scheduler advances its counters."""
        computed = request.num_computed_tokens
        # Positional: the scheduler builds one of these per running request per step.
        return cls(
            request,
            num_new,
            computed,
            block_ids,
            is_new,
            resumed,
            computed + num_new >= request.num_tokens + request.num_output_placeholders,
            drafts or [],
        )

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.request.request_id

    @property
    def num_computed_tokens_after(self) -> int:
        """Cached tokens once this step has run."""
        return self.num_computed_tokens + self.num_scheduled_tokens

    @property
    def token_ids(self) -> list[int]:
        """The input token ids of this step (prompt chunk, resumed tokens, or one decode),
        then its drafts."""
        end = self.num_computed_tokens_after - len(self.spec_token_ids)
        known = self.request.all_token_ids[self.num_computed_tokens : end]
        return known + self.spec_token_ids if self.spec_token_ids else known


@dataclass
class SchedulerOutput:
    """Everything the model runner needs for one step.

    Attributes:
        scheduled: Requests in batch order: running requests first (decodes and
            unfinished prefills), then the ones admitted from the waiting queue.
        num_scheduled_tokens: request id -> tokens scheduled for it.
        total_num_scheduled_tokens: Sum of ``num_scheduled_tokens``; never above
            ``max_num_batched_tokens``.
        preempted_req_ids: Requests preempted (blocks freed) while building this step.
        finished_req_ids: Requests that finished since the previous step, so per-request
            state held elsewhere (e.g. sampler generators) can be dropped.
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def is_empty(self) -> bool:
        """True when no request got any token (nothing for the model to do)."""
        return self.total_num_scheduled_tokens == 0

    @property
    def req_ids(self) -> list[str]:
        """Scheduled request ids, in batch order."""
        return [s.request_id for s in self.scheduled]

    @property
    def new_req_ids(self) -> list[str]:
        """Requests admitted from the waiting queue this step (fresh and resumed)."""
        return [s.request_id for s in self.scheduled if s.is_new]

    @property
    def resumed_req_ids(self) -> list[str]:
        """Requests re-admitted after a preemption this step."""
        return [s.request_id for s in self.scheduled if s.is_resumed]

    @property
    def scheduled_spec_decode_tokens(self) -> dict[str, list[int]]:
        """request id -> the drafts it verifies this step (requests with drafts only)."""
        return {s.request_id: s.spec_token_ids for s in self.scheduled if s.spec_token_ids}

    def sampling_requests(self) -> list[ScheduledRequest]:
        """The scheduled requests that produce a token this step, in batch order.

        ``Scheduler.update_from_output`` accepts a plain list of sampled ids aligned
        with this list.
        """
        return [s for s in self.scheduled if s.needs_sample]


@dataclass
class SchedulerStats:
    """A snapshot of the scheduler, sent with every step's outputs: the one source of
    the engine's counters (its summary, the log line and the Prometheus metrics).

    Attributes:
        num_running_reqs: Requests admitted and holding KV blocks.
        num_waiting_reqs: Requests queued (new or preempted).
        kv_cache_usage: Fraction of KV blocks held by requests.
        num_preemptions: Preemptions since start.
        num_steps: Steps that scheduled a batch, since start.
        peak_blocks_in_use: Most KV blocks held at once since start.
        prefix_cache_queries: Prompt tokens looked up in the prefix cache.
        prefix_cache_hits: Of those, tokens found cached.
        num_prompt_tokens: Prompt tokens of the requests added since start.
        num_generation_tokens: Output tokens kept since start (async scheduling computes
            one token past a stop and drops it; that one is not counted).
        num_kv_blocks: Size of the KV pool.
        spec_decoding_stats: Drafts proposed and accepted since start; None without
            speculative decoding.
    """

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    num_preemptions: int
    num_steps: int
    peak_blocks_in_use: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_kv_blocks: int = 0
    spec_decoding_stats: SpecDecodingStats | None = None

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hits over queries (0 when nothing was looked up)."""
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries
