"""The offline entry point: ``LLM(model).generate(prompts, params)``.

Upstream counterpart: ``vllm/entrypoints/llm.py`` (``LLM``, ``LLM.generate``,
``LLM._run_engine``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from minivllm.engine import EngineCoreRequest
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.llm_engine import LLMEngine, PromptType
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.utils.gc_utils import frozen_gc_heap


class LLM:
    """Generate completions for a batch of prompts with continuous batching.

    Args:
        model: Folder with ``config.json`` and ``*.safetensors`` (plus tokenizer files),
            or a Hugging Face hub id when a network is available.
        **kwargs: Engine arguments with vLLM's names (see ``EngineArgs``); an unknown
            name raises ``ValueError``.
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.engine_args = EngineArgs.from_kwargs(model, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(self.engine_args)
        self._lock = threading.Lock()

    def get_tokenizer(self) -> Any:
        """The Hugging Face tokenizer, or None when the model folder has none."""
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (idempotent; a no-op for one rank).

        Garbage collection and interpreter exit do this too; ``with LLM(...) as llm:``
        does it at a known point.
        """
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate a completion for each prompt; outputs come back in prompt order.

        A request that fails inside the engine (its logits were not finite, or its
        step raised) comes back too, finished with ``finish_reason="error"`` and the
        reason in ``stop_reason``, as upstream; the others are unaffected. Only a dead
        engine raises (``EngineDeadError``), after aborting this call's requests.

        Args:
            prompts: One prompt or a list; a prompt is a string or
                ``{"prompt_token_ids": [...]}``.
            sampling_params: One ``SamplingParams`` for all prompts or a list with one
                per prompt; None means ``SamplingParams()``.
            use_tqdm: Show a progress bar over requests.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"sampling_params has {len(params_list)} entries for {len(prompts)} prompts"
                )
        # LLM collects each request's one final output; streaming is AsyncLLM's job.
        params_list = [_final_only(sp) for sp in params_list]
        # Validate every prompt before queueing any, so a bad one leaves nothing behind.
        requests = [self.llm_engine.process_inputs(p, sp) for p, sp in zip(prompts, params_list)]
        return self._run_engine(requests, use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (benchmarks start each run cold); False while
        requests hold blocks. Upstream counterpart: ``LLM.reset_prefix_cache``."""
        return self.llm_engine.reset_prefix_cache()

    def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run ``method`` on every model worker and return the results in rank order.

        ``method`` is the name of a method of the worker (in-process: the model runner),
        or, in-process only, a callable that receives the model runner first. Upstream
        counterpart: ``LLM.collective_rpc``; benchmarks and tests reach the model this way.
        """
        return self.llm_engine.collective_rpc(method, args, kwargs)

    def start_profile(self, trace_dir: str) -> None:
        """Profile what every model worker runs from now on with ``torch.profiler``, until
        ``stop_profile``; each rank writes ``rank<r>_trace.json`` and
        ``rank<r>_table.txt`` into ``trace_dir``. Upstream counterpart:
        ``LLM.start_profile``."""
        self.llm_engine.start_profile(trace_dir)

    def stop_profile(self) -> list[str]:
        """Stop profiling; return the trace file of each rank, in rank order."""
        return self.llm_engine.stop_profile()

    def chat(
        self,
        messages: Sequence[Any],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation or to each of a list.

        Each conversation (a list of ``{"role": ..., "content": ...}`` messages) is
        rendered with the tokenizer's chat template, or ``chat_template`` when given,
        exactly as ``POST /v1/chat/completions`` renders it, then generated like a prompt.

        Raises:
            ValueError: The model has no chat template (and none was given), or a message
                is malformed; the message names it.
        """
        from minivllm.entrypoints.chat_utils import render_chat_prompt

        is_one = bool(messages) and not isinstance(messages[0], (list, tuple))
        conversations = [messages] if is_one else list(messages)
        prompts = [
            render_chat_prompt(self.get_tokenizer(), c, chat_template, add_generation_prompt)
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_engine(
        self, requests: list[tuple[str | None, EngineCoreRequest]], use_tqdm: bool
    ) -> list[RequestOutput]:
        # One caller at a time: the engine's state is not shared between threads.
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "LLM.generate is already running in another thread; an LLM serves one "
                "caller at a time (use one LLM per thread, or AsyncLLM / `minivllm serve` "
                "for concurrent requests)"
            )
        try:
            # Full garbage-collection passes would walk every start-up object mid-run.
            with frozen_gc_heap():
                return self._run_engine_locked(requests, use_tqdm)
        finally:
            self._lock.release()

    def _run_engine_locked(
        self, requests: list[tuple[str | None, EngineCoreRequest]], use_tqdm: bool
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        if engine.has_unfinished_requests():
            raise RuntimeError(
                "the engine has requests that LLM.generate did not add (through "
                "llm.llm_engine.add_request): finish or abort them first"
            )
        order = {request.request_id: i for i, (_, request) in enumerate(requests)}
        outputs: list[RequestOutput | None] = [None] * len(order)
        try:
            for prompt, request in requests:
                engine.add_processed_request(prompt, request)
            with tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm) as bar:
                while engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished:
                            outputs[order[output.request_id]] = output
                            bar.update(1)
        except BaseException:
            # Ctrl-C or an error while queueing or running: leave no request of this call
            # behind to be picked up (and mis-attributed) by the next generate().
            engine.abort_request(order)
            raise
        return [o for o in outputs if o is not None]


def _final_only(params: SamplingParams) -> SamplingParams:
    if not isinstance(params, SamplingParams):
        raise ValueError(
            f"sampling_params must be SamplingParams, got {type(params).__name__}"
        )
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    params = copy.copy(params)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params
