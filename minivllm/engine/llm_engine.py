"""The engine: one in-process loop of schedule -> execute -> update.

Upstream counterparts: ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``) and the inner
loop ``vllm/v1/engine/core.py`` (``EngineCore.step``, ``step_with_batch_queue``). vLLM
splits these across processes (the core runs behind ZeroMQ so tokenization and
detokenization overlap the GPU); minivllm keeps them in one object so the whole step
reads top to bottom in one method, with the output side in ``output_processor.py``.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from minivllm.config import VllmConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.scheduler import Scheduler
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.executor.abstract import Executor
from minivllm.outputs import RequestOutput
from minivllm.request import Request, RequestStatus
from minivllm.runner_outputs import AsyncModelRunnerOutput as AsyncOutput
from minivllm.sampling_params import SamplingParams
from minivllm.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

PromptType = str | dict[str, Any]
"""A prompt: text, or ``{"prompt_token_ids": [...]}`` (optionally with ``"prompt"``)."""


@dataclass
class EngineStats:
    """Counters of one engine's lifetime, printed by ``minivllm generate``."""

    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    peak_blocks_in_use: int = 0
    num_kv_blocks: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Fraction of looked-up prompt tokens served from the prefix cache."""
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )


class LLMEngine:
    """Tokenize, schedule, run the model, detokenize; one ``step()`` at a time."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        cache_config = vllm_config.cache_config
        self.tokenizer = _load_tokenizer(model_config.tokenizer)
        # In-process runner for tensor_parallel_size 1, worker processes otherwise.
        self.model_executor = Executor.get_class(vllm_config)(vllm_config)
        # The in-process runner (None when the model runs in worker processes).
        self.model_runner: ModelRunner | None = self.model_executor.model_runner
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
        self.scheduler = Scheduler(vllm_config.scheduler_config, self.kv_cache_manager)
        self._block_hasher = (
            get_request_block_hasher(cache_config.block_size)
            if cache_config.enable_prefix_caching
            else None
        )
        self._request_counter = itertools.count()
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stats = EngineStats(num_kv_blocks=num_blocks)
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling
        # With async scheduling: the step queued on the device whose tokens have not
        # been processed yet, as (its scheduler output, its output handle).
        self._in_flight: tuple[SchedulerOutput, AsyncOutput] | None = None
        # Set by minivllm.engine.tracer.trace(): records every step when not None.
        self.tracer: Any = None
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

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        """Validate the arguments, then build the engine."""
        return cls(engine_args.create_engine_config())

    # ---- requests in ------------------------------------------------------------------

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Normalize a prompt into ``(text or None, token ids)``."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs a 'prompt_token_ids' list")
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt is a str or a dict, got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise ValueError(
                "this model folder has no tokenizer: pass {'prompt_token_ids': [...]} prompts"
            )
        return prompt, self.tokenizer.encode(prompt)

    def process_inputs(self, prompt: PromptType, params: SamplingParams) -> Request:
        """Tokenize and validate one prompt into a ``Request`` (nothing is queued yet).

        Upstream counterpart: ``InputProcessor.process_inputs``.
        """
        text, token_ids = self.tokenize(prompt)
        max_len = self.vllm_config.model_config.max_model_len
        request_id = str(next(self._request_counter))
        if not token_ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        vocab = self.vllm_config.model_config.hf_config.vocab_size
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            bad = next(t for t in token_ids if not 0 <= t < vocab)
            raise ValueError(
                f"request {request_id}: token id {bad} is outside the vocabulary [0, {vocab})"
            )
        if len(token_ids) >= max_len:
            raise ValueError(
                f"request {request_id}: prompt has {len(token_ids)} tokens, but "
                f"max_model_len={max_len} leaves no room for output"
            )
        if params.stop and self.tokenizer is None:
            raise ValueError(
                f"request {request_id}: SamplingParams.stop needs text, but this model "
                f"folder has no tokenizer"
            )
        params = copy.copy(params)  # the engine adds EOS ids; the caller's object stays
        params.update_from_generation_config(self.vllm_config.model_config.eos_token_ids)
        eos = min(self.vllm_config.model_config.eos_token_ids, default=None)
        return Request(
            request_id, token_ids, params, eos, time.time(), self._block_hasher, prompt=text
        )

    def add_processed_request(self, request: Request) -> None:
        """Queue a request built by ``process_inputs``.

        A request with ``n > 1`` is fanned out into ``n`` child requests (see
        ``ParentRequest``); its id still names the one ``RequestOutput`` it produces.
        """
        params = request.sampling_params
        if params.n == 1:
            self._add_one(request, None)
            return
        parent = ParentRequest(request.request_id, params)
        for index in range(params.n):
            child_id, child_params = parent.get_child_info(index)
            child = Request(
                child_id,
                request.prompt_token_ids,
                child_params,
                request.eos_token_id,
                request.arrival_time,
                self._block_hasher,
                prompt=request.prompt,
            )
            self._add_one(child, (parent, index))

    def _add_one(self, request: Request, parent: tuple[ParentRequest, int] | None) -> None:
        """Queue one (child) request in the scheduler and set up its output state."""
        self.scheduler.add_request(request)
        self.output_processor.add_request(request, parent)
        self.stats.num_prompt_tokens += request.num_prompt_tokens

    def add_request(self, prompt: PromptType, params: SamplingParams) -> str:
        """Tokenize, validate and queue one prompt; returns its request id."""
        request = self.process_inputs(prompt, params)
        self.add_processed_request(request)
        return request.request_id

    def abort_request(self, request_ids: Iterable[str]) -> None:
        """Stop requests (with every sample of an ``n > 1`` request) and free their blocks.

        Upstream counterpart: ``LLMEngine.abort_request``. Unknown or finished ids are
        ignored, so it is safe to call with every id of an interrupted ``generate``.
        """
        ids = set(request_ids)
        outputs = self.output_processor
        targets = [
            rid for rid in self.scheduler.requests if rid in ids or outputs.is_child_of(rid, ids)
        ]
        self.scheduler.finish_requests(targets, RequestStatus.FINISHED_ABORTED)
        outputs.abort_requests(targets)
        if not self.scheduler.has_unfinished_requests():
            self._drain()  # its tokens all belong to aborted requests: nothing to return

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    # ---- the loop ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; return the outputs of requests that finished in it.

        Synchronously a step is schedule -> execute -> update. With async scheduling
        (vLLM's ``step_with_batch_queue`` with a queue of two) the engine keeps one step
        in flight: it schedules and queues step N+1 while the device still runs step N,
        then waits for step N's tokens and processes them while the device runs N+1.
        The host's work hides behind the device's instead of adding to it. The price:
        a request that stops in step N (EOS, stop token or string) has already been
        scheduled for N+1, and that one token is computed and dropped.
        """
        # The tracer pictures the KV cache as each step left it, so it runs in step.
        run_ahead = self.async_scheduling and self.tracer is None
        outputs = [] if run_ahead else self._drain()
        scheduler_output = self.scheduler.schedule()
        handle = self.model_executor.execute_model_async(scheduler_output)
        if not run_ahead:
            return outputs + self._process_step(scheduler_output, handle)
        previous, self._in_flight = self._in_flight, (scheduler_output, handle)
        if previous is not None:
            outputs += self._process_step(*previous)
        if not self.scheduler.has_unfinished_requests():
            # Everything finished: the step in flight only computed tokens past the end.
            outputs += self._drain()
        return outputs

    def _drain(self) -> list[RequestOutput]:
        """Wait for the step in flight, if any, and process it."""
        if self._in_flight is None:
            return []
        (scheduler_output, handle), self._in_flight = self._in_flight, None
        return self._process_step(scheduler_output, handle)

    def _process_step(self, scheduler_output: SchedulerOutput, handle: AsyncOutput) -> list:
        """Wait for a step's tokens, then append them, apply the stop rules, and return
        the outputs of the requests that finished."""
        runner_output = handle.get_output()
        finished = self.scheduler.update_from_output(
            scheduler_output, runner_output.sampled_token_ids
        )
        self.output_processor.update_logprobs(scheduler_output, runner_output)
        # Stop strings need text: the output side finds them, the scheduler frees.
        stopped = self.output_processor.apply_stop_strings(scheduler_output)
        self.scheduler.finish_requests(
            [r.request_id for r in stopped], RequestStatus.FINISHED_STOPPED
        )
        finished += stopped
        self._record_step(scheduler_output)
        if self.tracer is not None:
            self.tracer.record_step(scheduler_output, self.kv_cache_manager)
        outputs = (self.output_processor.make_output(r) for r in finished)
        return [o for o in outputs if o is not None]

    def _record_step(self, scheduler_output: Any) -> None:
        stats = self.stats
        stats.num_steps += not scheduler_output.is_empty
        # Tokens kept, not sampled: async scheduling drops those past a request's end.
        stats.num_generation_tokens = self.scheduler.num_generated_tokens
        stats.num_preemptions += len(scheduler_output.preempted_req_ids)
        # Measured by the scheduler right after allocation: after update_from_output the
        # finished requests' blocks are already free and the count would read low.
        stats.peak_blocks_in_use = self.scheduler.peak_blocks_in_use
        prefix = self.kv_cache_manager.prefix_cache_stats
        stats.prefix_cache_queries, stats.prefix_cache_hits = prefix.queries, prefix.hits


def _load_tokenizer(path: str | None) -> Any:
    if path is None:
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the tokenizer from {path!r}: {exc}") from exc


def _check_pool_fits_one_request(num_blocks: int, block_size: int, max_model_len: int) -> None:
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        raise ValueError(
            f"the KV pool holds {num_blocks} blocks x {block_size} tokens = {capacity} "
            f"tokens, fewer than max_model_len={max_model_len}: one full-length request "
            f"could never run. Raise num_kv_blocks (or gpu_memory_utilization) or lower "
            f"max_model_len."
        )
