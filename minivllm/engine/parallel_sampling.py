"""``n > 1``: one prompt, ``n`` independent samples, one ``RequestOutput``.

Upstream counterpart: ``ParentRequest`` in ``vllm/v1/engine/parallel_sampling.py``.
The engine core never sees a "request with n samples": the front end fans the prompt
out into ``n`` ordinary child requests (ids ``"{index}_{parent_id}"``) and gathers their
``CompletionOutput``s back. The children share the prompt's KV blocks for free, through
prefix caching: the first child to be scheduled indexes its full prompt blocks as soon
as they are allocated, and its siblings, admitted right after it, hit them.
"""

from __future__ import annotations

import copy

from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    """Fans one ``n > 1`` request out into children and gathers their completions.

    Args:
        request_id: The id the caller sees in the ``RequestOutput``.
        sampling_params: The caller's params (``n > 1``).
    """

    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.child_requests: set[str] = set()
        self.outputs: list[CompletionOutput | None] = [None] * sampling_params.n
        # Prompt-level results, taken from child 0 (the children share the prompt).
        self.prompt_logprobs: list | None = None
        self.num_cached_tokens = 0

    @property
    def n(self) -> int:
        """Number of samples."""
        return self.sampling_params.n

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """The id and params of child ``index``.

        A seeded request gives child ``i`` the seed ``seed + i``, as vLLM does: the
        children then differ from each other, and the whole set is reproducible.
        """
        child_id = f"{index}_{self.request_id}"
        self.child_requests.add(child_id)
        params = copy.copy(self.sampling_params)
        params.n = 1
        if params.seed is not None:
            params.seed += index
        return child_id, params

    @property
    def finished(self) -> bool:
        """True once every child has finished."""
        return not self.child_requests

    def get_outputs(self, child_id: str, output: CompletionOutput) -> list[CompletionOutput] | None:
        """Record a child's latest completion; return what the caller should see now.

        ``FINAL_ONLY``: all ``n`` completions once the last child finished, else None.
        ``CUMULATIVE``: the latest completion of every child heard from so far.
        ``DELTA``: just this child's delta (its ``index`` tells the samples apart).
        """
        if output.finished():
            self.child_requests.discard(child_id)
        kind = self.sampling_params.output_kind
        if kind == RequestOutputKind.DELTA:
            return [output]
        self.outputs[output.index] = output
        if kind == RequestOutputKind.FINAL_ONLY and not self.finished:
            return None
        return [o for o in self.outputs if o is not None]
