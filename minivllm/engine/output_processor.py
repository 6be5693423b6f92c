"""From the engine core's per-step token ids to what the caller reads.

Upstream counterpart: ``vllm/v1/engine/output_processor.py`` (``OutputProcessor``,
``RequestState``, ``RequestOutputCollector``). It runs in the front end, beside the
tokenizer: the core sends each request's new token ids (and logprob rows, and a finish
reason when a token-level rule ended it); this side turns them into text, finds stop
strings, keeps the request's statistics, and builds a ``RequestOutput`` in the shape
the caller asked for with ``SamplingParams.output_kind``:

* ``CUMULATIVE``: everything so far, every step;
* ``DELTA``: only what is new since the previous output (what a stream sends);
* ``FINAL_ONLY``: one output, when the request finishes (``LLM.generate``).

A stop string is found here, in text, after the core has already moved on, so the
processor reports the request in ``reqs_to_abort`` and the front end aborts it in the
core. The status of a request inside the core is the scheduler's alone.

A request that failed inside the core (``FinishReason.ERROR``: its logits were not
finite, or its step raised) ends like any other for ``LLMEngine``: an output with
``finish_reason="error"`` and the reason in ``stop_reason``, as upstream. A stream's
caller (``AsyncLLM``) gets an ``EngineGenerateError`` instead, and only that caller.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.exceptions import EngineGenerateError
from minivllm.engine.logprobs import LogprobsProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.metrics.stats import IterationStats, RequestStateStats
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import RequestOutputKind


class RequestOutputCollector:
    """The queue between the output handler and one ``AsyncLLM.generate`` caller.

    Holds at most one item: a newer output replaces (``CUMULATIVE``, ``FINAL_ONLY``) or
    is merged into (``DELTA``) one the caller has not taken yet, so a slow reader never
    makes the engine buffer without bound. An exception put here is raised to the caller.
    """

    def __init__(self, output_kind: RequestOutputKind) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        """Hand over an output (or an error); never blocks."""
        if (
            self.aggregate
            and isinstance(self.output, RequestOutput)
            and isinstance(output, RequestOutput)
        ):
            _merge_delta(self.output, output)
        elif not isinstance(self.output, BaseException):
            self.output = output
        self.ready.set()

    async def get(self) -> RequestOutput:
        """Wait for the next output; raise the error if one was put."""
        while self.output is None:
            await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


def _merge_delta(into: RequestOutput, new: RequestOutput) -> None:
    """Append ``new``'s delta to an unread delta output, sample by sample."""
    by_index = {c.index: c for c in into.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is None:
            into.outputs.append(c)
            continue
        old.text += c.text
        old.token_ids = old.token_ids + c.token_ids
        if c.logprobs is not None:
            old.logprobs = (old.logprobs or []) + c.logprobs
        old.cumulative_logprob = c.cumulative_logprob
        old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
    into.finished = new.finished
    into.metrics = new.metrics
    if into.prompt_logprobs is None:
        into.prompt_logprobs = new.prompt_logprobs


@dataclass
class OutputProcessorOutput:
    """What one step's processing produced.

    Attributes:
        request_outputs: Outputs for callers without a collector (``LLMEngine``).
        reqs_to_abort: Requests a stop string ended: the core must abort them.
    """

    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)


