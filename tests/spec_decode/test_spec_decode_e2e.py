"""Speculative decoding end to end: n-gram drafts change how fast, never what comes out.

Greedy outputs with speculation on (k = 1..5) must equal the outputs with it off, token
for token, on the engine-vs-Hugging-Face workload of tests/engine/test_llm_engine.py
plus prompts that repeat themselves (so that drafts are found and accepted), with a KV
pool small enough to force preemptions and prefix caching on. The stop rules must cut
an accepted run exactly where token-by-token decoding stops.
"""

from __future__ import annotations

import logging

import pytest

from minivllm import LLM, SamplingParams
from minivllm.cli import format_engine_summary
from tests.engine.test_llm_engine import _workload
from tests.tiny_models import make_tiny_model

MAX_MODEL_LEN = 128
# Prompts that repeat a phrase: the n-gram proposer finds the phrase and drafts it.
REPEATS = [[7, 8, 9, 10, 11] * 6, [300, 301, 302] * 9 + [300], [42, 43] * 10]
# A pool of 18 blocks of 8 holds one request of max_model_len, far from the batch: it
# forces preemptions. A budget of 32 tokens chunks the prefills.
PREEMPTING = dict(block_size=8, num_kv_blocks=MAX_MODEL_LEN // 8 + 2, max_num_batched_tokens=32)


def ngram(k: int) -> dict:
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))
    # The engine-vs-HF prompts cut to 40 tokens (the long ones still share a prefix).
    prompts, max_tokens = _workload(seed=3, shared_prefix=True)
    prompts = [p[:40] for p in prompts] + REPEATS
    max_tokens = [*max_tokens, 24, 24, 24]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    reference = _generate(path, prompts, params)
    return path, prompts, params, reference


def _generate(path, prompts, params, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, **kwargs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    _generate.last_llm, _generate.last_outputs = llm, outputs  # the tests read their stats
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_outputs_equal_without_speculation(case, k: int) -> None:
    path, prompts, params, reference = case
    got = _generate(path, prompts, params, speculative_config=ngram(k), **PREEMPTING)
    for i, (g, e) in enumerate(zip(got, reference, strict=True)):
        assert g == e, f"k={k}: prompt {i} diverged"
    llm = _generate.last_llm
    core = llm.llm_engine.engine_core.engine_core
    stats = llm.llm_engine.stats
    assert stats.num_preemptions > 0, "the tiny pool was meant to force preemptions"
    assert stats.prefix_cache_hit_rate > 0
    spec = stats.spec_decoding_stats
    assert spec is not None and spec.num_spec_tokens == k
    # Both branches ran: drafts were accepted, and drafts were rejected.
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    # Each request's metrics count its own drafts; together they are the engine's.
    metrics = [o.metrics for o in _generate.last_outputs]
    assert sum(m.num_draft_tokens for m in metrics) == spec.num_draft_tokens
    assert sum(m.num_accepted_tokens for m in metrics) == spec.num_accepted_tokens
    summary = format_engine_summary(llm.llm_engine)
    assert f"{spec.num_accepted_tokens} accepted / {spec.num_draft_tokens} proposed" in summary
    manager = core.kv_cache_manager
    assert manager.num_free_blocks == manager.num_blocks


def _summary(outputs) -> list:
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs
    ]


TEXT_PROMPTS = ["the the the the the", "hello world, hello world, hello", "a b a b a b a"]


def test_stop_rules_cut_an_accepted_run_exactly(model_dir) -> None:
    """EOS, stop strings, stop token ids and max_tokens inside a run of accepted drafts
    end the output exactly where decoding one token at a time ends it."""
    base = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=128)
    spec = LLM(
        str(model_dir),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        speculative_config=ngram(4),
    )
    free = base.generate(TEXT_PROMPTS, SamplingParams(temperature=0.0, max_tokens=24))
    prompts, params = [], []
    for prompt, out in zip(TEXT_PROMPTS, free, strict=True):
        tokens, text = out.outputs[0].token_ids, out.outputs[0].text
        mid = len(tokens) // 2
        prompts += [prompt] * 4
        params += [
            SamplingParams(temperature=0.0, max_tokens=24),
            SamplingParams(temperature=0.0, max_tokens=24, stop=[text[len(text) // 2 :][:3]]),
            SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[tokens[mid]]),
            SamplingParams(temperature=0.0, max_tokens=mid + 1),
        ]
    expected = _summary(base.generate(prompts, params, use_tqdm=False))
    assert _summary(spec.generate(prompts, params, use_tqdm=False)) == expected
    assert spec.llm_engine.stats.spec_decoding_stats.num_accepted_tokens > 0


def test_requests_with_logprobs_are_speculated(model_dir, llm) -> None:
    """A request that wants logprobs is speculated like any other: each step returns a
    logprobs row for every token it keeps (the accepted drafts, scored by the rows that
    verified them, and the one after), equal within float tolerance to the logprobs
    without speculation; a max_tokens or a stop token inside an accepted run cuts the
    logprobs where it cuts the tokens."""
    spec = LLM(
        str(model_dir),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        speculative_config=ngram(3),
    )
    prompts = [TEXT_PROMPTS[1], TEXT_PROMPTS[1], TEXT_PROMPTS[2]]  # they repeat themselves
    free = llm.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=24))
    stop_token = free[0].outputs[0].token_ids[9]
    params = [
        SamplingParams(temperature=0.0, max_tokens=13, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=24, logprobs=0, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.0, max_tokens=24, logprobs=3),
    ]
    got = spec.generate(prompts, params, use_tqdm=False)
    expected = llm.generate(prompts, params, use_tqdm=False)
    assert _summary(got) == _summary(expected)
    for out, ref_out in zip(got, expected, strict=True):
        mine, reference = out.outputs[0], ref_out.outputs[0]
        assert len(mine.logprobs) == len(mine.token_ids)
        for position, ref in zip(mine.logprobs, reference.logprobs, strict=True):
            assert position.keys() == ref.keys()
            for token, entry in position.items():
                assert entry.logprob == pytest.approx(ref[token].logprob, abs=1e-4)
                assert entry.rank == ref[token].rank
        assert mine.cumulative_logprob == pytest.approx(reference.cumulative_logprob, abs=1e-3)
    # Requests with logprobs were speculated, and steps kept several tokens (several rows).
    assert got[0].metrics.num_accepted_tokens > 0 and got[2].metrics.num_draft_tokens > 0


