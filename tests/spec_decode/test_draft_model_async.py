"""Async scheduling with a draft model: step N+1 is scheduled while step N verifies, so
its input token and drafts are filled in on the device and its positions are shifted by
step N's rejections there. None of that may change what comes out.

Each test runs the same requests with async scheduling on and off (and speculation off)
and compares: greedy outputs with forced preemptions, chunked prefills and prefix hits;
seeded random sampling (``n > 1``, penalties, ``min_tokens``, logprobs) and the drafts'
statistics, which are equal only if every step verified as many drafts in both modes.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minivllm.core.scheduler as scheduler_module
from minivllm import LLM, SamplingParams
from minivllm.core.sched_async_spec import DRAFT_PLACEHOLDER
from minivllm.engine.arg_utils import EngineArgs
from minivllm.worker.cuda_graph import VERIFY
from tests.engine.test_llm_engine import _workload
from tests.spec_decode.test_draft_model import (
    MAX_MODEL_LEN,
    PREEMPTING,
    REPEATS,
    draft_model,
)


@pytest.fixture(scope="module")
def workload():
    prompts, max_tokens = _workload(seed=5, shared_prefix=True)
    prompts = [p[:40] for p in prompts] + REPEATS
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in [*max_tokens, 16, 16]]
    return prompts, params


def _llm(path, **kwargs) -> LLM:
    return LLM(str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, **kwargs)


def _run(llm: LLM, prompts, params) -> list[list[list[int]]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[c.token_ids for c in o.outputs] for o in outputs]


def _count_drafts_in_flight(llm: LLM) -> list[int]:
    """Wrap the scheduler: count the requests scheduled with drafts still on the device."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    schedule, counts = scheduler.schedule, [0]

    def counting():
        output = schedule()
        counts[0] += sum(s.spec_token_ids[:1] == [DRAFT_PLACEHOLDER] for s in output.scheduled)
        return output

    scheduler.schedule = counting
    return counts


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_async_equals_sync_equals_no_speculation(pair, workload, k: int) -> None:
    target, draft = pair
    prompts, params = workload
    reference = _run(_llm(target, **PREEMPTING), prompts, params)
    got = {}
    for async_scheduling in (False, True):
        llm = _llm(
            target,
            speculative_config=draft_model(draft, k),
            async_scheduling=async_scheduling,
            **PREEMPTING,
        )
        in_flight = _count_drafts_in_flight(llm)
        got[async_scheduling] = _run(llm, prompts, params)
        stats = llm.llm_engine.stats
        assert stats.num_preemptions > 0 and stats.prefix_cache_hit_rate > 0
        spec = stats.spec_decoding_stats
        assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens  # both branches ran
        # Async: most verification steps took their drafts from the device.
        assert (in_flight[0] > 10) == async_scheduling, in_flight
        kv = llm.llm_engine.engine_core.engine_core.kv_cache_manager
        assert kv.num_free_blocks == kv.num_blocks
    for i, expected in enumerate(reference):
        assert got[False][i] == expected, f"k={k}: sync, prompt {i} diverged"
        assert got[True][i] == expected, f"k={k}: async, prompt {i} diverged"


def _mixed_params() -> list[SamplingParams]:
    """Requests whose sampling reads what the step in flight produced."""
    return [
        SamplingParams(temperature=0.9, top_p=0.9, seed=1, max_tokens=14, logprobs=2),
        SamplingParams(
            temperature=0.8, seed=2, max_tokens=18, presence_penalty=0.4, repetition_penalty=1.2
        ),
        SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=12, min_tokens=9),
        # Greedy: the penalty alone decides, so a token missed from the step in flight
        # shows at once.
        SamplingParams(temperature=0.0, max_tokens=16, frequency_penalty=2.0),
        SamplingParams(temperature=0.0, max_tokens=5),  # ends while drafts are in flight
    ]


