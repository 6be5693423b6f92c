"""AsyncLLM over the engine core: streams equal the offline outputs, aborts free blocks,
and a failing or dead core fails every waiting request instead of hanging.

Most tests run the core in a thread (``multiprocess=False``: the same sockets and code,
no process start-up); the dead-process test starts a real core process and kills it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from minivllm import LLM
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.core import EngineCore
from minivllm.engine.exceptions import EngineDeadError
from minivllm.sampling_params import RequestOutputKind, SamplingParams

PROMPTS = ["once upon a time", "the quick brown fox", "in the beginning", "a b c d e f"]
ARGS = dict(dtype="float32", device="cpu", max_model_len=128, block_size=16)


@pytest.fixture
def engine(model_dir):
    eng = AsyncLLM.from_engine_args(EngineArgs(str(model_dir), **ARGS), multiprocess=False)
    yield eng
    eng.shutdown()


async def _collect(eng: AsyncLLM, prompt, params: SamplingParams, rid: str):
    outs = [out async for out in eng.generate(prompt, params, rid)]
    return outs


def _params(kind: RequestOutputKind, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0.0)
    return SamplingParams(output_kind=kind, **kw)


def test_streams_equal_offline_generate(engine: AsyncLLM, llm: LLM) -> None:
    expected = llm.generate(PROMPTS, _params(RequestOutputKind.FINAL_ONLY), use_tqdm=False)

    async def run():
        return await asyncio.gather(
            *(
                _collect(engine, p, _params(RequestOutputKind.DELTA), f"r{i}")
                for i, p in enumerate(PROMPTS)
            )
        )

    streams = asyncio.run(run())
    for outs, exp in zip(streams, expected):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        ids = [t for o in outs for t in o.outputs[0].token_ids]
        assert ids == exp.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outs) == exp.outputs[0].text
        assert outs[-1].outputs[0].finish_reason == exp.outputs[0].finish_reason
    # The requests were batched: fewer steps than if they had run one after another.
    assert engine.scheduler_stats.num_steps < sum(len(e.outputs[0].token_ids) for e in expected)


def test_a_stream_interval_streams_the_same_tokens_in_fewer_outputs(model_dir, llm: LLM) -> None:
    expected = llm.generate(PROMPTS, _params(RequestOutputKind.FINAL_ONLY), use_tqdm=False)
    args = EngineArgs(str(model_dir), stream_interval=4, **ARGS)
    eng = AsyncLLM.from_engine_args(args, multiprocess=False)

    async def run():
        return await asyncio.gather(
            *(
                _collect(eng, p, _params(RequestOutputKind.DELTA), f"s{i}")
                for i, p in enumerate(PROMPTS)
            )
        )

    try:
        streams = asyncio.run(run())
    finally:
        eng.shutdown()
    for outs, exp in zip(streams, expected):
        ids = [t for o in outs for t in o.outputs[0].token_ids]
        assert ids == exp.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outs) == exp.outputs[0].text
        # An output for the first token, then one per four more and one at the end (a
        # reader that lags gets two merged, so at most that many).
        assert len(outs) <= 1 + -(-(len(ids) - 1) // 4)
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])


def test_cumulative_final_only_and_n(engine: AsyncLLM) -> None:
    async def run():
        cum = await _collect(engine, PROMPTS[0], _params(RequestOutputKind.CUMULATIVE), "c")
        fin = await _collect(engine, PROMPTS[0], _params(RequestOutputKind.FINAL_ONLY), "f")
        two = await _collect(
            engine,
            PROMPTS[1],
            _params(RequestOutputKind.FINAL_ONLY, n=2, temperature=1.0, seed=3),
            "n",
        )
        return cum, fin, two

    cum, fin, two = asyncio.run(run())
    assert len(fin) == 1 and fin[0].outputs[0].token_ids == cum[-1].outputs[0].token_ids
    lengths = [len(o.outputs[0].token_ids) for o in cum]
    assert lengths == sorted(lengths) and lengths[-1] == 12
    assert len(two) == 1 and [c.index for c in two[0].outputs] == [0, 1]
    assert two[0].request_id == "n" and two[0].metrics.e2e_latency > 0


def test_leaving_a_stream_aborts_the_request_and_frees_its_blocks(engine: AsyncLLM) -> None:
    async def run():
        params = _params(RequestOutputKind.DELTA, max_tokens=100, ignore_eos=True)
        gen = engine.generate(PROMPTS[2], params, "leave")
        async for _ in gen:
            break
        await gen.aclose()
        for _ in range(50):  # the core publishes its stats right after the abort
            await asyncio.sleep(0.05)
            stats = engine.scheduler_stats
            if stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0:
                break
        return engine.scheduler_stats, engine.output_processor.has_unfinished_requests()

    stats, unfinished = asyncio.run(run())
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.kv_cache_usage == 0.0 and not unfinished


def test_bad_input_fails_alone_before_anything_is_queued(engine: AsyncLLM) -> None:
    async def run():
        with pytest.raises(ValueError, match="exceeds max_model_len=128"):
            await _collect(engine, {"prompt_token_ids": [1] * 200}, SamplingParams(), "long")
        with pytest.raises(ValueError, match=r"prompt_token_ids\[0\] must be an int"):
            await _collect(engine, {"prompt_token_ids": ["1"]}, SamplingParams(), "str")
        good = await _collect(engine, PROMPTS[0], _params(RequestOutputKind.FINAL_ONLY), "ok")
        return good

    assert asyncio.run(run())[-1].finished


def test_duplicate_request_ids_are_refused(engine: AsyncLLM) -> None:
    async def run():
        params = _params(RequestOutputKind.DELTA, max_tokens=50, ignore_eos=True)
        first = engine.generate(PROMPTS[0], params, "same")
        await first.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await _collect(engine, PROMPTS[1], params, "same")
        await first.aclose()

    asyncio.run(run())


def test_a_failing_core_fails_every_waiting_request(engine: AsyncLLM, monkeypatch) -> None:
    # Replacing _process_step whole raises outside the step's own error handling (which
    # fails only that step's requests: tests/engine/test_isolation*.py), as a bug in
    # the core would: the core dies and every waiting request gets EngineDeadError.
    def boom(self, *args):
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(EngineCore, "_process_step", boom)

    async def run():
        results = await asyncio.gather(
            *(
                _collect(engine, p, _params(RequestOutputKind.DELTA), f"e{i}")
                for i, p in enumerate(PROMPTS[:3])
            ),
            return_exceptions=True,
        )
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, EngineDeadError) for r in results)
    assert "injected step failure" in str(results[0])
    assert engine.errored
    with pytest.raises(EngineDeadError):
        asyncio.run(engine.check_health())


def test_a_killed_core_process_is_detected(model_dir) -> None:
    eng = AsyncLLM.from_engine_args(EngineArgs(str(model_dir), **ARGS), multiprocess=True)
    try:
        pid = eng.engine_core.pid
        assert pid is not None and pid != os.getpid()

        async def run():
            params = _params(RequestOutputKind.DELTA, max_tokens=100_000 // 1000, ignore_eos=True)
            gen = eng.generate(PROMPTS[0], params, "k")
            await gen.__anext__()
            os.kill(pid, signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(EngineDeadError):
                async for _ in gen:
                    pass
                # A request that finished before the kill landed: ask for another one.
                async for _ in eng.generate(PROMPTS[1], params, "k2"):
                    pass
            return time.monotonic() - start

        assert asyncio.run(run()) < 10.0
        assert eng.errored
    finally:
        eng.shutdown()
