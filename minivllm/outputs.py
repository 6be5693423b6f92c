"""What ``LLM.generate`` returns, shaped as vLLM shapes it.

Upstream counterpart: ``vllm/outputs.py`` (``RequestOutput``, ``CompletionOutput``).
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.metrics.stats import RequestStateStats
from minivllm.runner_outputs import Logprob

PositionLogprobs = dict[int, Logprob]
"""One position's log-probabilities: token id -> ``Logprob(logprob, rank, decoded_token)``.

The chosen token comes first, then the top-N (vLLM's ``LogprobsOnePosition``)."""

__all__ = ["CompletionOutput", "Logprob", "PositionLogprobs", "RequestOutput"]


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: Which of the request's ``n`` samples this is.
        text: Detokenized output ("" when the model has no tokenizer).
        token_ids: Generated token ids.
        cumulative_logprob: Sum of the sampled tokens' logprobs, when logprobs were asked.
        logprobs: Per generated token, the sampled token's and the top-N raw logprobs
            (None unless ``SamplingParams.logprobs`` was set).
        finish_reason: ``"stop"``, ``"length"``, ``"abort"`` or None while running.
        stop_reason: The stop string or stop token id that ended generation, if any.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The result of one prompt.

    Attributes:
        request_id: Engine-assigned id.
        prompt: The prompt text, or None for a token-id prompt.
        prompt_token_ids: The tokenized prompt.
        outputs: One ``CompletionOutput`` per sample (``n`` of them).
        finished: Whether every sample has finished.
        prompt_logprobs: Per prompt token, the prompt token's and the top-N logprobs;
            the first entry is None (nothing predicts the first token).
        num_cached_tokens: Prompt tokens served from the prefix cache.
        metrics: The request's timings (arrival, queued, scheduled, first and last
            token; ``queued_time``, ``prefill_time``, ``decode_time``,
            ``inference_time``, ``e2e_latency`` once finished), as upstream's
            ``RequestStateStats``. For ``n > 1``, those of the sample that finished last.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestStateStats | None = None
