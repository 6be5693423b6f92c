"""A request its client gives up on is counted as finished with reason ``abort``."""

from __future__ import annotations

import asyncio

from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams

ARGS = dict(dtype="float32", device="cpu", max_model_len=128, block_size=16)


class _Recorder:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def record(self, scheduler_stats, iteration_stats) -> None:
        if iteration_stats is not None:
            self.reasons += [f.finish_reason for f in iteration_stats.finished_requests]


def test_leaving_a_stream_records_an_abort(model_dir) -> None:
    recorder = _Recorder()
    engine = AsyncLLM.from_engine_args(
        EngineArgs(str(model_dir), **ARGS), stat_loggers=[recorder], multiprocess=False
    )

    async def run() -> None:
        done = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        async for _ in engine.generate("in the beginning", done, "finishes"):
            pass
        params = SamplingParams(
            max_tokens=100, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        gen = engine.generate("in the beginning", params, "leaves")
        async for _ in gen:
            break
        await gen.aclose()

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    assert recorder.reasons == ["length", "abort"]