def test_seeded_sampling_and_draft_statistics_equal_async_and_sync(pair, monkeypatch) -> None:
    """No preemption here (a preemption happens at different steps in the two modes, and
    a request resumed by recompute verifies no drafts in its first step): then every
    request verifies the same drafts at every step, which the equal statistics show,
    and every seeded stream draws the same numbers."""
    target, draft = pair
    prompts = [[7, 8, 9, 10, 11] * 3, [42, 43] * 6, [5, 6, 7], [100, 101, 100, 101], [9] * 5]
    sat_out = []
    original = scheduler_module.num_drafts_in_flight

    def counting(*args):
        num = original(*args)
        sat_out.append(num is None)
        return num

    monkeypatch.setattr(scheduler_module, "num_drafts_in_flight", counting)
    runs = {}
    for async_scheduling in (False, True):
        llm = _llm(
            target, speculative_config=draft_model(draft, 3), async_scheduling=async_scheduling
        )
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], _mixed_params(), use_tqdm=False
        )
        stats = llm.llm_engine.stats
        assert stats.num_preemptions == 0
        runs[async_scheduling] = (outputs, stats.spec_decoding_stats)
    (sync, sync_stats), (got, got_stats) = runs[False], runs[True]
    for g, e in zip(got, sync, strict=True):
        assert [c.token_ids for c in g.outputs] == [c.token_ids for c in e.outputs]
        assert [c.finish_reason for c in g.outputs] == [c.finish_reason for c in e.outputs]
    for g, e in zip(got[0].outputs[0].logprobs, sync[0].outputs[0].logprobs, strict=True):
        assert g.keys() == e.keys()
    assert len(got[2].outputs[0].token_ids) >= 9  # min_tokens held across steps in flight
    assert got_stats == sync_stats and sync_stats.num_accepted_tokens > 0
    # Near max_tokens a request with drafts in flight waited for their result.
    assert any(sat_out) and not all(sat_out)


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 4))
def test_aborts_and_preemption_leak_no_block_with_drafts_in_flight(
    pair, workload, seed: int, k: int
) -> None:
    """Random arrivals and aborts over a pool that preempts, with async scheduling: a
    request aborted or preempted while its drafts are in flight gives every block back,
    and the finished requests get the tokens they get without speculation."""
    target, draft = pair
    prompts, params = workload
    params = [SamplingParams(temperature=0.0, max_tokens=p.max_tokens) for p in params]
    reference = [r[0] for r in _run(_llm(target, **PREEMPTING), prompts, params)]
    llm = _llm(target, speculative_config=draft_model(draft, k), **PREEMPTING)
    engine, rng = llm.llm_engine, random.Random(seed)
    core = engine.engine_core.engine_core
    assert core.async_scheduling
    order = rng.sample(range(len(prompts)), len(prompts))
    ids: dict[str, int] = {}
    finished: dict[str, list[int]] = {}
    aborted: set[str] = set()
    while order or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 2)):
            if order:
                i = order.pop()
                ids[engine.add_request({"prompt_token_ids": prompts[i]}, params[i])] = i
        running = [rid for rid in ids if rid not in finished and rid not in aborted]
        if running and rng.random() < 0.15:
            victim = rng.choice(running)
            engine.abort_request([victim])
            aborted.add(victim)
        for out in engine.step():
            if out.finished and out.request_id not in aborted:
                finished[out.request_id] = out.outputs[0].token_ids
    for rid, tokens in finished.items():
        assert tokens == reference[ids[rid]]
    assert core._in_flight is None
    kv = core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
    assert not core.scheduler.has_unfinished_requests()


def test_async_scheduling_defaults_on_with_a_draft_model_only(pair, caplog) -> None:
    target, draft = pair
    config = EngineArgs(str(target), device="cpu", speculative_config=draft_model(draft, 2))
    assert config.create_engine_config().scheduler_config.async_scheduling
    # Tensor parallelism with drafts stays synchronous, and says why.
    config.tensor_parallel_size = 2
    with caplog.at_level(logging.WARNING):
        assert not config.create_engine_config().scheduler_config.async_scheduling
    assert "tensor_parallel_size > 1" in caplog.text
    config.async_scheduling = True
    with pytest.raises(ValueError, match="async_scheduling=True"):
        config.create_engine_config()


