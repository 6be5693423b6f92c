"""Stat loggers: where the engine's numbers go once a step's outputs are processed.

Upstream counterpart: ``vllm/v1/metrics/loggers.py`` (``StatLoggerBase``,
``LoggingStatLogger``, ``PrometheusStatLogger``, ``StatLoggerManager``).

The front end calls ``record(scheduler_stats, iteration_stats)`` once per engine step it
processes: ``SchedulerStats`` is the scheduler's snapshot that travels with every step's
outputs, ``IterationStats`` is what the output processor measured for that step (tokens,
time to first token, inter-token gaps, finished requests). ``log()`` is called
periodically; only the logging logger prints anything.

One difference from upstream shapes this file: vLLM's ``SchedulerStats`` carries the
prefix-cache lookups *of that step*, while minivllm's carries since-start totals
(``num_preemptions``, ``prefix_cache_queries``, ``prefix_cache_hits``). Each logger turns
those totals back into increments with :class:`SchedulerCounterDeltas`, so a Prometheus
counter rises by exactly what happened between two records.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minivllm.core.sched_output import SchedulerStats
from minivllm.metrics.stats import IterationStats
from minivllm.spec_decode.metrics import SpecDecodingStats

logger = logging.getLogger(__name__)

# Upstream's bucket boundaries (vllm/v1/metrics/loggers.py), so dashboards built for vLLM
# read minivllm's histograms unchanged.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]

# Finish reasons given a zero-valued series from the start (as upstream does for every
# FinishReason), so a scrape shows them before the first request of each kind ends.
FINISH_REASONS = ("stop", "length", "abort", "error")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (the token-count histograms' buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


def finish_reason_label(reason: Any) -> str:
    """The ``finished_reason`` label of a finish reason given as a string or an enum."""
    if isinstance(reason, str):
        return reason
    name = getattr(reason, "name", None)
    return name.lower() if isinstance(name, str) else str(reason)


@dataclass
class SchedulerCounterDeltas:
    """Turns ``SchedulerStats``' since-start counts into increments since the last call.

    A count smaller than the one seen before means the engine started counting afresh
    (its prefix-cache stats were reset): the whole new count is then the increment.
    """

    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    def update(self, stats: SchedulerStats) -> tuple[int, int, int]:
        """Increments of (preemptions, prefix-cache queries, prefix-cache hits)."""
        out = []
        for name in ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits"):
            now, before = getattr(stats, name), getattr(self, name)
            out.append(now - before if now >= before else now)
            setattr(self, name, now)
        return out[0], out[1], out[2]


class StatLoggerBase(ABC):
    """What the front ends call; subclass it to send the numbers anywhere else."""

    @abstractmethod
    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        """Take one processed engine step's stats (either may be None)."""

    def log(self) -> None:  # noqa: B027 -- most loggers have nothing to do periodically
        """Called periodically by the front end (default: nothing)."""


