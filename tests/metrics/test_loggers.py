"""The stat loggers: every Prometheus value after a known sequence of engine steps, and
the periodic log line computed with a fake clock."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minivllm.core.sched_output import SchedulerStats
from minivllm.demo import demo_model_path
from minivllm.engine import FinishReason
from minivllm.engine.arg_utils import EngineArgs
from minivllm.metrics.loggers import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    LoggingStatLogger,
    PrometheusStatLogger,
    SchedulerCounterDeltas,
    StatLoggerBase,
    StatLoggerManager,
    build_1_2_5_buckets,
)
from minivllm.metrics.stats import FinishedRequestStats, IterationStats

MODEL = "demo"


@pytest.fixture(scope="module")
def vllm_config():
    return EngineArgs(model=str(demo_model_path())).create_engine_config()  # max_model_len 512


def sched(running=0, waiting=0, usage=0.0, preemptions=0, queries=0, hits=0) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting,
                          kv_cache_usage=usage, num_preemptions=preemptions, num_steps=0,
                          peak_blocks_in_use=0, prefix_cache_queries=queries,
                          prefix_cache_hits=hits)


def finished(reason: str, e2e: float, prompt: int, gen: int, max_tokens: int | None = None,
             queued=0.0, prefill=0.0, inference=0.0, decode=0.0, tpot=0.0):
    return FinishedRequestStats(
        finish_reason=reason, e2e_latency=e2e, num_prompt_tokens=prompt,
        num_generation_tokens=gen, max_tokens_param=max_tokens, queued_time=queued,
        prefill_time=prefill, inference_time=inference, decode_time=decode,
        mean_time_per_output_token=tpot)


def scrape(prom: PrometheusStatLogger) -> dict[tuple[str, tuple], float]:
    """Every sample of the registry: (name, sorted labels) -> value, as a server serves it."""
    text = generate_latest(prom.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted({"model_name": MODEL, **labels}.items())))]


def test_1_2_5_buckets() -> None:
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(512) == [1, 2, 5, 10, 20, 50, 100, 200, 500]
    assert build_1_2_5_buckets(0) == []


def test_deltas_of_since_start_counts() -> None:
    deltas = SchedulerCounterDeltas()
    assert deltas.update(sched(preemptions=2, queries=100, hits=10)) == (2, 100, 10)
    assert deltas.update(sched(preemptions=2, queries=130, hits=26)) == (0, 30, 16)
    # The engine reset its prefix-cache stats: the smaller count is all new.
    assert deltas.update(sched(preemptions=3, queries=40, hits=8)) == (1, 40, 8)


def test_prometheus_gauges_and_scheduler_counters(vllm_config) -> None:
    prom = PrometheusStatLogger(vllm_config, MODEL)
    prom.record(sched(running=3, waiting=2, usage=0.25, preemptions=1, queries=64, hits=16),
                None)
    prom.record(sched(running=4, waiting=0, usage=0.5, preemptions=3, queries=96, hits=48),
                None)
    s = scrape(prom)
    assert value(s, "vllm:num_requests_running") == 4
    assert value(s, "vllm:num_requests_waiting") == 0
    assert value(s, "vllm:kv_cache_usage_perc") == 0.5
    # Counters rise by the increments, so they end at the since-start totals.
    assert value(s, "vllm:num_preemptions_total") == 3
    assert value(s, "vllm:prefix_cache_queries_total") == 96
    assert value(s, "vllm:prefix_cache_hits_total") == 48
    prom.record(sched(preemptions=3, queries=10, hits=5), None)  # stats reset in the engine
    s = scrape(prom)
    assert value(s, "vllm:prefix_cache_queries_total") == 106
    assert value(s, "vllm:prefix_cache_hits_total") == 53
    assert value(s, "vllm:num_preemptions_total") == 3


def test_prometheus_iteration_stats(vllm_config) -> None:
    prom = PrometheusStatLogger(vllm_config, MODEL)
    s = scrape(prom)
    for reason in ("stop", "length", "abort", "error"):  # at zero before any request ends
        assert value(s, "vllm:request_success_total", finished_reason=reason) == 0
    step1 = IterationStats(num_generation_tokens=2, num_prompt_tokens=30,
                           time_to_first_tokens_iter=[0.003, 0.07])
    step2 = IterationStats(
        num_generation_tokens=2, inter_token_latencies_iter=[0.02, 0.2],
        finished_requests=[
            finished("length", e2e=0.4, prompt=10, gen=2, max_tokens=2, queued=0.1,
                     prefill=0.2, inference=0.25, decode=0.05, tpot=0.05),
            finished("stop", e2e=3.0, prompt=20, gen=2, max_tokens=None, queued=0.6,
                     prefill=1.2, inference=2.0, decode=0.8, tpot=0.8)])
    prom.record(None, step1)
    prom.record(sched(running=0), step2)
    s = scrape(prom)
    assert value(s, "vllm:prompt_tokens_total") == 30
    assert value(s, "vllm:generation_tokens_total") == 4
    assert value(s, "vllm:request_success_total", finished_reason="length") == 1
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(s, "vllm:request_success_total", finished_reason="abort") == 0

    def hist(name, le=None):
        if le is None:
            return value(s, name + "_count"), value(s, name + "_sum")
        return value(s, name + "_bucket", le=le)

    assert hist("vllm:time_to_first_token_seconds") == (2, pytest.approx(0.073))
    assert hist("vllm:time_to_first_token_seconds", "0.001") == 0
    assert hist("vllm:time_to_first_token_seconds", "0.005") == 1
    assert hist("vllm:time_to_first_token_seconds", "0.08") == 2
    assert hist("vllm:inter_token_latency_seconds") == (2, pytest.approx(0.22))
    assert hist("vllm:inter_token_latency_seconds", "0.025") == 1
    assert hist("vllm:inter_token_latency_seconds", "0.2") == 2
    assert hist("vllm:e2e_request_latency_seconds") == (2, pytest.approx(3.4))
    assert hist("vllm:e2e_request_latency_seconds", "0.5") == 1
    assert hist("vllm:e2e_request_latency_seconds", "2.5") == 1
    assert hist("vllm:e2e_request_latency_seconds", "5.0") == 2
    expected_sums = {"queue": 0.7, "prefill": 1.4, "inference": 2.25, "decode": 0.85}
    for phase, total in expected_sums.items():
        name = ("vllm:request_queue_time_seconds" if phase == "queue"
                else f"vllm:request_{phase}_time_seconds")
        assert hist(name) == (2, pytest.approx(total)), phase
    assert hist("vllm:request_time_per_output_token_seconds") == (2, pytest.approx(0.85))
    assert hist("vllm:request_prompt_tokens") == (2, 30)
    assert hist("vllm:request_prompt_tokens", "10.0") == 1
    assert hist("vllm:request_prompt_tokens", "20.0") == 2
    assert hist("vllm:request_generation_tokens") == (2, 4)
    assert hist("vllm:request_params_max_tokens") == (1, 2)  # unset max_tokens not observed
    assert hist("vllm:iteration_tokens_total") == (2, 34)
    assert hist("vllm:iteration_tokens_total", "1.0") == 0
    assert hist("vllm:iteration_tokens_total", "32.0") == 2
    # The token-count buckets stop at the model's max_model_len, as upstream's.
    les = {labels for (name, labels) in s if name == "vllm:request_prompt_tokens_bucket"}
    assert {dict(lab)["le"] for lab in les} == {
        *(str(float(b)) for b in build_1_2_5_buckets(512)), "+Inf"}
    # The engine's FinishReason enum is labelled by its name, as upstream's str().
    prom.record(None, IterationStats(finished_requests=[
        finished(FinishReason.ABORT, e2e=1.0, prompt=1, gen=0)]))
    assert value(scrape(prom), "vllm:request_success_total", finished_reason="abort") == 1


def test_prometheus_bucket_boundaries_are_upstreams(vllm_config) -> None:
    prom = PrometheusStatLogger(vllm_config, MODEL)
    s = scrape(prom)
    for name, buckets in (("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
                          ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
                          ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS)):
        les = {dict(lab)["le"] for (n, lab) in s if n == name + "_bucket"}
        assert les == {*(str(float(b)) for b in buckets), "+Inf"}, name
    assert len(TTFT_BUCKETS) == 22 and len(ITL_BUCKETS) == 19
    assert len(REQUEST_LATENCY_BUCKETS) == 21


def test_each_logger_has_its_own_registry(vllm_config) -> None:
    a = PrometheusStatLogger(vllm_config, MODEL)
    b = PrometheusStatLogger(vllm_config, MODEL)  # would raise on a shared registry
    a.record(None, IterationStats(num_generation_tokens=5))
    assert value(scrape(a), "vllm:generation_tokens_total") == 5
    assert value(scrape(b), "vllm:generation_tokens_total") == 0


def test_logging_logger_line(caplog) -> None:
    now = [100.0]
    log = LoggingStatLogger(clock=lambda: now[0])
    log.record(None, IterationStats(num_prompt_tokens=100, num_generation_tokens=40))
    log.record(sched(running=5, waiting=2, usage=0.125, preemptions=2, queries=200, hits=50),
               IterationStats(num_generation_tokens=10))
    now[0] = 110.0
    with caplog.at_level(logging.DEBUG, logger="minivllm.metrics.loggers"):
        line = log.log()
    assert line == ("Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation "
                    "throughput: 5.0 tokens/s, Running: 5 reqs, Waiting: 2 reqs, "
                    "Preemptions: 2, KV cache usage: 12.5%, Prefix cache hit rate: 25.0%")
    assert caplog.records[-1].levelno == logging.INFO and caplog.records[-1].message == line
    # The next interval starts afresh: no new tokens, no new preemptions.
    log.record(sched(running=0, preemptions=2, queries=200, hits=50), None)
    now[0] = 115.0
    with caplog.at_level(logging.DEBUG, logger="minivllm.metrics.loggers"):
        line = log.log()
        assert "Avg generation throughput: 0.0 tokens/s" in line and "Preemptions" not in line
        assert caplog.records[-1].levelno == logging.INFO  # the previous interval was busy
        now[0] = 120.0
        log.log()
        assert caplog.records[-1].levelno == logging.DEBUG  # idle twice: quiet


def test_manager_fans_out(vllm_config) -> None:
    seen = []

    class Recorder(StatLoggerBase):
        def record(self, scheduler_stats, iteration_stats):
            seen.append((scheduler_stats, iteration_stats))

        def log(self):
            seen.append("log")

    prom = PrometheusStatLogger(vllm_config, MODEL)
    manager = StatLoggerManager([Recorder(), prom])
    it = IterationStats(num_generation_tokens=3)
    manager.record(None, it)
    manager.log()
    assert seen == [(None, it), "log"]
    assert value(scrape(prom), "vllm:generation_tokens_total") == 3
