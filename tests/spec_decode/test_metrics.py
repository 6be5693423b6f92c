"""SpecDecodingStats: counts, rates per position, mean acceptance length."""

from __future__ import annotations

import math

import pytest

from minivllm.spec_decode.metrics import SpecDecodingStats


def test_rates_from_a_few_drafts() -> None:
    stats = SpecDecodingStats(num_spec_tokens=3)
    stats.observe_draft(3, 3)  # all accepted
    stats.observe_draft(3, 1)
    stats.observe_draft(2, 0)
    stats.observe_draft(0, 0)  # no draft this step: not counted
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.num_accepted_tokens_per_pos == [2, 1, 1]
    assert stats.acceptance_rate == pytest.approx(4 / 8)
    assert stats.acceptance_rate_per_pos == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert "Mean acceptance length: 2.33" in stats.summary()
    assert "Per-position acceptance rate: 0.667, 0.333, 0.333" in stats.summary()


def test_merge_adds_and_empty_stats_are_nan() -> None:
    total = SpecDecodingStats(num_spec_tokens=2)
    assert math.isnan(total.acceptance_rate) and math.isnan(total.mean_acceptance_length)
    step = SpecDecodingStats(num_spec_tokens=2)
    step.observe_draft(2, 1)
    total.merge(step)
    total.merge(step)
    assert (total.num_drafts, total.num_accepted_tokens_per_pos) == (2, [2, 0])
    with pytest.raises(ValueError, match="num_spec_tokens"):
        total.merge(SpecDecodingStats(num_spec_tokens=3))


def test_impossible_counts_are_refused() -> None:
    stats = SpecDecodingStats(num_spec_tokens=2)
    with pytest.raises(ValueError, match="accepted"):
        stats.observe_draft(1, 2)
    with pytest.raises(ValueError, match="num_spec_tokens"):
        stats.observe_draft(3, 0)


def test_copy_is_an_independent_snapshot() -> None:
    # The engine sends a copy with every step's stats: counting on afterwards must not
    # change a snapshot already sent, per-position list included.
    stats = SpecDecodingStats(num_spec_tokens=2)
    stats.observe_draft(2, 1)
    snapshot = stats.copy()
    stats.observe_draft(2, 2)
    assert snapshot == SpecDecodingStats(2, 1, 2, 1, [1, 0])
    assert stats.num_accepted_tokens_per_pos == [2, 1]
