"""The synchronous front end: prompts in, ``RequestOutput``s out, one ``step()`` at a time.

Upstream counterpart: ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``). It holds the
parts that live beside the user: the tokenizer, the ``InputProcessor`` (validation) and
the ``OutputProcessor`` (detokenization, stop strings, ``RequestOutput``s). The engine
core, which schedules and runs the model, sits behind an ``InprocClient`` in the same
thread, so one ``step()`` reads top to bottom: the core steps and returns each request's
new token ids; the output processor turns them into outputs; requests a stop string
ended are aborted back in the core.

``AsyncLLM`` (``async_llm.py``) is the same front end for asyncio, with the core in a
process of its own.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerStats
from minivllm.core.step_record import StepRecord
from minivllm.engine import EngineCoreRequest
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.core_client import InprocClient
from minivllm.engine.input_processor import InputProcessor, PromptType
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# How many step records LLMEngine.step_records keeps (the oldest are dropped).
_MAX_STEP_RECORDS = 4096

__all__ = ["LLMEngine", "PromptType", "load_tokenizer"]


class LLMEngine:
    """Tokenize, validate, step the engine core, detokenize.

    Args:
        vllm_config: The resolved configuration.
    """

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.tokenizer = load_tokenizer(vllm_config.model_config.tokenizer)
        self.engine_core = InprocClient(vllm_config)
        self.input_processor = InputProcessor(
            vllm_config, self.tokenizer, self.engine_core.num_kv_blocks
        )
        self.output_processor = OutputProcessor(
            self.tokenizer, vllm_config.scheduler_config.stream_interval
        )
        self._request_counter = itertools.count()
        # The scheduler's counters as of the last step: the one source of the engine's
        # statistics (the summary of `minivllm generate`, the benchmarks).
        self.scheduler_stats: SchedulerStats = self.engine_core.engine_core.scheduler.make_stats()
        # Filled while start_step_records() is on: the latest records, oldest first.
        self.step_records: deque[StepRecord] = deque(maxlen=_MAX_STEP_RECORDS)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        """Validate the arguments, then build the engine."""
        return cls(engine_args.create_engine_config())

    def shutdown(self) -> None:
        """Stop the model's worker processes, if any (idempotent)."""
        self.engine_core.shutdown()

    @property
    def stats(self) -> SchedulerStats:
        """The engine's counters after the latest step."""
        return self.scheduler_stats

    # ---- requests in ------------------------------------------------------------------

    def process_inputs(
        self, prompt: PromptType, params: SamplingParams
    ) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate one prompt; nothing is queued yet.

        Returns the prompt's text (None for a token-id prompt) and the request for the
        core, with a fresh request id.
        """
        request_id = str(next(self._request_counter))
        return self.input_processor.process_inputs(request_id, prompt, params)

    def add_processed_request(
        self,
        prompt: str | None,
        request: EngineCoreRequest,
        queue: RequestOutputCollector | None = None,
    ) -> None:
        """Queue a request built by ``process_inputs``.

        A request with ``n > 1`` is fanned out into ``n`` child requests (see
        ``ParentRequest``); its id still names the outputs it produces.
        """
        params = request.sampling_params
        if params.n == 1:
            self.output_processor.add_request(request, prompt, None, 0, queue)
            self._add_to_core(request)
            return
        parent = ParentRequest(request.request_id, params)
        for index in range(params.n):
            child_id, child_params = parent.get_child_info(index)
            child = msgspec.structs.replace(
                request, request_id=child_id, sampling_params=child_params
            )
            self.output_processor.add_request(child, prompt, parent, index, queue)
            self._add_to_core(child)

    def _add_to_core(self, request: EngineCoreRequest) -> None:
        try:
            self.engine_core.add_request(request)
        except BaseException:
            self.output_processor.abort_requests([request.request_id])
            raise

    def add_request(self, prompt: PromptType, params: SamplingParams) -> str:
        """Tokenize, validate and queue one prompt; returns its request id."""
        prompt_text, request = self.process_inputs(prompt, params)
        self.add_processed_request(prompt_text, request)
        return request.request_id

    def abort_request(self, request_ids: Iterable[str]) -> None:
        """Stop requests (with every sample of an ``n > 1`` request) and free their blocks.

        Upstream counterpart: ``LLMEngine.abort_request``. Unknown or finished ids are
        ignored, so it is safe to call with every id of an interrupted ``generate``.
        """
        to_abort = self.output_processor.abort_requests(set(request_ids))
        self.engine_core.abort_requests(to_abort)

    def has_unfinished_requests(self) -> bool:
        """True while any request awaits outputs."""
        return self.output_processor.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, so the next run starts cold (False while requests
        hold blocks). Upstream counterpart: ``LLMEngine.reset_prefix_cache``."""
        return self.engine_core.reset_prefix_cache()

    def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run ``method`` on every model worker (a method name, or a callable given the
        worker's model runner); return the results in rank order."""
        return self.engine_core.collective_rpc(method, args, kwargs)

    def start_profile(self, trace_dir: str) -> None:
        """Start a torch profiler on every model worker (``worker/profiler.py``); each
        rank writes its trace into ``trace_dir`` on ``stop_profile``. Upstream
        counterpart: ``LLMEngine.start_profile`` (its directory comes from the profiler
        config instead).

        Raises:
            ValueError: ``trace_dir`` is empty.
            RuntimeError: A profile is already running.
        """
        if not trace_dir:
            raise ValueError("start_profile: trace_dir must name a directory")
        self.engine_core.collective_rpc("profile", (True, str(trace_dir)))

    def stop_profile(self) -> list[str]:
        """Stop the profilers; return each rank's trace file, in rank order.

        Raises:
            RuntimeError: No profile is running.
        """
        return self.engine_core.collective_rpc("profile", (False, ""))

    def start_step_records(self, interval_s: float = 0.0) -> None:
        """Keep a ``StepRecord`` (``minivllm.core.step_record``) of a scheduled step at
        most every ``interval_s`` seconds (0: every step) in ``step_records``, plus one
        of the freed pool whenever the engine runs out of work. For notebooks; the
        server's live page uses ``AsyncLLM.step_records``.

        Raises:
            ValueError: ``interval_s`` is negative or not finite.
        """
        self.engine_core.set_step_records(interval_s)

    def stop_step_records(self) -> None:
        """Stop recording (``step_records`` keeps what it holds)."""
        self.engine_core.set_step_records(None)

    # ---- the loop ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine-core step; return the outputs it produced.

        Which outputs depends on each request's ``output_kind``: a ``FINAL_ONLY``
        request (what ``LLM.generate`` sends) appears once, when it finishes; a
        ``CUMULATIVE`` or ``DELTA`` one appears every step it gains tokens.

        A request that failed inside the step (its logits were not finite, or the step
        raised) finishes with ``finish_reason="error"`` and the reason in
        ``stop_reason``; the others are unaffected.

        Raises:
            EngineDeadError: The engine cannot run any more (its tensor-parallel
                workers are gone, or the GPU's context is broken).
        """
        outputs = self.engine_core.get_output()
        if outputs.scheduler_stats is not None:
            self.scheduler_stats = outputs.scheduler_stats
        self.step_records.extend(outputs.step_records)
        processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp)
        if processed.reqs_to_abort:
            # Stop strings are found in text, here; the core frees those requests' blocks.
            self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs


def load_tokenizer(path: str | None) -> Any:
    """The Hugging Face tokenizer in ``path``, or None when there is no path."""
    if path is None:
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the tokenizer from {path!r}: {exc}") from exc
