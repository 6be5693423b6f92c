"""Speculation off above a batch size (``SpeculativeConfig.disable_by_batch_size``).

A step that schedules more than ``disable_by_batch_size`` requests proposes no drafts,
so the next step verifies none; a smaller step proposes again. These tests run the
workloads of test_spec_decode_e2e.py and test_draft_model.py (the engine-vs-HF prompts
plus repetitive ones, a pool small enough to force preemptions, prefix caching on) with
a threshold that the running batch crosses up and down within one run, and check:
greedy outputs equal speculation off, the rule holds step by step, the statistics add
up, no block leaks, and (n-gram) the steps above the threshold ran ahead with async
scheduling while no step with drafts did (a draft model runs every step ahead).
"""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.arg_utils import EngineArgs
from tests.engine.test_llm_engine import _workload
from tests.spec_decode.test_draft_model import draft_model
from tests.spec_decode.test_spec_decode_e2e import MAX_MODEL_LEN, PREEMPTING, REPEATS, ngram
from tests.tiny_models import make_tiny_model

THRESHOLD = 4  # the preempting pool runs 1-5 requests at once: crossed both ways


@pytest.fixture(scope="module")
def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    prompts, max_tokens = _workload(seed=3, shared_prefix=True)
    prompts = [p[:40] for p in prompts] + REPEATS
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in [*max_tokens, 24, 24, 24]]
    return prompts, params


class Run:
    """One engine's run of the workload, with every step's shape recorded."""

    def __init__(self, path, prompts, params, **kwargs) -> None:
        self.llm = LLM(
            str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, **kwargs
        )
        self.core = self.llm.llm_engine.engine_core.engine_core
        # Per step: (requests scheduled, whether it verifies drafts, whether the step
        # before it was still in flight when it was scheduled).
        self.steps: list[tuple[int, bool, bool]] = []
        schedule = self.core.scheduler.schedule

        def recording_schedule():
            out = schedule()
            in_flight = self.core._in_flight is not None
            self.steps.append(
                (len(out.scheduled), bool(out.scheduled_spec_decode_tokens), in_flight)
            )
            return out

        self.core.scheduler.schedule = recording_schedule
        inputs = [{"prompt_token_ids": p} for p in prompts]
        self.outputs = self.llm.generate(inputs, params, use_tqdm=False)
        self.tokens = [o.outputs[0].token_ids for o in self.outputs]

    def check_rule_and_crossings(self) -> None:
        """Drafts only after a step of at most THRESHOLD requests, and both transitions
        happened: speculation paused after drafting, and resumed after a pause."""
        sizes = [n for n, _, _ in self.steps]
        drafted = [d for _, d, _ in self.steps]
        for i in range(1, len(self.steps)):
            if drafted[i]:
                assert sizes[i - 1] <= THRESHOLD, f"step {i} verifies drafts after a big step"
        big = [i for i, n in enumerate(sizes) if n > THRESHOLD]
        assert big, "the batch never exceeded the threshold"
        assert any(drafted[: big[-1]]), "speculation never paused after drafting"
        assert any(drafted[big[0] + 1 :]), "speculation never resumed after a pause"

    def check_stats_and_blocks(self) -> None:
        stats = self.llm.llm_engine.stats
        assert stats.num_preemptions > 0, "the tiny pool was meant to force preemptions"
        assert stats.prefix_cache_hit_rate > 0
        spec = stats.spec_decoding_stats
        assert 0 < spec.num_accepted_tokens <= spec.num_draft_tokens
        metrics = [o.metrics for o in self.outputs]
        assert sum(m.num_draft_tokens for m in metrics) == spec.num_draft_tokens
        assert sum(m.num_accepted_tokens for m in metrics) == spec.num_accepted_tokens
        manager = self.core.kv_cache_manager
        assert manager.num_free_blocks == manager.num_blocks