@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 2, "lookup_max": 3}, "unknown key"),
        (
            {"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min=4 must be <= prompt_lookup_max=2",
        ),
        ("ngram", "must be a dict"),
    ],
)
def test_bad_speculative_config_is_refused_before_anything_loads(
    tmp_path, config, message: str
) -> None:
    from minivllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(tmp_path / "missing"), speculative_config=config)
    with pytest.raises(ValueError, match=message):
        args.create_engine_config()  # the model folder does not even exist


def test_speculation_turns_async_scheduling_off(tmp_path, caplog) -> None:
    from minivllm.engine.arg_utils import EngineArgs

    path = make_tiny_model("llama", tmp_path / "llama")
    with caplog.at_level(logging.WARNING):
        config = EngineArgs(model=str(path), device="cpu", speculative_config=ngram(2))
        config = config.create_engine_config()
    assert not config.scheduler_config.async_scheduling
    # Upstream's warning, and why.
    assert "Async scheduling not supported with ngram-based speculative decoding" in caplog.text
    assert "proposed from the tokens step N returns" in caplog.text
    assert config.speculative_config.prompt_lookup_max == 3
    with pytest.raises(ValueError, match="async_scheduling=True"):
        EngineArgs(
            model=str(path), device="cpu", speculative_config=ngram(2), async_scheduling=True
        ).create_engine_config()


def test_command_line_takes_the_config_as_json() -> None:
    import argparse

    from minivllm.engine.arg_utils import EngineArgs

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    )
    assert EngineArgs.from_cli_args(ns).speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", "[1, 2]"])


def test_engine_core_process_speculates_too(model_dir, llm) -> None:
    """The server's path: AsyncLLM with the engine core in its own process gets the
    config across and streams exactly the offline greedy tokens, with their logprobs
    (several rows per step cross the process boundary)."""
    import asyncio

    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.sampling_params import RequestOutputKind

    # The tiny tokenizer is trained on minivllm's own source, so which prompt repeats in
    # token space changes with the source: stream the one whose drafts were accepted most.
    offline = LLM(
        str(model_dir), dtype="float32", device="cpu", max_model_len=128,
        speculative_config=ngram(3),
    )  # fmt: skip
    runs = offline.generate(
        TEXT_PROMPTS, SamplingParams(temperature=0.0, max_tokens=30), use_tqdm=False
    )
    prompt = max(zip(TEXT_PROMPTS, runs), key=lambda r: r[1].metrics.num_accepted_tokens)[0]
    args = EngineArgs(
        str(model_dir), dtype="float32", device="cpu", max_model_len=128,
        speculative_config=ngram(3),
    )  # fmt: skip
    engine = AsyncLLM.from_engine_args(args, multiprocess=True)
    params = SamplingParams(
        temperature=0.0, max_tokens=30, logprobs=1, output_kind=RequestOutputKind.DELTA
    )

    async def stream() -> tuple[list[int], list, int]:
        tokens, logprobs, steps = [], [], 0
        async for out in engine.generate(prompt, params, "r"):
            tokens.extend(out.outputs[0].token_ids)
            logprobs.extend(out.outputs[0].logprobs or [])
            steps += 1
        return tokens, logprobs, steps

    try:
        streamed, logprobs, steps = asyncio.run(stream())
    finally:
        engine.shutdown()
    greedy = SamplingParams(temperature=0.0, max_tokens=30, logprobs=1)
    expected = llm.generate(prompt, greedy)[0].outputs[0]
    assert streamed == expected.token_ids
    assert steps < len(streamed)  # some steps kept several tokens
    assert [p.keys() for p in logprobs] == [p.keys() for p in expected.logprobs]
    for position, ref in zip(logprobs, expected.logprobs, strict=True):
        for token, entry in position.items():
            assert entry.logprob == pytest.approx(ref[token].logprob, abs=1e-4)


def test_each_child_of_n_greater_than_one_speculates_on_its_own(model_dir) -> None:
    """n = 3 with speculation: every child gets drafts from its own tokens and its own
    seeded generator, so child ``i`` is exactly the same request sent alone with seed
    ``seed + i``; the children differ from one another."""
    spec = LLM(
        str(model_dir), dtype="float32", device="cpu", max_model_len=128,
        speculative_config=ngram(3),
    )  # fmt: skip
    params = SamplingParams(temperature=0.8, n=3, seed=11, max_tokens=24)
    together = spec.generate(TEXT_PROMPTS[1:], params, use_tqdm=False)
    drafts = spec.llm_engine.stats.spec_decoding_stats.num_drafts
    assert drafts > 0
    for prompt, out in zip(TEXT_PROMPTS[1:], together, strict=True):
        children = [c.token_ids for c in out.outputs]
        assert len(children) == 3 and len({tuple(c) for c in children}) > 1
        for i, child in enumerate(children):
            alone = SamplingParams(temperature=0.8, seed=11 + i, max_tokens=24)
            assert spec.generate(prompt, alone, use_tqdm=False)[0].outputs[0].token_ids == child
