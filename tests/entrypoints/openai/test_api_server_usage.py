"""``minivllm serve`` resolves the server's token budget, and sends it to the core process.

The engine core is replaced by a recorder of the arguments it would be started with and
uvicorn's serve loop by a no-op, so ``run_server_async`` runs start to finish in a moment.
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn

from minivllm.engine import async_llm, usage
from minivllm.engine.arg_utils import EngineArgs
from minivllm.entrypoints.openai.api_server import run_server_async
from minivllm.entrypoints.openai.cli_args import make_arg_parser


class _RecordingCoreClient:
    """Stands in for ``AsyncMPClient``: keeps the dict the core process would get."""

    started_with: list[dict] = []

    def __init__(self, engine_args: dict, in_thread: bool = False) -> None:
        self.started_with.append(engine_args)
        self.num_kv_blocks = 64

    def shutdown(self) -> None:
        pass


async def _no_serve(self, *args, **kwargs) -> None:
    return None


def test_serve_sends_the_server_budget_to_the_core(model_dir, monkeypatch) -> None:
    # An A100: the LLM class would take 8192, the server takes 2048.
    monkeypatch.setattr(usage, "gpu_facts", lambda device: ("NVIDIA A100-SXM4-80GB", 80 << 30))
    monkeypatch.setattr(async_llm, "AsyncMPClient", _RecordingCoreClient)
    monkeypatch.setattr(uvicorn.Server, "serve", _no_serve)
    parser = make_arg_parser(argparse.ArgumentParser())
    EngineArgs.add_cli_args(parser)
    argv = ["--model", str(model_dir), "--device", "cpu", "--dtype", "float32"]
    args = parser.parse_args([*argv, "--max-model-len", "128"])
    _RecordingCoreClient.started_with.clear()
    asyncio.run(run_server_async(args))

    (sent,) = _RecordingCoreClient.started_with
    assert sent["max_num_batched_tokens"] == 2048
    # What the core process runs with that dict (core_proc.run_engine_core) agrees.
    core = EngineArgs(**sent).create_engine_config()
    assert core.scheduler_config.max_num_batched_tokens == 2048