class LoggingStatLogger(StatLoggerBase):
    """One INFO line per ``log()`` call: throughput since the previous line, queue
    lengths, KV cache usage and the prefix-cache hit rate, as vLLM prints.

    Args:
        vllm_config: The engine's config (unused for now; upstream's signature).
        engine_index: Shown in the line's prefix.
        clock: Seconds, monotonic; tests pass their own to check the throughput exactly.
    """

    def __init__(
        self, vllm_config: Any = None, engine_index: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.clock = clock
        self.last_scheduler_stats: SchedulerStats | None = None
        self.deltas = SchedulerCounterDeltas()
        self.last_prompt_throughput = 0.0
        self.last_generation_throughput = 0.0
        self._reset(clock())

    def _reset(self, now: float) -> None:
        self.last_log_time = now
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_preemptions = 0

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        """Add a step's tokens to the interval's totals; keep the newest snapshot."""
        if iteration_stats is not None:
            self.num_prompt_tokens += iteration_stats.num_prompt_tokens
            self.num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            preemptions, _, _ = self.deltas.update(scheduler_stats)
            self.num_preemptions += preemptions
            self.last_scheduler_stats = scheduler_stats

    def log(self) -> str:
        """Log (and return) the line for the interval since the previous call.

        Two idle intervals in a row are logged at DEBUG only, so an idle server stays
        quiet, as upstream.
        """
        now = self.clock()
        elapsed = now - self.last_log_time
        prompt_tps = self.num_prompt_tokens / elapsed if elapsed > 0 else 0.0
        gen_tps = self.num_generation_tokens / elapsed if elapsed > 0 else 0.0
        idle = not any((prompt_tps, gen_tps, self.last_prompt_throughput,
                        self.last_generation_throughput))
        self.last_prompt_throughput, self.last_generation_throughput = prompt_tps, gen_tps
        s = self.last_scheduler_stats
        parts = [
            f"Avg prompt throughput: {prompt_tps:.1f} tokens/s",
            f"Avg generation throughput: {gen_tps:.1f} tokens/s",
            f"Running: {s.num_running_reqs if s else 0} reqs",
            f"Waiting: {s.num_waiting_reqs if s else 0} reqs",
        ]
        if self.num_preemptions:
            parts.append(f"Preemptions: {self.num_preemptions}")
        parts.append(f"KV cache usage: {100 * (s.kv_cache_usage if s else 0.0):.1f}%")
        # Since start, where upstream keeps a window of the last 1000 requests.
        parts.append(f"Prefix cache hit rate: {100 * (s.prefix_cache_hit_rate if s else 0.0):.1f}%")
        line = f"Engine {self.engine_index:03d}: " + ", ".join(parts)
        logger.log(logging.DEBUG if idle else logging.INFO, line)
        spec = s.spec_decoding_stats if s else None
        if spec is not None and spec.num_drafts and not idle:
            # Upstream's second line, here since start rather than over the interval.
            logger.info("Engine %03d: %s", self.engine_index, spec.summary())
        self._reset(now)
        return line


class PrometheusStatLogger(StatLoggerBase):
    """vLLM's Prometheus metrics, by vLLM's names, labelled with ``model_name``.

    Every instance owns its own ``CollectorRegistry`` (upstream registers into the
    process-wide one and unregisters old metrics first); the server serves
    ``self.registry`` at ``GET /metrics`` with ``prometheus_client.generate_latest``.

    Args:
        vllm_config: The engine's config; ``model_config.max_model_len`` bounds the
            token-count histograms.
        model_name: The served model name (the ``model_name`` label).
        registry: Register here instead of a fresh registry.
    """

    def __init__(
        self, vllm_config: Any, model_name: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        self.deltas = SchedulerCounterDeltas()
        max_len = vllm_config.model_config.max_model_len
        token_buckets = build_1_2_5_buckets(max_len)

        self.gauge_running = self._gauge("vllm:num_requests_running",
                                         "Number of requests in model execution batches.")
        self.gauge_waiting = self._gauge("vllm:num_requests_waiting",
                                         "Number of requests waiting to be processed.")
        self.gauge_kv_cache_usage = self._gauge("vllm:kv_cache_usage_perc",
                                                "KV-cache usage. 1 means 100 percent usage.")
        self.counter_prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
            "tokens.")
        self.counter_prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.counter_preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.counter_prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.counter_generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.")
        self._request_success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            labelnames=["model_name", "finished_reason"], registry=self.registry)
        for reason in FINISH_REASONS:
            self._request_success.labels(model_name, reason)

        self.hist_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.hist_generation_tokens = self._histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.",
            token_buckets)
        self.hist_max_tokens = self._histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            token_buckets)
        self.hist_iteration_tokens = self._histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS)
        self.hist_ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            TTFT_BUCKETS)
        self.hist_itl = self._histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS)
        self.hist_tpot = self._histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        phases = (("e2e", "vllm:e2e_request_latency_seconds",
                   "Histogram of e2e request latency in seconds."),
                  ("queue", "vllm:request_queue_time_seconds",
                   "Histogram of time spent in WAITING phase for request."),
                  ("inference", "vllm:request_inference_time_seconds",
                   "Histogram of time spent in RUNNING phase for request."),
                  ("prefill", "vllm:request_prefill_time_seconds",
                   "Histogram of time spent in PREFILL phase for request."),
                  ("decode", "vllm:request_decode_time_seconds",
                   "Histogram of time spent in DECODE phase for request."))
        self.hist_request_time = {
            key: self._histogram(name, doc, REQUEST_LATENCY_BUCKETS) for key, name, doc in phases
        }
        spec = getattr(vllm_config, "speculative_config", None)
        self.spec_decode = None if spec is None else SpecDecodeCounters(self, spec)

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, labelnames=["model_name"], registry=self.registry
                     ).labels(self.model_name)

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, labelnames=["model_name"], registry=self.registry
                       ).labels(self.model_name)

    def _histogram(self, name: str, doc: str, buckets: Iterable[float]) -> Any:
        return Histogram(name, doc, labelnames=["model_name"], buckets=list(buckets),
                         registry=self.registry).labels(self.model_name)

    def request_success(self, reason: Any) -> Any:
        """The ``vllm:request_success`` child of one finish reason."""
        return self._request_success.labels(self.model_name, finish_reason_label(reason))

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        """Set the gauges from the snapshot; add the step's counts and observations."""
        if scheduler_stats is not None:
            self.gauge_running.set(scheduler_stats.num_running_reqs)
            self.gauge_waiting.set(scheduler_stats.num_waiting_reqs)
            self.gauge_kv_cache_usage.set(scheduler_stats.kv_cache_usage)
            preemptions, queries, hits = self.deltas.update(scheduler_stats)
            self.counter_preemptions.inc(preemptions)
            self.counter_prefix_cache_queries.inc(queries)
            self.counter_prefix_cache_hits.inc(hits)
            if self.spec_decode is not None and scheduler_stats.spec_decoding_stats is not None:
                self.spec_decode.record(scheduler_stats.spec_decoding_stats)
        if iteration_stats is None:
            return
        it = iteration_stats
        self.counter_prompt_tokens.inc(it.num_prompt_tokens)
        self.counter_generation_tokens.inc(it.num_generation_tokens)
        self.hist_iteration_tokens.observe(it.num_prompt_tokens + it.num_generation_tokens)
        for ttft in it.time_to_first_tokens_iter:
            self.hist_ttft.observe(ttft)
        for itl in it.inter_token_latencies_iter:
            self.hist_itl.observe(itl)
        for req in it.finished_requests:
            self.request_success(req.finish_reason).inc()
            times = {"e2e": req.e2e_latency, "queue": req.queued_time,
                     "inference": req.inference_time, "prefill": req.prefill_time,
                     "decode": req.decode_time}
            for key, seconds in times.items():
                self.hist_request_time[key].observe(seconds)
            self.hist_prompt_tokens.observe(req.num_prompt_tokens)
            self.hist_generation_tokens.observe(req.num_generation_tokens)
            self.hist_tpot.observe(req.mean_time_per_output_token)
            if req.max_tokens_param:
                self.hist_max_tokens.observe(req.max_tokens_param)


