"""What is measured: per request across its steps, and per processed engine step.

Upstream counterpart: ``vllm/v1/metrics/stats.py`` (``RequestStateStats``,
``FinishedRequestStats``, ``IterationStats``). The engine core stamps scheduling events
and each step's results with ``time.monotonic()``; the front end keeps one
``RequestStateStats`` per request and turns those stamps into intervals. Latencies the
user sees (time to first token, end to end) are measured from the request's arrival in
the front end with ``time.time()``, because that is where the user's clock starts.

The intervals of one request::

    arrival   queued      scheduled         first token ...... last token   finished
      |---------|-------------|------------------|-------------------|----------|
                 queued_time    prefill_time          decode_time
                              |<-------------- inference_time ------>|
      |<----------------------------- e2e_latency ----------------------------->|
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestStateStats:
    """One request's timestamps, updated as its outputs arrive.

    Attributes:
        arrival_time: ``time.time()`` when the front end accepted the request.
        queued_ts: Core time it entered the scheduler's waiting queue.
        scheduled_ts: Core time it was first scheduled (preemptions do not reset it).
        first_token_ts: Core time of the step that produced its first token.
        last_token_ts: Core time of the step that produced its latest token.
        first_token_latency: Seconds from arrival to the first token (TTFT).
        num_generation_tokens: Tokens generated so far.
        num_preemptions: Times the scheduler preempted it.
        finished_time: ``time.time()`` when the front end saw it finish (0 while running).
        num_draft_tokens: Draft tokens verified for it (speculative decoding).
        num_accepted_tokens: Of those, accepted.
    """

    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    finished_time: float = 0.0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def queued_time(self) -> float:
        """Seconds in the waiting queue before the first schedule."""
        return self.scheduled_ts - self.queued_ts

    @property
    def prefill_time(self) -> float:
        """Seconds from the first schedule to the first token."""
        return self.first_token_ts - self.scheduled_ts

    @property
    def decode_time(self) -> float:
        """Seconds from the first token to the last."""
        return self.last_token_ts - self.first_token_ts

    @property
    def inference_time(self) -> float:
        """Seconds from the first schedule to the last token."""
        return self.last_token_ts - self.scheduled_ts

    @property
    def e2e_latency(self) -> float:
        """Seconds from arrival to finish (0 while the request runs)."""
        return self.finished_time - self.arrival_time if self.finished_time else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted over verified draft tokens (NaN when none was verified)."""
        if not self.num_draft_tokens:
            return float("nan")
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_time_per_output_token(self) -> float:
        """Decode time over the tokens after the first (TPOT)."""
        steps = self.num_generation_tokens - 1
        return self.decode_time / steps if steps > 0 else 0.0


@dataclass
class FinishedRequestStats:
    """A finished request's summary, as the metric histograms observe it."""

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    max_tokens_param: int | None
    queued_time: float
    prefill_time: float
    inference_time: float
    decode_time: float
    mean_time_per_output_token: float
    num_cached_tokens: int = 0


@dataclass
class IterationStats:
    """What one processed engine step meant for its requests.

    Attributes:
        iteration_timestamp: ``time.time()`` when the front end processed the step.
        num_generation_tokens: Tokens generated in the step.
        num_prompt_tokens: Prompt tokens of the requests that got their first token.
        num_preempted_reqs: Preemptions reported in the step.
        finished_requests: The requests that finished in it.
        time_to_first_tokens_iter: TTFT of each request that got its first token.
        inter_token_latencies_iter: For every other request with new tokens, the time
            since its previous tokens (ITL).
    """

    iteration_timestamp: float = field(default_factory=time.time)
    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0
    num_preempted_reqs: int = 0
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)

    def record_event(self, req_stats: RequestStateStats, kind: str, timestamp: float) -> None:
        """Apply one scheduling event (``"queued"``, ``"scheduled"``, ``"preempted"``)."""
        if kind == "queued":
            req_stats.queued_ts = timestamp
        elif kind == "scheduled":
            if req_stats.scheduled_ts == 0.0:  # a resume after preemption keeps the first
                req_stats.scheduled_ts = timestamp
        elif kind == "preempted":
            req_stats.num_preemptions += 1
            self.num_preempted_reqs += 1

    def record_tokens(
        self,
        req_stats: RequestStateStats,
        num_new_tokens: int,
        engine_core_timestamp: float,
        num_prompt_tokens: int,
    ) -> None:
        """Account for a request's new tokens of this step (none: nothing to record)."""
        if num_new_tokens == 0:
            return
        self.num_generation_tokens += num_new_tokens
        if req_stats.num_generation_tokens == 0:
            req_stats.first_token_latency = self.iteration_timestamp - req_stats.arrival_time
            req_stats.first_token_ts = engine_core_timestamp
            self.time_to_first_tokens_iter.append(req_stats.first_token_latency)
            self.num_prompt_tokens += num_prompt_tokens
        else:
            self.inter_token_latencies_iter.append(
                engine_core_timestamp - req_stats.last_token_ts
            )
        req_stats.num_generation_tokens += num_new_tokens
        req_stats.last_token_ts = engine_core_timestamp

    def record_finished(
        self,
        req_stats: RequestStateStats,
        finish_reason: str,
        num_prompt_tokens: int,
        max_tokens_param: int | None,
        num_cached_tokens: int,
    ) -> None:
        """Close a request's stats and keep its summary for the histograms."""
        req_stats.finished_time = self.iteration_timestamp
        self.finished_requests.append(
            FinishedRequestStats(
                finish_reason=finish_reason,
                e2e_latency=req_stats.e2e_latency,
                num_prompt_tokens=num_prompt_tokens,
                num_generation_tokens=req_stats.num_generation_tokens,
                max_tokens_param=max_tokens_param,
                queued_time=req_stats.queued_time,
                prefill_time=req_stats.prefill_time,
                inference_time=req_stats.inference_time,
                decode_time=req_stats.decode_time,
                mean_time_per_output_token=req_stats.mean_time_per_output_token,
                num_cached_tokens=num_cached_tokens,
            )
        )
