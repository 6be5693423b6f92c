"""The scheduler's view of one request.

Upstream counterpart: ``vllm/v1/request.py`` (``Request``, ``RequestStatus``).

The one number to understand is ``num_computed_tokens``: how many of the request's
tokens (prompt then output) already have their K/V in the cache. The scheduler's only
job is to make it catch up with ``num_tokens``; a prefill, a chunk of a prefill and a
decode step are all the same operation seen at different distances from the target.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Life-cycle states; every state after PREEMPTED means finished (vLLM's ordering)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    # Failed inside a step: its logits were not finite, or the step raised.
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        """True for every terminal state."""
        return status > _LAST_UNFINISHED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        """The OpenAI-style ``finish_reason`` of a terminal state."""
        return _FINISHED_REASONS.get(status)


# A module name, not ``RequestStatus.PREEMPTED``: looking a member up through its Enum
# class costs ~0.2 us, and the test runs several times per request per step.
_LAST_UNFINISHED = RequestStatus.PREEMPTED

_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}

BlockHash = bytes
"""Digest of one full block of tokens, chained to the digests of all blocks before it."""


class Request:
    """One sequence being generated: its tokens, its progress, and its prefix hashes.

    Args:
        request_id: Unique id chosen by the engine.
        prompt_token_ids: The tokenized prompt (non-empty).
        sampling_params: How to sample; ``max_tokens`` must already be resolved.
        eos_token_id: The model's end-of-sequence token, or None.
        arrival_time: When the request arrived (for FCFS order and latency stats).
        block_hasher: Function returning the hashes of newly completed full blocks,
            called whenever tokens are appended; None disables prefix caching.
        prompt: The prompt text, when the prompt was given as text.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        prompt: str | None = None,
    ) -> None:
        # Checked by check_new_request (core/request_checks.py) before any Request exists.
        if sampling_params.max_tokens is None:
            raise ValueError(f"request {request_id}: sampling_params.max_tokens is unresolved")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.max_tokens: int = sampling_params.max_tokens

        self.prompt = prompt
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)

        self.status = RequestStatus.WAITING
        # The stop token or string that ended it; for FINISHED_ERROR, what failed.
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0
        # Prompt tokens whose K/V came from the prefix cache when last admitted.
        self.num_cached_tokens = 0
        # Tokens that scheduled steps will sample but whose values have not come back
        # yet. Synchronously this is 1 during a step and 0 between steps. With async
        # scheduling the next step is scheduled while one still runs, so it can reach
        # 2, and the input token of the next step is a placeholder that the model
        # runner fills in on the device (vLLM: ``num_output_placeholders``).
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        # Draft tokens proposed for the next step (speculative decoding): scheduled after
        # the request's tokens, never part of them until the rejection sampler accepts.
        self.spec_token_ids: list[int] = []

        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        # A block completes only every ``block_size`` tokens, and a decode step appends
        # one: the hasher is called only once the next block can be full (a hasher
        # that does not say its block size is called for every append).
        self._hash_block_size: int | None = getattr(block_hasher, "block_size", None)
        self._next_block_end = 0
        self.update_block_hashes()

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens generated so far (read-only view by convention)."""
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt tokens followed by output tokens."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output length: the target ``num_computed_tokens`` chases."""
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus the drafts waiting to be verified."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Append sampled tokens and hash any block they complete."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Extend ``block_hashes`` with the hashes of newly completed full blocks."""
        if self._block_hasher is None or len(self._all_token_ids) < self._next_block_end:
            return
        self.block_hashes.extend(self._block_hasher(self))
        if self._hash_block_size is not None:
            self._next_block_end = (len(self.block_hashes) + 1) * self._hash_block_size

    def is_finished(self) -> bool:
        """True once the request reached a terminal state (``RequestStatus.is_finished``
        inlined: this runs several times per request per step)."""
        return self.status > _LAST_UNFINISHED

    def get_finished_reason(self) -> str | None:
        """``"stop"``, ``"length"``, ``"abort"``, ``"error"`` or None while running."""
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
