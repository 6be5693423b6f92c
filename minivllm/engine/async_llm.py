"""The asyncio front end: many concurrent streams over one engine core process.

Upstream counterpart: ``vllm/v1/engine/async_llm.py`` (``AsyncLLM``, ``generate``,
``abort``, ``output_handler``). Each caller of ``generate`` gets an async iterator of
``RequestOutput``s. Behind them:

1. ``add_request`` validates and tokenizes the prompt (``InputProcessor``), registers a
   ``RequestState`` with its own ``RequestOutputCollector`` in the ``OutputProcessor``
   and sends the request to the core over ZeroMQ;
2. one background task, the output handler, waits for each step's
   ``EngineCoreOutputs``, lets the ``OutputProcessor`` turn them into outputs (which it
   puts into the callers' collectors), aborts requests that a stop string ended, and
   hands the step's statistics to the stat loggers;
3. each ``generate`` caller awaits its collector. If the caller goes away (a client
   disconnects, a task is cancelled) the request is aborted in the core at once, so
   its KV blocks go back to the pool.

The core steps on its own in its own process, so detokenizing, HTTP and everything
else in this process overlaps with the model instead of delaying it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import msgspec

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerStats
from minivllm.core.step_record import StepRecord
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.core_client import AsyncMPClient, engine_args_to_dict
from minivllm.engine.exceptions import EngineDeadError, EngineGenerateError
from minivllm.engine.input_processor import InputProcessor, PromptType
from minivllm.engine.llm_engine import load_tokenizer
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.engine.usage import UsageContext
from minivllm.metrics.stats import IterationStats
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Seconds between the periodic log lines of loggers that have one.
_LOG_INTERVAL_S = 10.0
# Default sampling interval of step records: a few pictures a second are enough to
# watch, and building one costs the core a pass over the held and cached blocks.
STEP_RECORD_INTERVAL_S = 0.25
# Records a slow subscriber may fall behind before its oldest are dropped.
_STEP_RECORD_QUEUE_SIZE = 4


class AsyncLLM:
    """Serve many requests at once from asyncio; the engine core runs separately.

    Args:
        vllm_config: The resolved configuration (the core builds its own from the same
            ``engine_args``, with this configuration's token budget).
        engine_args: The arguments the core process is started with.
        stat_loggers: Objects with ``record(scheduler_stats, iteration_stats)`` (and
            optionally ``log()``), called once per processed step.
        multiprocess: Run the core in its own process (True) or in a thread of this one
            (False: notebooks and tests; same sockets, same code).
        model_name: The name clients use for the model (default: ``engine_args.model``).

    The core process is started with ``spawn``, which re-imports the calling script: a
    script that builds an ``AsyncLLM`` needs an ``if __name__ == "__main__":`` guard.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_args: EngineArgs,
        stat_loggers: Iterable[Any] | None = None,
        multiprocess: bool = True,
        model_name: str | None = None,
    ) -> None:
        self.vllm_config = vllm_config
        self.model_name = model_name or engine_args.model
        self.tokenizer = load_tokenizer(vllm_config.model_config.tokenizer)
        core_args = engine_args_to_dict(engine_args)
        # The core resolves its configuration again without knowing who started it, so
        # the budget the usage context chose here travels explicitly; else the core would
        # take the LLM class's default and plan steps the front end did not.
        core_args["max_num_batched_tokens"] = vllm_config.scheduler_config.max_num_batched_tokens
        self.engine_core = AsyncMPClient(core_args, in_thread=not multiprocess)
        vllm_config.cache_config.num_kv_blocks = self.engine_core.num_kv_blocks
        self.input_processor = InputProcessor(
            vllm_config, self.tokenizer, self.engine_core.num_kv_blocks
        )
        self.output_processor = OutputProcessor(
            self.tokenizer, vllm_config.scheduler_config.stream_interval
        )
        self.stat_loggers = list(stat_loggers or [])
        self.scheduler_stats: SchedulerStats | None = None
        self.output_handler: asyncio.Task | None = None
        self._dead_error: EngineDeadError | None = None
        self._last_log = time.monotonic()
        # Step records for live viewers: the newest, one queue per subscriber, and how
        # many holders keep recording on (see acquire_step_records).
        self.latest_step_record: StepRecord | None = None
        self._step_record_queues: set[asyncio.Queue] = set()
        self._step_record_holders = 0
        self._step_record_tasks: set[asyncio.Task] = set()

    @classmethod
    def from_engine_args(
        cls,
        engine_args: EngineArgs,
        stat_loggers: Iterable[Any] | None = None,
        multiprocess: bool = True,
        model_name: str | None = None,
        usage_context: UsageContext = UsageContext.OPENAI_API_SERVER,
    ) -> AsyncLLM:
        """Validate the arguments (errors name the argument), then start the engine.

        ``usage_context`` picks the default token budget; streaming to many clients is
        the server's usage, so it is the default here (upstream's ``AsyncLLM`` takes the
        same argument).
        """
        config = engine_args.create_engine_config(usage_context)
        return cls(config, engine_args, stat_loggers, multiprocess, model_name)

    # ---- requests ---------------------------------------------------------------------

    async def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams
    ) -> RequestOutputCollector:
        """Validate and queue one request; return the collector its outputs go to.

        Raises:
            ValueError: The prompt or parameters are invalid, or the id is in use.
            EngineDeadError: The engine core is gone.
        """
        if self._dead_error is not None:
            raise self._dead_error
        self._start_output_handler()
        if self._id_in_use(request_id):
            raise ValueError(f"request {request_id}: the request id is already in use")
        prompt_text, request = self.input_processor.process_inputs(request_id, prompt, params)
        queue = RequestOutputCollector(request.sampling_params.output_kind)
        if request.sampling_params.n == 1:
            children = [(request, None, 0)]
        else:
            parent = ParentRequest(request_id, request.sampling_params)
            children = []
            for index in range(parent.n):
                child_id, child_params = parent.get_child_info(index)
                child = msgspec.structs.replace(
                    request, request_id=child_id, sampling_params=child_params
                )
                children.append((child, parent, index))
        for child, parent, index in children:
            self.output_processor.add_request(child, prompt_text, parent, index, queue)
        for child, _, _ in children:
            await self.engine_core.add_request_async(child)
        return queue

    def _id_in_use(self, request_id: str) -> bool:
        states = self.output_processor.request_states
        return request_id in states or any(
            s.parent is not None and s.parent.request_id == request_id for s in states.values()
        )

    async def generate(
        self, prompt: PromptType, sampling_params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream the outputs of one request, as ``sampling_params.output_kind`` asks.

        The last output has ``finished=True``. Leaving the loop early (``break``, a
        cancelled task, a disconnected client) aborts the request in the engine core.

        Raises:
            ValueError: Invalid input, before anything is queued.
            EngineDeadError: The engine core failed or died.
            EngineGenerateError: This request failed; others are unaffected.
        """
        finished = False
        queue = None
        try:
            queue = await self.add_request(request_id, prompt, sampling_params)
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            if queue is not None and not finished:
                await self.abort(request_id)
            raise
        except (ValueError, EngineDeadError, EngineGenerateError):
            raise  # already this request's own error (a failed request needs no abort)
        except Exception as exc:
            await self.abort(request_id)
            raise EngineGenerateError(f"request {request_id} failed: {exc}") from exc

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests (an ``n > 1`` request with all its samples); unknown ids are
        ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        stats = IterationStats()
        to_abort = self.output_processor.abort_requests(ids, stats)
        if stats.finished_requests:
            self._record_stats(None, stats)  # request_success{finished_reason="abort"}
        if to_abort and self._dead_error is None:
            await self.engine_core.abort_requests_async(to_abort)

    # ---- step records for live viewers ------------------------------------------------

    async def start_step_records(self, interval_s: float = STEP_RECORD_INTERVAL_S) -> None:
        """Ask the core for a ``StepRecord`` at most every ``interval_s`` seconds (and
        one of its state now); they arrive in ``latest_step_record`` and
        ``step_records()``.

        Raises:
            ValueError: ``interval_s`` is negative or not finite.
            EngineDeadError: The engine core is gone.
        """
        if not (math.isfinite(interval_s) and interval_s >= 0):
            raise ValueError(f"interval_s must be a finite number >= 0, got {interval_s}")
        self._start_output_handler()
        await self.engine_core.set_step_records_async(interval_s)

    async def stop_step_records(self) -> None:
        """Ask the core to stop sending records (the engine then pays nothing for them)."""
        if self._dead_error is None:
            await self.engine_core.set_step_records_async(None)

    async def acquire_step_records(self, interval_s: float = STEP_RECORD_INTERVAL_S) -> None:
        """Count one more viewer; the first turns recording on."""
        self._step_record_holders += 1
        if self._step_record_holders == 1:
            try:
                await self.start_step_records(interval_s)
            except BaseException:
                self._step_record_holders -= 1
                raise

    def release_step_records(self) -> None:
        """Count one viewer less; when none is left, recording stops.

        Not a coroutine, so a viewer's ``finally`` can call it even while it is being
        cancelled; the stop message is sent by a task of its own.
        """
        self._step_record_holders = max(self._step_record_holders - 1, 0)
        if self._step_record_holders == 0:
            task = asyncio.get_running_loop().create_task(self._stop_if_unwatched())
            self._step_record_tasks.add(task)
            task.add_done_callback(self._step_record_tasks.discard)

    async def _stop_if_unwatched(self) -> None:
        if self._step_record_holders == 0:  # nobody came back meanwhile
            await self.stop_step_records()

    @property
    def step_records_on(self) -> bool:
        """Whether any viewer holds recording on."""
        return self._step_record_holders > 0

    async def step_records(
        self, interval_s: float = STEP_RECORD_INTERVAL_S
    ) -> AsyncGenerator[StepRecord, None]:
        """Yield the core's step records as they arrive, starting with one of its state
        now; recording is on while at least one such iterator is open.

        A subscriber that falls behind loses its oldest records, never holds up the
        engine or other subscribers.
        """
        queue: asyncio.Queue = asyncio.Queue(maxsize=_STEP_RECORD_QUEUE_SIZE)
        self._step_record_queues.add(queue)
        try:
            await self.acquire_step_records(interval_s)
        except BaseException:
            self._step_record_queues.discard(queue)
            raise
        try:
            while True:
                yield await queue.get()
        finally:
            self._step_record_queues.discard(queue)
            self.release_step_records()

    def _publish_step_record(self, record: StepRecord) -> None:
        self.latest_step_record = record
        for queue in self._step_record_queues:
            if queue.full():
                queue.get_nowait()  # drop this subscriber's oldest
            queue.put_nowait(record)

    # ---- the output handler -----------------------------------------------------------

    def _start_output_handler(self) -> None:
        if self.output_handler is None:
            self.output_handler = asyncio.get_running_loop().create_task(
                self._run_output_handler(), name="AsyncLLM.output_handler"
            )

    async def _run_output_handler(self) -> None:
        """Forever: await the core's next step, turn it into outputs, record its stats."""
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                if outputs.scheduler_stats is not None:
                    self.scheduler_stats = outputs.scheduler_stats
                for record in outputs.step_records:
                    self._publish_step_record(record)
                iteration_stats = IterationStats()
                processed = self.output_processor.process_outputs(
                    outputs.outputs, outputs.timestamp, iteration_stats
                )
                if processed.reqs_to_abort:
                    await self.engine_core.abort_requests_async(processed.reqs_to_abort)
                self._record_stats(outputs.scheduler_stats, iteration_stats)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, EngineDeadError) else EngineDeadError(repr(exc))
            logger.error("AsyncLLM output handler failed: %s", error)
            self._dead_error = error
            self.output_processor.propagate_error(error)

    def _record_stats(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats
    ) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.record(scheduler_stats, iteration_stats)
        now = time.monotonic()
        if now - self._last_log >= _LOG_INTERVAL_S:
            self._last_log = now
            for stat_logger in self.stat_loggers:
                if hasattr(stat_logger, "log"):
                    stat_logger.log()

    # ---- health and shutdown ----------------------------------------------------------

    @property
    def errored(self) -> bool:
        """True once the engine core failed or died."""
        if self._dead_error is None and not self.engine_core.is_alive():
            self._dead_error = EngineDeadError("the engine core process died")
            self.output_processor.propagate_error(self._dead_error)
        return self._dead_error is not None

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` if the engine can no longer serve."""
        if self.errored:
            raise self._dead_error  # type: ignore[misc]

    def shutdown(self) -> None:
        """Stop the output handler and the engine core (idempotent)."""
        if self.output_handler is not None:
            self.output_handler.cancel()
            self.output_handler = None
        self.engine_core.shutdown()
