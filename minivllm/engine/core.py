"""The engine core: the scheduler and the model, stepping.

Upstream counterpart: ``EngineCore`` in ``vllm/v1/engine/core.py`` (``EngineCore.step``,
``step_with_batch_queue``).

``EngineCore`` owns everything that decides or computes: the KV cache manager, the
scheduler and the executor. It takes ``EngineCoreRequest``s and returns, each step, an
``EngineCoreOutputs`` holding only what changed. It never sees text: the tokenizer,
detokenization, stop strings and ``RequestOutput``s belong to the front end. Offline it
runs in the caller's thread; for serving, ``EngineCoreProc`` (``core_proc.py``) runs it
in a process of its own. With speculative decoding, an ``EngineDrafter``
(``core_spec_decode.py``) proposes the next step's drafts once a step's tokens are in.
"""

from __future__ import annotations

import logging
from typing import Any

from minivllm.config import VllmConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.core.step_record import StepRecord, StepRecorder
from minivllm.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from minivllm.engine.core_spec_decode import EngineDrafter
from minivllm.engine.exceptions import EngineDeadError
from minivllm.executor.abstract import Executor
from minivllm.request import Request, RequestStatus
from minivllm.runner_outputs import AsyncModelRunnerOutput, ModelRunnerOutput

