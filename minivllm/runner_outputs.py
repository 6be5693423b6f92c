"""What the model runner hands back: plain result types every layer above it may import.

Upstream counterpart: ``vllm/v1/outputs.py`` (``ModelRunnerOutput``,
``AsyncModelRunnerOutput``, ``SamplerOutput``, ``LogprobsLists``, ``LogprobsTensors``),
plus ``Logprob`` from ``vllm/logprobs.py``. It is named apart from
``minivllm/outputs.py``, which is upstream's ``vllm/outputs.py`` (what ``LLM.generate``
returns to the user).

These types sit below ``worker``, ``sample``, ``executor`` and ``engine`` so that each of
them can name a step's result without importing the package that computes it: the
sampler returns a ``SamplerOutput`` without knowing the runner, and the engine reads a
``ModelRunnerOutput`` without knowing the worker. Only containers live here; the code
that fills them stays with its package (``sample/logprobs.py``, ``worker/``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class Logprob:
    """One token's log-probability at one position, as vLLM returns it.

    Attributes:
        logprob: Natural-log probability under the raw (unprocessed) distribution.
        rank: 1-based rank of the token in that distribution (1 = most likely).
        decoded_token: The token's text, or None without a tokenizer.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class LogprobsLists:
    """Per-row logprobs as Python lists, for the engine.

    Row ``i`` describes one position: ``token_ids[i][0]`` is the token that was sampled
    (or, for a prompt, the prompt's next token) and ``token_ids[i][1:]`` the top-N in
    decreasing order; ``logprobs`` matches it and ``ranks[i]`` is the rank of the first.

    ``cu_num_generated_tokens``: where each request's rows start, when a request may own
    several (speculative decoding: its accepted drafts and one more token); request ``i``
    owns rows ``cu[i]:cu[i + 1]``. None: one row per request.
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]
    cu_num_generated_tokens: list[int] | None = None

    def slice_request(self, req_idx: int, num_positions: int) -> LogprobsLists:
        """The first ``num_positions`` rows of request ``req_idx`` (upstream's name): a
        stop rule may keep fewer tokens than the step generated."""
        cu = self.cu_num_generated_tokens
        start = req_idx if cu is None else cu[req_idx]
        end = start + num_positions
        return LogprobsLists(
            self.token_ids[start:end], self.logprobs[start:end], self.ranks[start:end]
        )


@dataclass
class LogprobsTensors:
    """The device-side form of ``LogprobsLists``.

    Attributes:
        token_ids: ``[num_rows, 1 + num_logprobs]`` int64.
        logprobs: ``[num_rows, 1 + num_logprobs]`` float32.
        ranks: ``[num_rows]`` int64.
        cu_num_generated_tokens: As in ``LogprobsLists`` (a host list).
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor
    cu_num_generated_tokens: list[int] | None = None

    def tolists(self) -> LogprobsLists:
        """Copy to the host (one synchronisation for all three tensors' results)."""
        return LogprobsLists(
            self.token_ids.tolist(),
            self.logprobs.tolist(),
            self.ranks.tolist(),
            self.cu_num_generated_tokens,
        )


@dataclass
class PromptLogprobsChunk:
    """Prompt logprobs computed in one step for one request.

    Attributes:
        start: Position of the first row; row ``i`` scores prompt token ``start + i + 1``.
        lists: Row ``i``: the prompt token ``start + i + 1`` first, then the top-N.
    """

    start: int
    lists: LogprobsLists


@dataclass
class SamplerOutput:
    """What the sampler returns for one step.

    Attributes:
        sampled_token_ids: ``[num_reqs]`` int64, on the device. Always a valid token id,
            even for a row whose logits were not finite (async scheduling feeds it to
            the next step before anyone looks).
        logprobs_tensors: Sampled token's and top-N raw logprobs per row, or None when
            no row asked for logprobs.
        logits_finite: ``[num_reqs]`` bool, on the device: False where the model's raw
            logits row held a NaN or +inf, or nothing but -inf (the row's token means
            nothing); None when nothing checked.
    """

    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None = None
    logits_finite: torch.Tensor | None = None


NONFINITE_LOGITS_ERROR = "the model's logits for this request were not finite (NaN or inf)"
"""The error of a request whose logits row failed the sampler's finiteness check."""


@dataclass
class ModelRunnerOutput:
    """Tokens sampled in one step, aligned with ``SchedulerOutput.sampling_requests()``.

    Attributes:
        req_ids: The requests that sampled, in batch order.
        sampled_token_ids: One token per request.
        logprobs: Row ``i``: raw logprobs of request ``i``'s sampled token and the
            batch's top-N; None when no request asked for logprobs.
        prompt_logprobs: request id -> prompt logprobs computed this step.
        errors: request id -> why its row failed (e.g. ``NONFINITE_LOGITS_ERROR``); its
            entry in ``sampled_token_ids`` is meaningless. The scheduler finishes such
            a request with an error; the other rows are unaffected.
        num_accepted_tokens: With speculative decoding, how many of its drafts each
            request accepted; its ``sampled_token_ids`` entry is the token after them
            (the target's correction, or the bonus token). None without drafts.
        draft_token_ids: With a draft model, the ``k`` drafts it proposed for each
            request's next step (row ``i`` for request ``i``); None otherwise.
    """

    req_ids: list[str]
    sampled_token_ids: list[int]
    logprobs: LogprobsLists | None = None
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    num_accepted_tokens: list[int] | None = None
    draft_token_ids: list[list[int]] | None = None


class AsyncModelRunnerOutput(ABC):
    """A step's ``ModelRunnerOutput`` that may still be computing on the device.

    The handle async scheduling waits on; the CUDA-event implementation is
    ``minivllm.worker.async_utils.AsyncOutput``.
    """

    @abstractmethod
    def get_output(self) -> ModelRunnerOutput:
        """Wait until the step's results are on the host and return them (idempotent)."""