class StatLoggerManager:
    """Fans ``record`` and ``log`` out to several loggers, so a front end holds one object.

    Args:
        loggers: The loggers, called in order.
    """

    def __init__(self, loggers: Iterable[StatLoggerBase]) -> None:
        self.loggers = list(loggers)

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        """Hand one step's stats to every logger."""
        for stat_logger in self.loggers:
            stat_logger.record(scheduler_stats, iteration_stats)

    def log(self) -> None:
        """Let every logger write its periodic output."""
        for stat_logger in self.loggers:
            stat_logger.log()


class SpecDecodeCounters:
    """Upstream's speculative-decoding counters (``SpecDecodingProm`` in
    ``vllm/v1/spec_decode/metrics.py``), fed from the scheduler's since-start totals.

    Registered only when the engine speculates, as upstream. The acceptance rate is
    ``rate(vllm:spec_decode_num_accepted_tokens_total) /
    rate(vllm:spec_decode_num_draft_tokens_total)`` in PromQL.
    """

    FIELDS = (
        ("num_drafts", "Number of spec decoding drafts."),
        ("num_draft_tokens", "Number of draft tokens."),
        ("num_accepted_tokens", "Number of accepted tokens."),
    )

    def __init__(self, parent: PrometheusStatLogger, spec_config: Any) -> None:
        self.counters = {
            name: parent._counter(f"vllm:spec_decode_{name}", doc) for name, doc in self.FIELDS
        }
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labelnames=["model_name", "position"],
            registry=parent.registry,
        )
        self.per_pos = [
            per_pos.labels(parent.model_name, str(pos))
            for pos in range(spec_config.num_speculative_tokens)
        ]
        self.last: SpecDecodingStats | None = None

    def record(self, stats: SpecDecodingStats) -> None:
        """Add what the totals gained since the previous snapshot."""
        last = self.last or SpecDecodingStats(stats.num_spec_tokens)
        for name, counter in self.counters.items():
            counter.inc(max(0, getattr(stats, name) - getattr(last, name)))
        for pos, counter in enumerate(self.per_pos):
            now, before = stats.num_accepted_tokens_per_pos, last.num_accepted_tokens_per_pos
            counter.inc(max(0, now[pos] - before[pos]))
        self.last = stats