def test_ngram_pauses_above_the_threshold_and_runs_those_steps_ahead(workload, tmp_path):
    prompts, params = workload
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    reference = Run(path, prompts, params, **PREEMPTING).tokens
    spec = {**ngram(3), "disable_by_batch_size": THRESHOLD}
    run = Run(path, prompts, params, speculative_config=spec, **PREEMPTING)
    for i, (got, expected) in enumerate(zip(run.tokens, reference, strict=True)):
        assert got == expected, f"prompt {i} diverged"
    run.check_rule_and_crossings()
    run.check_stats_and_blocks()
    assert run.core.async_scheduling  # auto: on, for the steps above the threshold
    ahead = [(n, d) for n, d, in_flight in run.steps if in_flight]
    assert ahead, "no step above the threshold ran ahead"
    # A step scheduled while another ran never verifies drafts, and the step in flight
    # was one that proposed nothing (more than THRESHOLD requests).
    assert not any(d for _, d in ahead)
    for i, (_, _, in_flight) in enumerate(run.steps):
        if in_flight:
            assert run.steps[i - 1][0] > THRESHOLD and not run.steps[i - 1][1]


def test_draft_model_pauses_above_the_threshold(workload, pair) -> None:
    prompts, params = workload
    target, draft = pair
    reference = Run(target, prompts, params, **PREEMPTING).tokens
    spec = {**draft_model(draft, 3), "disable_by_batch_size": THRESHOLD}
    run = Run(target, prompts, params, speculative_config=spec, **PREEMPTING)
    for i, (got, expected) in enumerate(zip(run.tokens, reference, strict=True)):
        assert got == expected, f"prompt {i} diverged"
    run.check_rule_and_crossings()
    run.check_stats_and_blocks()
    # Async scheduling (a draft model's drafts stay on the device): steps with drafts
    # ran ahead too, their drafts taken from the step in flight.
    assert run.core.async_scheduling
    assert any(drafted and in_flight for _, drafted, in_flight in run.steps)


@pytest.mark.parametrize("skip_catch_up", [False, True])
def test_paused_steps_keep_the_drafts_cache_in_step(workload, pair, monkeypatch, skip_catch_up):
    """The target drafting for itself is accepted every time, pauses or not, because a
    paused step still runs the draft's catch-up pass. The negative control skips that
    pass on paused steps: the draft's cache then has holes and drafts get rejected."""
    from minivllm.spec_decode.draft_model import DraftModelProposer

    prompts, params = workload
    target, _ = pair
    if skip_catch_up:
        propose = DraftModelProposer.propose

        def without_catch_up(self, batch, input_ids, next_ids, accepted, only):
            if only:
                return torch.empty((int(batch.needs_sample.sum()), 0), dtype=torch.long)
            return propose(self, batch, input_ids, next_ids, accepted, only)

        monkeypatch.setattr(DraftModelProposer, "propose", without_catch_up)
    spec = {**draft_model(target, 3), "disable_by_batch_size": THRESHOLD}
    run = Run(target, prompts, params, speculative_config=spec, **PREEMPTING)
    run.check_rule_and_crossings()
    rate = run.llm.llm_engine.stats.spec_decoding_stats.acceptance_rate
    if skip_catch_up:
        assert rate < 0.9, rate
    else:
        assert rate == 1.0


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_bad_threshold_is_refused_naming_the_key(tmp_path, value) -> None:
    spec = {**ngram(2), "disable_by_batch_size": value}
    args = EngineArgs(model=str(tmp_path / "missing"), speculative_config=spec)
    with pytest.raises(ValueError, match=r"speculative_config\.disable_by_batch_size"):
        args.create_engine_config()  # before the (missing) model is looked at


def test_async_scheduling_follows_the_threshold(tmp_path) -> None:
    """n-gram with a threshold: async scheduling on unless turned off; n-gram without a
    threshold: off; a draft model: on, threshold or not (its drafts stay on the device)."""
    path = make_tiny_model("llama", tmp_path / "llama")

    def resolved(spec, **kwargs) -> bool:
        args = EngineArgs(model=str(path), device="cpu", speculative_config=spec, **kwargs)
        return args.create_engine_config().scheduler_config.async_scheduling

    with_threshold = {**ngram(2), "disable_by_batch_size": 8}
    assert resolved(with_threshold)
    assert resolved(with_threshold, async_scheduling=True)
    assert not resolved(with_threshold, async_scheduling=False)
    assert not resolved(ngram(2))
    assert resolved({**draft_model(path, 2), "disable_by_batch_size": 8})


def test_command_line_takes_the_key() -> None:
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(
        [
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 32}',
        ]
    )
    config = EngineArgs.from_cli_args(ns).speculative_config
    assert config["disable_by_batch_size"] == 32