logger = logging.getLogger(__name__)

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class EngineCore:
    """Scheduler + executor: add and abort requests, and ``step()``.

    Args:
        vllm_config: The resolved configuration; ``cache_config.num_kv_blocks`` is set
            here once the executor has sized the pool.
    """

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
        # In-process runner for tensor_parallel_size 1, worker processes otherwise.
        self.model_executor = Executor.get_class(vllm_config)(vllm_config)
        try:
            num_blocks = self.model_executor.determine_num_blocks()
            _check_pool_fits_one_request(
                num_blocks, cache_config.block_size, model_config.max_model_len
            )
            cache_config.num_kv_blocks = num_blocks
            self.model_executor.initialize_kv_cache(num_blocks)
        except BaseException:
            self.model_executor.shutdown()  # no worker process outlives a failed init
            raise
        self.kv_cache_manager = KVCacheManager(
            num_blocks, cache_config.block_size, cache_config.enable_prefix_caching
        )
        spec = vllm_config.speculative_config
        self.scheduler = Scheduler(
            vllm_config.scheduler_config,
            self.kv_cache_manager,
            num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
            speculates_at=None if spec is None else spec.speculates_at,
        )
        # Speculative decoding: who proposes drafts between steps (core_spec_decode.py).
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling
        self.spec_decode: EngineDrafter | None = None
        if spec is not None:
            self.spec_decode = EngineDrafter(
                spec, self.scheduler, model_config.max_model_len, self.async_scheduling
            )
        self._block_hasher = (
            get_request_block_hasher(cache_config.block_size)
            if cache_config.enable_prefix_caching
            else None
        )
        self._eos_token_ids = model_config.eos_token_ids
        # With async scheduling: the step queued on the device whose tokens have not
        # been processed yet, as (its scheduler output, its output handle).
        self._in_flight: tuple[SchedulerOutput, AsyncModelRunnerOutput] | None = None
        # Scheduling events of each request, sent with its next output.
        self._events: dict[str, list[EngineCoreEvent]] = {}
        # Set by minivllm.tracing.trace(): records every step when not None.
        self.tracer: Any = None
        # Live viewers' per-step records (set_step_records); None while nobody watches.
        self.step_recorder: StepRecorder | None = None
        self._step_records: list[StepRecord] = []  # the next outputs carry them
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB",
            num_blocks,
            cache_config.block_size,
            num_blocks * cache_config.block_size,
            num_blocks * self.model_executor.kv_spec.block_bytes_all_layers / 2**20,
        )

    def shutdown(self) -> None:
        """Stop the model's worker processes, if any (idempotent)."""
        self.model_executor.shutdown()

    # ---- requests in ------------------------------------------------------------------

    def add_request(self, core_request: EngineCoreRequest) -> None:
        """Queue a request; ``ValueError`` if the scheduler refuses it (nothing is kept)."""
        params = core_request.sampling_params
        # The model's EOS ids end the request too (unless ignore_eos); added here, where
        # the model is known, on the core's own copy of the parameters.
        params.update_from_generation_config(self._eos_token_ids)
        request = Request(
            core_request.request_id,
            core_request.prompt_token_ids,
            params,
            core_request.eos_token_id,
            core_request.arrival_time,
            self._block_hasher,
        )
        self.scheduler.add_request(request)
        self._events[request.request_id] = [EngineCoreEvent.new_event(EngineCoreEventType.QUEUED)]

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish requests as aborted and free their blocks; unknown ids are ignored."""
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        for rid in request_ids:
            self._events.pop(rid, None)
        if not self.scheduler.has_unfinished_requests():
            # The step in flight only computes tokens of aborted requests: drop them.
            self._drain([])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (False while requests hold blocks)."""
        return self.kv_cache_manager.reset_prefix_cache()

    def has_work(self) -> bool:
        """True while a request is queued or running, or a step is still in flight."""
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run a method on every worker (see ``Executor.collective_rpc``)."""
        return self.model_executor.collective_rpc(method, args, kwargs)

    # ---- step records for live viewers ------------------------------------------------

    def set_step_records(self, interval_s: float | None) -> None:
        """Attach a ``StepRecord`` to a step's outputs at most every ``interval_s``
        seconds (0: every step), or stop (None). Off by default.

        Raises:
            ValueError: ``interval_s`` is negative or not finite.
        """
        self.step_recorder = (
            None if interval_s is None else StepRecorder(self.scheduler, interval_s)
        )
        self._step_records = []

    def _take_step_records(self) -> list[StepRecord]:
        records, self._step_records = self._step_records, []
        return records

    # ---- the loop ---------------------------------------------------------------------

    def step(self) -> EngineCoreOutputs:
        """Run one step; return what every request gained in it.

        Synchronously a step is schedule -> execute -> update. With async scheduling
        (vLLM's ``step_with_batch_queue`` with a queue of two) the core keeps one step
        in flight: it schedules and queues step N+1 while the device still runs step N,
        then waits for step N's tokens and processes them while the device runs N+1.
        The host's work hides behind the device's instead of adding to it. The price:
        a request that stops in step N (EOS, stop token or string) has already been
        scheduled for N+1, and that one token is computed and dropped.

        A step that raises, when queued or when its results are read, fails its own
        requests and no others (``_fail_step``); only a dead executor escapes, as
        ``EngineDeadError``.
        """
        outputs: list[EngineCoreOutput] = []
        # The tracer pictures the KV cache as each step left it, so it runs in step.
        run_ahead = self.async_scheduling and self.tracer is None
        if not run_ahead:
            self._drain(outputs)
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            self._record_schedule_events(scheduler_output)
            if self.step_recorder is not None:
                record = self.step_recorder.on_schedule(scheduler_output)
                if record is not None:
                    self._step_records.append(record)
            try:
                handle = self.model_executor.execute_model_async(scheduler_output)
            except Exception as exc:
                self._drain(outputs)  # the step in flight may still be fine
                self._fail_step(scheduler_output, exc, outputs, resend_finished=True)
            else:
                if run_ahead:
                    previous, self._in_flight = self._in_flight, (scheduler_output, handle)
                    if previous is not None:
                        self._process_step(*previous, outputs)
                    drafter = self.spec_decode
                    if drafter is not None and drafter.needs_settling(scheduler_output):
                        self._drain(outputs)
                else:
                    self._process_step(scheduler_output, handle, outputs)
        if not self.scheduler.has_unfinished_requests():
            # Everything finished: the step in flight only computed tokens past the end.
            self._drain(outputs)
            if self.step_recorder is not None:
                # The engine goes idle: show the freed pool, whatever the interval says.
                self._step_records.append(self.step_recorder.idle_record())
        return EngineCoreOutputs(
            outputs=outputs,
            scheduler_stats=self.scheduler.make_stats(),
            step_records=self._take_step_records(),
        )

    def _drain(self, outputs: list[EngineCoreOutput]) -> None:
        """Wait for the step in flight, if any, and process it."""
        if self._in_flight is not None:
            (scheduler_output, handle), self._in_flight = self._in_flight, None
            self._process_step(scheduler_output, handle, outputs)

    def _record_schedule_events(self, scheduler_output: SchedulerOutput) -> None:
        for s in scheduler_output.scheduled:
            if s.is_new:
                self._add_event(s.request_id, EngineCoreEventType.SCHEDULED)
        for rid in scheduler_output.preempted_req_ids:
            self._add_event(rid, EngineCoreEventType.PREEMPTED)

    def _add_event(self, request_id: str, kind: EngineCoreEventType) -> None:
        self._events.setdefault(request_id, []).append(EngineCoreEvent.new_event(kind))

    def _process_step(
        self,
        scheduler_output: SchedulerOutput,
        handle: AsyncModelRunnerOutput,
        outputs: list[EngineCoreOutput],
    ) -> None:
        """Wait for a step's tokens, hand them to the scheduler (which appends them and
        applies the token-level stop rules), and describe each request's gains."""
        try:
            runner_output = handle.get_output()
            due = scheduler_output.sampling_requests()
            # Asked before the scheduler appends: afterwards a request that just
            # finished looks like one that had finished before the step.
            keeps = self.scheduler.keeps_token
            live = [
                (row, s.request, s.request.num_output_tokens)
                for row, s in enumerate(due)
                if keeps(s.request)
            ]
            self.scheduler.update_from_output(
                scheduler_output,
                runner_output.sampled_token_ids,
                runner_output.errors,
                runner_output.num_accepted_tokens,
            )
        except Exception as exc:  # update_from_output checks before it changes anything
            self._fail_step(scheduler_output, exc, outputs, resend_finished=False)
            return
        accepted = runner_output.num_accepted_tokens
        if self.tracer is not None:
            self.tracer.record_step(scheduler_output, self.kv_cache_manager, accepted)
        if self.step_recorder is not None:  # the drafts' fate, into this step's record
            self.step_recorder.on_verified(scheduler_output, accepted)
        for row, request, num_before in live:
            out = self._make_output(request, row, runner_output, num_before)
            if accepted is not None and out.new_token_ids:
                out.num_draft_tokens = len(due[row].spec_token_ids)
                out.num_accepted_tokens = accepted[row]
            outputs.append(out)
        if runner_output.prompt_logprobs:
            sampled = {request.request_id for _, request, _ in live}
            for rid in runner_output.prompt_logprobs:
                request = self.scheduler.requests.get(rid)
                if rid not in sampled and request is not None:  # a prefill chunk, no token
                    outputs.append(self._make_output(request, None, runner_output))
        if self.spec_decode is not None:
            in_flight = None if self._in_flight is None else self._in_flight[0]
            self.spec_decode.after_step(scheduler_output, runner_output, in_flight)

    def _fail_step(
        self,
        scheduler_output: SchedulerOutput,
        exc: Exception,
        outputs: list[EngineCoreOutput],
        resend_finished: bool,
    ) -> None:
        """A step raised: fail exactly its requests, unless the executor is broken.

        Only the failed step's requests depend on its results, and the scheduler
        finishes them (``Scheduler.fail_step``); everyone else runs on. When the
        executor cannot run anything any more (``Executor.is_failed``: its workers are
        gone, or the GPU's context is broken), the engine is dead.
        """
        first_line = str(exc).partition("\n")[0]  # a TP error's traceback follows
        reason = f"{type(exc).__name__}: {first_line}"
        if self.model_executor.is_failed:
            raise EngineDeadError(f"the executor cannot run any more: {reason}") from exc
        failed = self.scheduler.fail_step(scheduler_output, reason, resend_finished)
        logger.error(
            "a step failed; its requests %s finish with an error",
            [r.request_id for r in failed],
            exc_info=exc,
        )
        for request in failed:
            outputs.append(self._make_output(request, None, None))

    def _make_output(
        self,
        request: Request,
        row: int | None,
        runner_output: ModelRunnerOutput | None,
        num_before: int = 0,
    ) -> EngineCoreOutput:
        """The request's gains in one step; ``num_before``: its output tokens before it
        (a speculative step may add several)."""
        rid = request.request_id
        if request.status == RequestStatus.FINISHED_ERROR:
            row = None  # its row's token and logprobs mean nothing
        prompt_logprobs = None if runner_output is None else runner_output.prompt_logprobs
        # Both dicts are empty in most steps: this runs for every request every step.
        out = EngineCoreOutput(
            rid,
            [] if row is None else request.output_token_ids[num_before:],
            new_prompt_logprobs=prompt_logprobs.get(rid) if prompt_logprobs else None,
            num_cached_tokens=request.num_cached_tokens,
            events=self._events.pop(rid, None) if self._events else None,
        )
        lists = None if runner_output is None else runner_output.logprobs
        if row is not None and lists is not None and request.sampling_params.logprobs is not None:
            # One row per kept token: a speculative step may keep several, and a stop
            # rule inside its accepted run keeps fewer than it computed.
            out.new_logprobs = lists.slice_request(row, len(out.new_token_ids))
        if request.is_finished():
            out.finish_reason = _FINISH_REASONS[request.status]
            out.stop_reason = request.stop_reason
        return out


def _check_pool_fits_one_request(num_blocks: int, block_size: int, max_model_len: int) -> None:
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        raise ValueError(
            f"the KV pool holds {num_blocks} blocks x {block_size} tokens = {capacity} "
            f"tokens, fewer than max_model_len={max_model_len}: one full-length request "
            f"could never run. Raise num_kv_blocks (or gpu_memory_utilization) or lower "
            f"max_model_len."
        )
