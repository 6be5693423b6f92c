"""From sampled token ids to what the caller reads: text, logprobs, ``RequestOutput``.

Upstream counterpart: ``vllm/v1/engine/output_processor.py`` (``OutputProcessor``, with
``RequestState`` per request). Upstream runs it in the front-end process, away from the
scheduler; here it is an object the engine calls after each step's tokens are appended.
It owns the per-request state that only the output side needs: the incremental
detokenizer (when there is a tokenizer), the logprobs processor (when logprobs were
asked for), and the parent of each child of an ``n > 1`` request.
"""

from __future__ import annotations

from typing import Any

from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.logprobs import LogprobsProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.request import Request, RequestStatus


class OutputProcessor:
    """Per-request output state, and the outputs of finished requests.

    Args:
        tokenizer: The model's tokenizer, or None (token-id prompts only: no text,
            no stop strings).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.logprobs: dict[str, LogprobsProcessor] = {}
        # child request id -> (its parent, its index), for n > 1 requests.
        self.parents: dict[str, tuple[ParentRequest, int]] = {}

    def add_request(self, request: Request, parent: tuple[ParentRequest, int] | None) -> None:
        """Create the output state of a newly queued request (a child when ``parent``)."""
        params = request.sampling_params
        req_id = request.request_id
        if self.tokenizer is not None:
            self.detokenizers[req_id] = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                params.skip_special_tokens,
                params.stop,
                params.min_tokens,
                params.include_stop_str_in_output,
            )
        if params.logprobs is not None or params.prompt_logprobs is not None:
            self.logprobs[req_id] = LogprobsProcessor(
                self.tokenizer, params.logprobs, params.prompt_logprobs, request.num_prompt_tokens
            )
        if parent is not None:
            self.parents[req_id] = parent

    def is_child_of(self, request_id: str, parent_ids: set[str]) -> bool:
        """Whether ``request_id`` is a child of one of ``parent_ids``."""
        info = self.parents.get(request_id)
        return info is not None and info[0].request_id in parent_ids

    def abort_requests(self, request_ids: list[str]) -> None:
        """Forget the output state of aborted requests."""
        for rid in request_ids:
            self.detokenizers.pop(rid, None)
            self.logprobs.pop(rid, None)
            self.parents.pop(rid, None)

    def update_logprobs(self, scheduler_output: Any, runner_output: Any) -> None:
        """Hand a step's sample and prompt logprobs to the requests' processors."""
        if not self.logprobs:
            return
        if runner_output.logprobs is not None:
            for row, s in enumerate(scheduler_output.sampling_requests()):
                proc = self.logprobs.get(s.request_id)
                # Only if the token was kept (a request that finished meanwhile drops it).
                if (
                    proc is not None
                    and proc.logprobs is not None
                    and (len(proc.logprobs) < s.request.num_output_tokens)
                ):
                    proc.add_sample(runner_output.logprobs, row)
        for req_id, chunk in runner_output.prompt_logprobs.items():
            if (proc := self.logprobs.get(req_id)) is not None:
                proc.add_prompt_chunk(chunk.start, chunk.lists)

    def apply_stop_strings(self, scheduler_output: Any) -> list[Request]:
        """Detokenize the step's requests that have stop strings; return the running
        ones whose text now contains one (the engine finishes them in the scheduler).

        Mirrors vLLM's output processor: stop strings are found in text, after the
        scheduler has already applied the token-level rules, so a request the scheduler
        just finished (by length or a stop token) is checked too, and a stop string
        found in it wins (``finish_reason "stop"``, ``stop_reason`` the string).
        Requests without stop strings are detokenized once, when they finish: doing it
        every step would only cost time in the loop.
        """
        to_finish = []
        for s in scheduler_output.sampling_requests():
            request = s.request
            detok = self.detokenizers.get(request.request_id)
            if detok is None or not detok.stop:
                continue
            new_ids = request.output_token_ids[detok.num_output_tokens :]
            if not new_ids:
                continue  # its token was dropped (finished before the step's results)
            stop_terminated = request.status == RequestStatus.FINISHED_STOPPED
            stop_str = detok.update_and_check_stop(new_ids, stop_terminated)
            if stop_str is None:
                continue
            request.stop_reason = stop_str
            if request.is_finished():
                request.status = RequestStatus.FINISHED_STOPPED
            else:
                to_finish.append(request)
        return to_finish

    def _make_completion(self, request: Request) -> CompletionOutput:
        """The finished request's ``CompletionOutput``; forgets its detokenizer."""
        params = request.sampling_params
        detok = self.detokenizers.pop(request.request_id, None)
        text = ""
        if detok is not None:
            if detok.stop:
                text = detok.output_text
            else:
                ids = request.output_token_ids
                if (
                    request.status == RequestStatus.FINISHED_STOPPED
                    and not params.include_stop_str_in_output
                ):
                    ids = ids[:-1]  # as vLLM: the EOS / stop token's text is left out
                text = self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        proc = self.logprobs.get(request.request_id)
        return CompletionOutput(
            index=0,
            text=text,
            token_ids=list(request.output_token_ids),
            cumulative_logprob=None if proc is None else proc.cumulative_logprob,
            logprobs=None if proc is None else proc.logprobs,
            finish_reason=request.get_finished_reason(),
            stop_reason=request.stop_reason,
        )

    def make_output(self, request: Request) -> RequestOutput | None:
        """The ``RequestOutput`` of a finished request, or None for a child of an
        ``n > 1`` request whose siblings are still running. Forgets its state."""
        completion = self._make_completion(request)
        proc = self.logprobs.pop(request.request_id, None)
        prompt_logprobs = None if proc is None else proc.prompt_logprobs
        num_cached_tokens = request.num_cached_tokens
        parent_info = self.parents.pop(request.request_id, None)
        if parent_info is None:
            outputs = [completion]
            request_id = request.request_id
        else:
            parent, index = parent_info
            if index == 0:
                # Prompt-level fields come from the first sample.
                parent.prompt_logprobs = prompt_logprobs
                parent.num_cached_tokens = num_cached_tokens
            if not parent.add_output(request.request_id, index, completion):
                return None
            outputs = parent.completions()
            request_id = parent.request_id
            prompt_logprobs, num_cached_tokens = parent.prompt_logprobs, parent.num_cached_tokens
        return RequestOutput(
            request_id=request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=outputs,
            finished=True,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=num_cached_tokens,
        )