def test_a_request_runs_to_max_model_len(pair) -> None:
    """Scheduled up to the last position, a request's catch-up pass has its spare slot at
    max_model_len, where the rotary table ends: it must run at the last position and
    write nothing, in both loops (the tiny models have 1024 positions)."""
    target, draft = pair
    prompt = [{"prompt_token_ids": [(7 * i) % 500 + 3 for i in range(1000)]}]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    runs = []
    for spec, async_scheduling in (
        (None, None),
        (draft_model(draft, 3), False),
        (draft_model(draft, 3), True),
    ):
        llm = LLM(
            str(target),
            dtype="float32",
            device="cpu",
            max_model_len=1024,
            speculative_config=spec,
            async_scheduling=async_scheduling,
        )
        out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        runs.append((out.token_ids, out.finish_reason))
    assert runs[0][1] == "length" and len(runs[0][0]) == 24
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_through_the_graph_layouts_on_cpu(pair, workload) -> None:
    """The target's verify graphs and the draft's graphs, emulated on the CPU (each
    replay runs the forward pass the graph records, over its static padded buffers),
    with async scheduling: positions, lengths and slots shifted on the device travel
    through the graphs' buffers, and the tokens equal speculation off."""
    from tests.spec_decode.test_draft_model import _emulate_draft_graphs
    from tests.worker.test_cuda_graph import _install_emulated_graphs

    target, draft = pair
    prompts, params = workload
    args = dict(max_num_seqs=8, max_num_batched_tokens=64)
    reference = _run(_llm(target, **args), prompts, params)
    llm = _llm(target, speculative_config=draft_model(draft, 3), **args)
    llm.collective_rpc(_install_emulated_graphs, args=(3,))
    llm.collective_rpc(_emulate_draft_graphs)
    in_flight = _count_drafts_in_flight(llm)
    assert _run(llm, prompts, params) == reference
    assert in_flight[0] > 10
    assert llm.collective_rpc(_replays)[0][VERIFY] > 0
    spec = llm.llm_engine.stats.spec_decoding_stats
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens


def _replays(runner) -> dict[str, int]:
    return dict(runner.cuda_graph_runner.num_replays)


@pytest.mark.gpu
def test_on_the_gpu_with_cuda_graphs() -> None:
    """On a GPU with CUDA graphs (verify graphs for the target, the draft's own): the demo
    model with its shipped draft gives the same greedy and seeded tokens, and the same
    statistics, with async scheduling on and off, and the greedy tokens of no speculation.
    float32, as test_draft_model's GPU test: a verification scores several tokens of a
    request in one pass, and bfloat16 may break a near-tie differently."""
    from minivllm.demo import demo_draft_path, demo_model_path

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are"]
    params = [SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)] * 3
    params.append(SamplingParams(temperature=0.8, seed=7, max_tokens=40, ignore_eos=True))
    args = dict(device="cuda", dtype="float32", max_model_len=256, num_kv_blocks=256)
    args.update(max_num_seqs=8, max_num_batched_tokens=256, enforce_eager=False)
    runs, stats = {}, {}
    for name, async_scheduling in (("off", None), ("sync", False), ("async", True)):
        spec = None if async_scheduling is None else draft_model(demo_draft_path(), 3)
        llm = LLM(
            str(demo_model_path()),
            speculative_config=spec,
            async_scheduling=async_scheduling,
            **args,
        )
        in_flight = _count_drafts_in_flight(llm)
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs[name] = [o.outputs[0].token_ids for o in outs]
        stats[name] = llm.llm_engine.stats.spec_decoding_stats
        assert (in_flight[0] > 0) == bool(async_scheduling), in_flight
        if spec is not None:  # the target's verification steps replayed verify graphs
            assert llm.collective_rpc(_replays)[0][VERIFY] > 0
        del llm
        torch.cuda.empty_cache()
    assert runs["async"] == runs["sync"]
    assert runs["async"][:3] == runs["off"][:3]
    assert stats["async"] == stats["sync"] and stats["sync"].num_accepted_tokens > 0
