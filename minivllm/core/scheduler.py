"""Continuous batching: which tokens of which requests run in the next step.

Upstream counterpart: ``vllm/v1/core/sched/scheduler.py`` (``Scheduler``).

There are no prefill and decode phases. Every request has a target, ``num_tokens``
(prompt plus output so far), and a progress counter, ``num_computed_tokens`` (tokens whose
K/V are cached). Each step hands out at most ``max_num_batched_tokens`` tokens so that the
counters catch up with their targets: a long prompt gets a chunk, a decoding request gets
its one new token, and both share the same batch. Running requests are served first; new
ones are admitted while budget, sequence slots and KV blocks last. When the KV pool runs
dry, the most recently admitted request is preempted: its blocks are freed and it will
recompute from scratch later.

What the engine core may call, and what each call promises, is ``SchedulerInterface``
(``sched_interface.py``); this file is how ``Scheduler`` keeps those promises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from minivllm.config import SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.request_checks import check_new_request
from minivllm.core.sched_async_spec import DRAFT_PLACEHOLDER, num_drafts_in_flight
from minivllm.core.sched_interface import SchedulerInterface
from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput, SchedulerStats
from minivllm.core.sched_spec_decode import (
    check_num_accepted,
    drafts_to_keep,
    take_drafts,
    verified_tokens,
)
from minivllm.core.sched_utils import (
    append_and_check_stop,
    reaches_max_tokens,
    tokens_in_batch_order,
)
from minivllm.request import Request, RequestStatus
from minivllm.spec_decode.metrics import SpecDecodingStats


class Scheduler(SchedulerInterface):
    """Decides, step by step, how many tokens of which requests the model runs.

    Args:
        scheduler_config: Budgets (``max_num_seqs``, ``max_num_batched_tokens``),
            ``enable_chunked_prefill`` and ``max_model_len``.
        kv_cache_manager: The block allocator; the engine builds it from the cache config
            (tests pass a tiny one to force preemptions).
        num_speculative_tokens: ``k`` of speculative decoding (0: off); the drafts'
            bookkeeping is in ``sched_spec_decode``.
        speculates_at: Whether a step of that many requests proposes drafts for the next
            (``SpeculativeConfig.speculates_at``); None: every step does. Asked about
            the step in flight, whose drafts stay on the device (``sched_async_spec``).

    Attributes:
        waiting: Requests not yet admitted, FCFS; preempted requests re-enter at the front.
        running: Admitted requests in admission order; preemption takes from the tail.
        requests: Every unfinished request by id.
        finished_req_ids: Requests finished since the last ``schedule()``.
        num_preemptions: Preemptions since start.
        num_steps: Calls to ``schedule()`` that scheduled a batch.
        num_prompt_tokens: Prompt tokens of the requests added since start.
        num_generated_tokens: Output tokens appended to requests since start.
        peak_blocks_in_use: Most KV blocks held by requests at once.
        spec_decoding_stats: Drafts verified and accepted since start (None: no
            speculative decoding).
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        num_speculative_tokens: int = 0,
        speculates_at: Callable[[int], bool] | None = None,
    ) -> None:
        # The config checked its budgets when it was built (SchedulerConfig.__post_init__).
        cfg = scheduler_config
        self.scheduler_config = cfg
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = cfg.max_num_seqs
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        self.max_model_len = cfg.max_model_len
        self.enable_chunked_prefill = cfg.enable_chunked_prefill

        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()

        self.num_preemptions = 0
        self.num_steps = 0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.peak_blocks_in_use = 0
        self.num_speculative_tokens = num_speculative_tokens
        self._speculates_at = speculates_at
        self._last_batch_size = 0  # requests in the last step built (the one in flight)
        self.spec_decoding_stats = (
            SpecDecodingStats(num_speculative_tokens) if num_speculative_tokens else None
        )

    # ------------------------------------------------------------------ admission
    def add_request(self, request: Request) -> None:
        """Check the id, then the lengths against the pool (``check_new_request``), and
        queue the request behind the others (FCFS)."""
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"request {rid}: the request id is already in use")
        kv = self.kv_cache_manager
        check_new_request(
            rid,
            request.num_prompt_tokens,
            request.max_tokens,
            self.max_model_len,
            kv.block_size,
            kv.num_blocks,
        )
        self.waiting.append(request)
        self.requests[rid] = request
        self.num_prompt_tokens += request.num_prompt_tokens

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        """Build the next batch: running requests first, then waiting ones in FCFS order."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        # With async scheduling: how many drafts the step in flight proposes per request.
        k_in_flight = self.num_speculative_tokens
        if self._speculates_at is not None and not self._speculates_at(self._last_batch_size):
            k_in_flight = 0

        # 1) RUNNING: decodes and unfinished prefills, oldest first. This loop runs for
        # every running request every step (256 of them on a busy engine), so what it
        # reads more than once is held in locals.
        running, kv, max_model_len = self.running, self.kv_cache_manager, self.max_model_len
        speculates = self.num_speculative_tokens > 0
        req_index = 0
        while req_index < len(running) and budget > 0:
            request = running[req_index]
            if reaches_max_tokens(request):
                # Async scheduling: the step in flight samples its last token already.
                req_index += 1
                continue
            in_flight = speculates and request.num_output_placeholders > 0
            if in_flight:
                # Async scheduling with a draft model: the input token and the drafts
                # are still on the device (sched_async_spec).
                num_drafts = num_drafts_in_flight(request, k_in_flight, max_model_len)
                num_new = 0 if num_drafts is None else min(1 + num_drafts, budget)
            else:
                computed = request.num_computed_tokens
                num_new = min(
                    # Catch up with every token, including one still in flight, and with
                    # the drafts to verify (speculative decoding) ...
                    request.num_tokens_with_spec + request.num_output_placeholders - computed,
                    budget,  # ... as far as the budget allows (chunked prefill)
                    max_model_len - computed,  # never past the model
                )
            if num_new <= 0:
                # Already caught up, or at max_model_len with its last token in flight
                # (or, drafts in flight, waiting for the step in flight's result).
                req_index += 1
                continue
            if not self._allocate_or_preempt(request, num_new, preempted):
                break  # it preempted itself: nothing behind it is left in `running`
            # The manager's live list: it only grows, and the runner reads it this step.
            block_ids = kv.get_block_ids(request.request_id)
            if in_flight:
                drafts = [DRAFT_PLACEHOLDER] * (num_new - 1)
            else:
                drafts = take_drafts(request, num_new)
            scheduled.append(
                ScheduledRequest.from_request(request, num_new, block_ids, drafts=drafts)
            )
            budget -= num_new
            req_index += 1

        # 2) WAITING: only when nobody was preempted, else we would admit a request just
        # to evict it (or the one we just evicted) in the next step.
        if not preempted:
            budget = self._admit_waiting(budget, scheduled)

        output = SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens={s.request_id: s.num_scheduled_tokens for s in scheduled},
            total_num_scheduled_tokens=self.max_num_batched_tokens - budget,
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
        )
        # Rebind rather than clear(): the output keeps the set it was given.
        self.finished_req_ids = set()
        self._update_after_schedule(output)
        return output

    def _allocate_or_preempt(
        self, request: Request, num_new: int, preempted: list[Request]
    ) -> bool:
        """Allocate slots for a running request, preempting from the tail until it fits.

        Returns False when the request itself had to be preempted.
        """
        while self.kv_cache_manager.allocate_slots(request, num_new) is None:
            # FCFS: the most recently admitted request loses its blocks first.
            victim = self.running.pop()
            self._preempt_request(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> int:
        """Admit waiting requests in order while slots, budget and blocks last."""
        kv = self.kv_cache_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.num_output_placeholders:
                # Preempted while its last step ran: recompute once that token is known.
                break
            # Waiting requests hold no blocks and start from 0 (preempted ones too), so the
            # prefix cache may hand back their own blocks if nobody evicted them meanwhile.
            hit_blocks, num_hit = kv.get_computed_blocks(request)
            # num_tokens, not num_prompt_tokens: a resumed request recomputes its
            # outputs as well.
            num_new = request.num_tokens - num_hit
            if not self.enable_chunked_prefill and num_new > budget:
                break  # the whole remainder must fit in one step
            num_new = min(num_new, budget)
            if kv.allocate_slots(request, num_new, hit_blocks, num_hit) is None:
                break  # strict FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            resumed = request.status == RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            request.num_cached_tokens = num_hit
            self.running.append(request)
            block_ids = kv.get_block_ids(request.request_id)
            scheduled.append(
                ScheduledRequest.from_request(request, num_new, block_ids, True, resumed)
            )
            budget -= num_new
        return budget

    def _preempt_request(self, request: Request) -> None:
        """Preempt by recompute: free all blocks and requeue at the front of waiting.

        The caller has already removed the request from ``running``.
        """
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.spec_token_ids = []
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        """Advance ``num_computed_tokens`` now, before the model has run.

        The output already holds the old values, so the runner knows where each
        request's positions start; advancing here means the next ``schedule()`` (e.g. the
        next chunk of a long prompt) never has to wait for this step's results. Each
        request that samples gets a placeholder for its token: with async scheduling
        the next ``schedule()`` counts it as an input it can already schedule.
        """
        for s in output.scheduled:
            s.request.num_computed_tokens += s.num_scheduled_tokens
            if s.needs_sample:
                # Its token, and (counted as accepted until the result says otherwise)
                # its drafts.
                s.request.num_output_placeholders += 1 + len(s.spec_token_ids)
        self.num_steps += bool(output.scheduled)
        self._last_batch_size = len(output.scheduled)
        kv = self.kv_cache_manager
        self.peak_blocks_in_use = max(self.peak_blocks_in_use, kv.num_blocks - kv.num_free_blocks)

    # ------------------------------------------------------------------ results
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int] | Sequence[int],
        errors: Mapping[str, str] | None = None,
        num_accepted_tokens: Sequence[int] | None = None,
    ) -> list[Request]:
        """Check the tokens (and accepted counts) against the requests due to sample,
        then per request: drop its placeholders, and append its verified tokens one at a
        time through the stop rules (``append_and_check_stop``), or finish it with its
        error. See ``SchedulerInterface.update_from_output`` for the arguments."""
        due = scheduler_output.sampling_requests()
        tokens = tokens_in_batch_order(due, sampled_token_ids)
        accepted = check_num_accepted(due, num_accepted_tokens)
        finished: list[Request] = []
        for s, token, num_accepted in zip(due, tokens, accepted):
            request = s.request
            request.num_output_placeholders -= 1 + len(s.spec_token_ids)
            if not self.keeps_token(request):
                continue
            # Async scheduling can preempt a request while its last step runs; it then
            # waits for recompute, and its token still counts.
            queue = self.running if request.status == RequestStatus.RUNNING else self.waiting
            error = errors.get(request.request_id) if errors else None
            if error is not None:
                request.status, request.stop_reason = RequestStatus.FINISHED_ERROR, error
            else:
                new_tokens = verified_tokens(s, token, num_accepted, self.spec_decoding_stats)
                self.num_generated_tokens += append_and_check_stop(
                    request, new_tokens, self.max_model_len
                )
                if not request.is_finished():
                    continue
            queue.remove(request)
            self._free_request(request)
            finished.append(request)
        return finished

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """Running requests keep what ``drafts_to_keep`` allows (upstream's name)."""
        for rid, drafts in draft_token_ids.items():
            request = self.requests.get(rid)
            if request is not None and request.status == RequestStatus.RUNNING:
                k = self.num_speculative_tokens
                request.spec_token_ids = drafts_to_keep(request, drafts, k)

    def finish_requests(
        self, request_ids: str | Iterable[str], status: RequestStatus
    ) -> list[Request]:
        """Take each request out of its queue, set ``status`` and free it."""
        if not RequestStatus.is_finished(status):
            raise ValueError(f"status must be a finished status, got {status.name}")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        done: list[Request] = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
            done.append(request)
        return done

    def fail_step(
        self, scheduler_output: SchedulerOutput, message: str, resend_finished: bool
    ) -> list[Request]:
        """Finish the step's still-live requests with ``message`` (their blocks leave
        the prefix cache, ``_free_request``)."""
        if resend_finished:
            self.finished_req_ids |= scheduler_output.finished_req_ids
        failed = [
            s.request
            for s in scheduler_output.scheduled
            if self.requests.get(s.request_id) is s.request and not s.request.is_finished()
        ]
        for request in failed:
            queue = self.running if request.status == RequestStatus.RUNNING else self.waiting
            queue.remove(request)
            request.status, request.stop_reason = RequestStatus.FINISHED_ERROR, message
            self._free_request(request)
        return failed

    def _free_request(self, request: Request) -> None:
        """Release a finished request's blocks and forget it (a failed request's blocks
        leave the prefix cache: their K/V may be wrong or missing)."""
        failed = request.status == RequestStatus.FINISHED_ERROR
        self.kv_cache_manager.free(request, uncache=failed)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    # ------------------------------------------------------------------ queries
    def get_num_unfinished_requests(self) -> int:
        """Waiting plus running."""
        return len(self.waiting) + len(self.running)

    def make_stats(self) -> SchedulerStats:
        """Queue lengths, the pool's usage and prefix-cache counts, this scheduler's
        counters, and a copy of the speculation counts."""
        kv = self.kv_cache_manager
        stats = kv.prefix_cache_stats
        spec = self.spec_decoding_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            num_preemptions=self.num_preemptions,
            num_steps=self.num_steps,
            peak_blocks_in_use=self.peak_blocks_in_use,
            prefix_cache_queries=stats.queries,
            prefix_cache_hits=stats.hits,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generated_tokens,
            num_kv_blocks=kv.num_blocks,
            spec_decoding_stats=None if spec is None else spec.copy(),
        )