class RequestState:
    """The front end's view of one (child) request while it runs."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        tokenizer: Any,
        parent: ParentRequest | None,
        index: int,
        queue: RequestOutputCollector | None,
        stream_interval: int = 1,
    ) -> None:
        params = request.sampling_params
        self.request_id = request.request_id
        self.parent, self.index, self.queue = parent, index, queue
        self.prompt, self.prompt_token_ids = prompt, request.prompt_token_ids
        self.output_kind = params.output_kind
        self.max_tokens_param = params.max_tokens
        self.include_stop_str = params.include_stop_str_in_output
        self.detokenizer = None
        if tokenizer is not None:
            self.detokenizer = IncrementalDetokenizer(
                tokenizer,
                request.prompt_token_ids,
                params.skip_special_tokens,
                params.stop,
                params.min_tokens,
                params.include_stop_str_in_output,
            )
        # Text is needed every step only to stream it or to find stop strings; a
        # FINAL_ONLY request without stop strings is decoded once, when it finishes.
        self.detokenize_each_step = self.detokenizer is not None and bool(
            params.stop or self.output_kind != RequestOutputKind.FINAL_ONLY
        )
        # A stream holds back the last characters that could start a stop string.
        self.stop_buffer_length = 0
        if params.stop and not params.include_stop_str_in_output:
            self.stop_buffer_length = max(len(s) for s in params.stop) - 1
        self.logprobs_processor = None
        if params.logprobs is not None or params.prompt_logprobs is not None:
            self.logprobs_processor = LogprobsProcessor(
                tokenizer, params.logprobs, params.prompt_logprobs, len(request.prompt_token_ids)
            )
        self.token_ids: list[int] = []
        self.num_cached_tokens = 0
        self.stats = RequestStateStats(arrival_time=request.arrival_time)
        self.stream_interval = stream_interval
        # How much of the text, tokens and logprobs earlier DELTA outputs carried.
        self.sent_text = 0
        self.sent_tokens = 0
        self.sent_logprobs = 0
        self.sent_prompt_logprobs = False

    def update(self, out: EngineCoreOutput) -> str | None:
        """Take one step's output; return a stop string that the new text completed (or
        None). ``token_ids`` keeps all of the step's new ids, unless a stop string ended
        the request before the last (a speculative step's accepted run)."""
        if out.num_cached_tokens:
            self.num_cached_tokens = out.num_cached_tokens
        proc = self.logprobs_processor
        if proc is not None and out.new_prompt_logprobs is not None:
            chunk = out.new_prompt_logprobs
            proc.add_prompt_chunk(chunk.start, chunk.lists)
        new_ids, stop_str = out.new_token_ids, None
        if new_ids and self.detokenize_each_step:
            assert self.detokenizer is not None
            stop_str = self.detokenizer.update_and_check_stop(
                new_ids, out.finish_reason == FinishReason.STOP
            )
            if stop_str is not None:
                new_ids = new_ids[: len(new_ids) - self.detokenizer.tokens_past_stop]
        if proc is not None and out.new_logprobs is not None:
            proc.add_samples(out.new_logprobs, len(new_ids))
        self.token_ids.extend(new_ids)
        return stop_str

    def make_request_output(
        self, finish_reason: FinishReason | None, stop_reason: Any
    ) -> RequestOutput | None:
        """The output this step owes the caller, or None (FINAL_ONLY while running, a
        stream between two outputs of its ``stream_interval``, or a sample of an
        ``n > 1`` request whose siblings have not finished)."""
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if not (finished or self._interval_reached()):
            return None  # the tokens wait in token_ids; the next output carries them
        completion = self._make_completion(finish_reason, stop_reason)
        request_id, outputs = self.request_id, [completion]
        prompt_logprobs = self._prompt_logprobs()
        num_cached = self.num_cached_tokens
        if self.parent is not None:
            parent = self.parent
            if self.index == 0:  # prompt-level fields come from the first sample
                parent.prompt_logprobs, parent.num_cached_tokens = prompt_logprobs, num_cached
            maybe = parent.get_outputs(self.request_id, completion)
            if maybe is None:
                return None
            request_id, outputs = parent.request_id, maybe
            finished = parent.finished
            prompt_logprobs, num_cached = parent.prompt_logprobs, parent.num_cached_tokens
        return RequestOutput(
            request_id=request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=num_cached,
            metrics=self.stats,
        )

    def _interval_reached(self) -> bool:
        """Whether a running request owes an output now: every step by default; with a
        ``stream_interval`` of N, for its first token and then once N more have come
        (upstream: the same rule in ``RequestState.make_request_output``)."""
        if self.stream_interval == 1 or self.sent_tokens == 0:
            return True
        return len(self.token_ids) - self.sent_tokens >= self.stream_interval

    def _make_completion(
        self, finish_reason: FinishReason | None, stop_reason: Any
    ) -> CompletionOutput:
        delta = self.output_kind == RequestOutputKind.DELTA
        proc = self.logprobs_processor
        logprobs = None if proc is None else proc.logprobs
        if delta and logprobs is not None:
            logprobs, self.sent_logprobs = logprobs[self.sent_logprobs :], len(logprobs)
        # A delta carries every token since the last output: this step's, and those of
        # the steps a stream_interval skipped.
        new_ids = self.token_ids[self.sent_tokens :]
        self.sent_tokens = len(self.token_ids)
        return CompletionOutput(
            index=self.index,
            text=self._text(finish_reason, stop_reason, delta),
            token_ids=list(new_ids if delta else self.token_ids),
            cumulative_logprob=None if proc is None else proc.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=None if finish_reason is None else str(finish_reason),
            stop_reason=stop_reason,
        )

    def _text(self, finish_reason: FinishReason | None, stop_reason: Any, delta: bool) -> str:
        detok = self.detokenizer
        if detok is None:
            return ""
        finished = finish_reason is not None
        if finished:
            if not self.detokenize_each_step:
                detok.update_and_check_stop(self.token_ids, finish_reason == FinishReason.STOP)
            if not isinstance(stop_reason, str):
                # A stop string cut the text where it matched; otherwise show the text
                # of every token, as a one-shot decode would, including a character
                # that the last token left incomplete (U+FFFD).
                detok.flush()
        text = detok.output_text
        # Never negative: text shorter than the held-back length sends nothing yet.
        end = len(text) if finished else max(0, len(text) - self.stop_buffer_length)
        if not delta:
            return text[:end]
        piece = text[self.sent_text : end]
        self.sent_text = max(self.sent_text, end)
        return piece

    def _prompt_logprobs(self) -> list | None:
        proc = self.logprobs_processor
        if proc is None or proc.prompt_logprobs is None:
            return None
        if self.output_kind == RequestOutputKind.DELTA:
            if self.sent_prompt_logprobs:
                return None
            self.sent_prompt_logprobs = True
        return proc.prompt_logprobs


class OutputProcessor:
    """Every running request's ``RequestState``; turns core outputs into ``RequestOutput``s.

    Args:
        tokenizer: The model's tokenizer, or None (token-id prompts only: no text,
            no stop strings).
        stream_interval: Tokens between a streamed request's outputs after its first
            (``SchedulerConfig.stream_interval``).
    """

    def __init__(self, tokenizer: Any, stream_interval: int = 1) -> None:
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.request_states: dict[str, RequestState] = {}

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        parent: ParentRequest | None = None,
        index: int = 0,
        queue: RequestOutputCollector | None = None,
    ) -> None:
        """Start tracking a request sent to the core (a child of ``parent`` if given)."""
        if request.request_id in self.request_states:
            raise ValueError(f"request {request.request_id}: the request id is already in use")
        self.request_states[request.request_id] = RequestState(
            request, prompt, self.tokenizer, parent, index, queue, self.stream_interval
        )

    def has_unfinished_requests(self) -> bool:
        """True while any request awaits outputs."""
        return bool(self.request_states)

    def abort_requests(
        self, request_ids: list[str] | set[str], iteration_stats: IterationStats | None = None
    ) -> list[str]:
        """Forget requests (a parent id covers its children); return the ids to abort
        in the core. With ``iteration_stats``, each one is recorded as finished with reason
        ``abort``, so the metrics count requests their clients gave up on."""
        ids = set(request_ids)
        to_abort = []
        for rid, state in list(self.request_states.items()):
            if rid in ids or (state.parent is not None and state.parent.request_id in ids):
                if iteration_stats is not None:
                    self._finish(state, FinishReason.ABORT, iteration_stats)
                else:
                    del self.request_states[rid]
                to_abort.append(rid)
        return to_abort

    def process_outputs(
        self,
        outputs: list[EngineCoreOutput],
        engine_core_timestamp: float,
        iteration_stats: IterationStats | None = None,
    ) -> OutputProcessorOutput:
        """Apply one step of core outputs to the request states.

        For each output: record events and timings, append tokens and logprobs,
        detokenize and check stop strings, build the ``RequestOutput`` the request's
        ``output_kind`` calls for, and forget the request once it finished. Outputs go
        to the request's collector if it has one, else into ``request_outputs``.
        """
        result = OutputProcessorOutput()
        stats = iteration_stats if iteration_stats is not None else IterationStats()
        for out in outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted by the front end while the core was stepping
            if out.finish_reason == FinishReason.ERROR and state.queue is not None:
                # A stream ends with the error, raised to its caller alone.
                result.reqs_to_abort.extend(self._fail(state, str(out.stop_reason)))
                continue
            for event in out.events or ():
                stats.record_event(state.stats, event.type.name.lower(), event.timestamp)
            stats.record_tokens(
                state.stats,
                len(out.new_token_ids),
                engine_core_timestamp,
                len(state.prompt_token_ids),
            )
            state.stats.num_draft_tokens += out.num_draft_tokens
            state.stats.num_accepted_tokens += out.num_accepted_tokens
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            stop_str = state.update(out)
            if stop_str is not None:
                finish_reason, stop_reason = FinishReason.STOP, stop_str
                if not out.finished:
                    result.reqs_to_abort.append(out.request_id)
            if finish_reason is not None:
                self._finish(state, finish_reason, stats)
            request_output = state.make_request_output(finish_reason, stop_reason)
            if request_output is None:
                continue
            if state.queue is not None:
                state.queue.put(request_output)
            else:
                result.request_outputs.append(request_output)
        return result

    def _finish(self, state: RequestState, reason: FinishReason, stats: IterationStats) -> None:
        del self.request_states[state.request_id]
        stats.record_finished(
            state.stats,
            str(reason),
            len(state.prompt_token_ids),
            state.max_tokens_param,
            state.num_cached_tokens,
        )

    def _fail(self, state: RequestState, message: str) -> list[str]:
        """The core finished a streamed request with ``ERROR``: its caller gets an
        ``EngineGenerateError`` and the request's other samples stop too. Returns the
        sibling ids the core must abort."""
        request_id = state.parent.request_id if state.parent is not None else state.request_id
        siblings = self.abort_requests([request_id])
        assert state.queue is not None
        state.queue.put(EngineGenerateError(f"request {request_id} failed: {message}"))
        return [rid for rid in siblings if rid != state.request_id]

    def propagate_error(self, error: BaseException) -> None:
        """The engine died: every waiting caller gets ``error``; all state is dropped."""
        for state in self.request_states.values():
            if state.queue is not None:
                state.queue.put(error)
        self.request_states.clear()
