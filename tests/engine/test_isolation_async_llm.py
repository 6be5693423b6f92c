"""Isolation through ``AsyncLLM``: only the failed request's stream raises.

A model error (the poisoned checkpoint of ``test_isolation``, so it works in a real core
process, where no monkeypatch reaches) and an injected step exception (a core in a
thread, so the patch does reach it): the failed request's ``generate`` raises
``EngineGenerateError``; the streams beside it finish with their solo tokens; the
engine stays healthy, frees every block and serves the next request.
"""

from __future__ import annotations

import asyncio

import pytest

from minivllm import LLM
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.exceptions import EngineGenerateError
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.worker.model_runner import ModelRunner
from tests.engine.test_isolation import ARGS, BAD, GOOD, FailOnce, poisoned_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return poisoned_model(tmp_path_factory.mktemp("poisoned"))


@pytest.fixture(scope="module")
def solo(model_path) -> list[list[int]]:
    llm = LLM(str(model_path), **ARGS)
    params = _params(RequestOutputKind.FINAL_ONLY)
    outputs = [llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0] for p in GOOD]
    return [o.outputs[0].token_ids for o in outputs]


def _params(kind: RequestOutputKind) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, output_kind=kind)


async def _stream(engine: AsyncLLM, prompt: list[int], rid: str) -> list[int]:
    tokens = []
    async for out in engine.generate(
        {"prompt_token_ids": prompt}, _params(RequestOutputKind.DELTA), rid
    ):
        tokens += out.outputs[0].token_ids
    return tokens


async def _wait_for_free_pool(engine: AsyncLLM) -> None:
    for _ in range(100):  # the core publishes its stats with each step
        stats = engine.scheduler_stats
        if stats is not None and stats.kv_cache_usage == 0.0 and stats.num_running_reqs == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"blocks still held: {engine.scheduler_stats}")


def _check(results, solo, failed: set[int], match: str) -> None:
    for i, result in enumerate(results):
        if i in failed:
            assert isinstance(result, EngineGenerateError), result
            assert match in str(result)
        else:
            assert result == solo[i]


def test_nan_logits_fail_one_stream_in_a_core_process(model_path, solo) -> None:
    engine = AsyncLLM.from_engine_args(EngineArgs(str(model_path), **ARGS), multiprocess=True)
    try:

        async def run():
            prompts = [*GOOD[:2], BAD, *GOOD[2:]]
            results = await asyncio.gather(
                *(_stream(engine, p, f"r{i}") for i, p in enumerate(prompts)),
                return_exceptions=True,
            )
            await _wait_for_free_pool(engine)
            again = await _stream(engine, GOOD[0], "again")
            return results, again

        results, again = asyncio.run(run())
        _check(results, [*solo[:2], None, *solo[2:]], {2}, "request r2 failed")
        assert "not finite" in str(results[2])
        assert again == solo[0]
        assert not engine.errored
    finally:
        engine.shutdown()


def test_a_step_that_raises_fails_only_its_streams(model_path, solo, monkeypatch) -> None:
    engine = AsyncLLM.from_engine_args(
        EngineArgs(str(model_path), max_num_seqs=2, **ARGS), multiprocess=False
    )

    def schedules_the_second(runner, scheduler_output) -> bool:
        return any(s.request.prompt_token_ids == GOOD[1] for s in scheduler_output.scheduled)

    FailOnce(monkeypatch, ModelRunner, "execute_model_async", schedules_the_second)
    try:

        async def run():
            # Two slots: GOOD[0] and GOOD[1] run together (and fail together); GOOD[2]
            # and GOOD[3] wait for the slots and then run normally.
            results = await asyncio.gather(
                *(_stream(engine, p, f"s{i}") for i, p in enumerate(GOOD)),
                return_exceptions=True,
            )
            await _wait_for_free_pool(engine)
            return results

        results = asyncio.run(run())
        _check(results, solo, {0, 1}, "RuntimeError: injected step failure")
        assert not engine.errored
    finally:
        engine.shutdown()
