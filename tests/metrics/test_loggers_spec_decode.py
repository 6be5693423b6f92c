"""Speculative decoding's counters in /metrics and its line in the periodic log."""

from __future__ import annotations

import dataclasses
import logging

from minivllm.config import SpeculativeConfig
from minivllm.metrics.loggers import LoggingStatLogger, PrometheusStatLogger
from minivllm.metrics.stats import IterationStats
from minivllm.spec_decode.metrics import SpecDecodingStats
from tests.metrics.test_loggers import MODEL, sched, scrape, value, vllm_config  # noqa: F401


def spec_stats(drafts: list[tuple[int, int]]) -> SpecDecodingStats:
    stats = SpecDecodingStats(num_spec_tokens=3)
    for drafted, accepted in drafts:
        stats.observe_draft(drafted, accepted)
    return stats


def test_counters_follow_the_since_start_totals(vllm_config) -> None:  # noqa: F811
    plain = PrometheusStatLogger(vllm_config, MODEL)
    assert not any(name.startswith("vllm:spec_decode") for name, _ in scrape(plain))

    config = dataclasses.replace(
        vllm_config, speculative_config=SpeculativeConfig(num_speculative_tokens=3)
    )
    prom = PrometheusStatLogger(config, MODEL)
    step = sched()
    step.spec_decoding_stats = spec_stats([(3, 3), (3, 1)])
    prom.record(step, None)
    step = sched()
    step.spec_decoding_stats = spec_stats([(3, 3), (3, 1), (2, 0)])
    prom.record(step, None)
    s = scrape(prom)
    assert value(s, "vllm:spec_decode_num_drafts_total") == 3
    assert value(s, "vllm:spec_decode_num_draft_tokens_total") == 8
    assert value(s, "vllm:spec_decode_num_accepted_tokens_total") == 4
    per_pos = [
        value(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
        for p in range(3)
    ]
    assert per_pos == [2, 1, 1]


def test_log_line(caplog) -> None:
    now = [0.0]
    log = LoggingStatLogger(clock=lambda: now[0])
    step = sched(running=1)
    step.spec_decoding_stats = spec_stats([(3, 3), (3, 1)])
    tokens = IterationStats()
    tokens.num_generation_tokens = 6
    log.record(step, tokens)
    now[0] = 10.0
    with caplog.at_level(logging.INFO, logger="minivllm"):
        log.log()
    assert "Mean acceptance length: 3.00" in caplog.text
    assert "Per-position acceptance rate: 1.000, 0.500, 0.500" in caplog.text
