"""Async scheduling: one step in flight must change when work happens, never what comes out.

The engine schedules step N+1 before step N's tokens reach the host, so step N+1's input
tokens are placeholders filled in on the device, requests that stop in step N have one
wasted token in step N+1, and penalties wait for the previous step's tokens. Each test
runs the same requests with ``async_scheduling`` on and off and asks for identical
outputs, or checks one of those mechanisms directly.
"""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.arg_utils import EngineArgs
from minivllm.worker.async_spec import PrevStep

PROMPTS = [
    "the quick brown fox",
    "hello world, hello",
    "a",
    "one two three four five six",
    "to be or not to be",
]


def _llm(model_dir, async_scheduling: bool, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    kwargs.setdefault("device", "cpu")
    return LLM(str(model_dir), dtype="float32", async_scheduling=async_scheduling, **kwargs)


def _mixed_params(stop_token: int) -> list[SamplingParams]:
    """One request per feature whose correctness depends on the latest output token."""
    return [
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.9, top_p=0.8, top_k=20, seed=1, max_tokens=14, logprobs=3),
        SamplingParams(
            temperature=0.7,
            seed=2,
            max_tokens=16,
            presence_penalty=0.5,
            frequency_penalty=0.4,
            repetition_penalty=1.3,
        ),
        SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=10, min_tokens=6, stop=["e"]),
        # Greedy, so the penalties alone decide: a missed latest token shows at once.
        SamplingParams(temperature=0.0, max_tokens=16, frequency_penalty=2.0),
    ]


def _summary(outputs) -> list:
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs
    ]


# 12 blocks of 4 tokens hold 48 tokens: one request of max_model_len, but not the batch.
POOLS = {"roomy": {}, "preempting": dict(num_kv_blocks=12, block_size=4, max_model_len=48)}


@pytest.mark.parametrize(
    "pool, device",
    [("roomy", "cpu"), ("preempting", "cpu"), pytest.param("roomy", "cuda", marks=pytest.mark.gpu)],
)
def test_async_scheduling_gives_the_same_outputs_as_sync(model_dir, pool: str, device) -> None:
    # On a GPU with CUDA graphs: the placeholders are filled by a copy queued on the stream.
    pool_kwargs = dict(POOLS[pool])
    if device == "cuda":  # a fixed pool: two engines could not both take 90% of the GPU
        pool_kwargs.setdefault("num_kv_blocks", 64)
    sync = _llm(model_dir, False, max_num_batched_tokens=32, device=device, **pool_kwargs)
    greedy = sync.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=12))
    stop_token = greedy[0].outputs[0].token_ids[4]  # stops request 0 after 5 tokens
    params = _mixed_params(stop_token)
    expected = sync.generate(PROMPTS, params, use_tqdm=False)
    runner = _llm(model_dir, True, max_num_batched_tokens=32, device=device, **pool_kwargs)
    got = runner.generate(PROMPTS, params, use_tqdm=False)
    assert _summary(got) == _summary(expected)
    assert got[0].outputs[0].finish_reason == "stop"
    for g, e in zip(got[1].outputs[0].logprobs, expected[1].outputs[0].logprobs):
        assert g.keys() == e.keys()
        assert all(g[t].logprob == pytest.approx(e[t].logprob, abs=1e-4) for t in g)
    engine = runner.llm_engine
    assert engine.stats.num_generation_tokens == sum(
        len(c.token_ids) for o in got for c in o.outputs
    )
    if pool == "preempting":
        assert engine.stats.num_preemptions > 0, "the small pool was meant to preempt"
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_a_step_stays_in_flight_and_its_tokens_are_filled_on_the_device(
    model_dir, monkeypatch
) -> None:
    llm = _llm(model_dir, True)
    engine = llm.llm_engine
    fills: list[int] = []

    original = PrevStep.sources  # where each placeholder's token is read on the device

    def counting(prev, placeholders, *args):
        if placeholders:
            fills.append(len(placeholders))
        return original(prev, placeholders, *args)

    monkeypatch.setattr(PrevStep, "sources", counting)  # the engine runs in this process
    core = engine.engine_core.engine_core
    for prompt in PROMPTS[:2]:
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=6))
    assert engine.step() == []  # the prefill is queued, nothing has come back yet
    assert core._in_flight is not None
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
    assert core._in_flight is None  # drained once the last request finished
    # Every decode step after the first read its inputs from the step before.
    assert fills and all(n == 2 for n in fills)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6]


def test_abort_with_a_step_in_flight_leaves_nothing_behind(model_dir) -> None:
    llm = _llm(model_dir, True)
    engine = llm.llm_engine
    rid = engine.add_request("abc", SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    engine.step()
    core = engine.engine_core.engine_core
    assert core._in_flight is not None
    engine.abort_request([rid])
    assert core._in_flight is None and not engine.has_unfinished_requests()
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_async_scheduling_is_on_by_default_with_several_ranks(model_dir) -> None:
    args = EngineArgs(str(model_dir), device="cpu", tensor_parallel_size=2)
    assert args.create_engine_config().scheduler_config.async_scheduling
    args.async_scheduling = False
    assert not args.create_engine_config().scheduler_config.async_scheduling
