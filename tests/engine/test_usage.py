"""The default token budget by usage context and device, and where it is resolved.

The GPU's facts are injected (``usage.gpu_facts`` replaced), so the whole table is
checked on the CPU, through ``get_batch_defaults`` and through ``create_engine_config``.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from minivllm.engine import core_proc, usage
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.usage import UsageContext, get_batch_defaults
from minivllm.sampling_params import SamplingParams

GiB = 1 << 30
LLM, SERVER = UsageContext.LLM_CLASS, UsageContext.OPENAI_API_SERVER
H200 = ("NVIDIA H200", 141 * GiB)
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GiB)
ARGS = dict(dtype="float32", device="cpu", max_model_len=128, block_size=16)


@pytest.mark.parametrize(
    "name, memory, llm_class, server",
    [
        ("NVIDIA H200", 141 * GiB, 16384, 8192),
        ("NVIDIA H100 80GB HBM3", 80 * GiB, 16384, 8192),
        ("AMD Instinct MI300X", 192 * GiB, 16384, 8192),
        ("big enough", 70 * GiB, 16384, 8192),  # the threshold itself counts as large
        ("NVIDIA A100-SXM4-80GB", 80 * GiB, 8192, 2048),  # large, but upstream's exception
        ("NVIDIA L4", 23 * GiB, 8192, 2048),
        ("just below", 70 * GiB - 1, 8192, 2048),
        (None, 0, 8192, 8192),  # no GPU: the CPU keeps 8192 for both
    ],
)
def test_batch_defaults_table(name, memory, llm_class, server) -> None:
    assert get_batch_defaults(name, memory) == {LLM: llm_class, SERVER: server}


def test_no_gpu_facts_off_cuda() -> None:
    assert usage.gpu_facts(torch.device("cpu")) == (None, 0)


def _on_gpu(monkeypatch, facts: tuple[str, int]) -> None:
    """Pretend the engine's device is this GPU (the rest of the config stays on the CPU)."""
    monkeypatch.setattr(usage, "gpu_facts", lambda device: facts)


def _budget(model_dir, *usage_context: UsageContext, **kwargs) -> int:
    args = EngineArgs(str(model_dir), **{**ARGS, **kwargs})
    return args.create_engine_config(*usage_context).scheduler_config.max_num_batched_tokens


def test_create_engine_config_follows_the_usage_and_the_gpu(model_dir, monkeypatch) -> None:
    assert _budget(model_dir) == _budget(model_dir, LLM) == _budget(model_dir, SERVER) == 8192
    _on_gpu(monkeypatch, H200)
    assert _budget(model_dir) == _budget(model_dir, LLM) == 16384  # LLM_CLASS by default
    assert _budget(model_dir, SERVER) == 8192
    _on_gpu(monkeypatch, A100)
    assert (_budget(model_dir, LLM), _budget(model_dir, SERVER)) == (8192, 2048)


def test_an_explicit_budget_wins(model_dir, monkeypatch) -> None:
    _on_gpu(monkeypatch, H200)
    for context in (LLM, SERVER):
        assert _budget(model_dir, context, max_num_batched_tokens=100) == 100


def test_chunked_prefill_off_still_raises_the_budget_to_max_model_len(
    tmp_path, monkeypatch
) -> None:
    from tests.tiny_models import make_tiny_model

    long_model = make_tiny_model("llama", tmp_path / "long", max_position_embeddings=4096)
    _on_gpu(monkeypatch, A100)
    off = dict(enable_chunked_prefill=False, max_model_len=4096)
    assert _budget(long_model, SERVER, **off) == 4096  # the default, 2048, is too small
    assert _budget(long_model, SERVER, max_num_batched_tokens=64, **off) == 4096
    assert _budget(long_model, LLM, **off) == 8192  # already above max_model_len
    assert _budget(long_model, SERVER, max_model_len=4096) == 2048  # chunked: unchanged


def test_async_llm_and_its_core_resolve_the_server_budget(model_dir, monkeypatch) -> None:
    """The core rebuilds its config from the engine arguments; it must get the front end's
    budget (the server's), not the LLM class's default it would pick on its own."""
    _on_gpu(monkeypatch, A100)  # the two usages differ here: 8192 vs 2048
    core_budgets = []
    real_core = core_proc.EngineCoreProc

    def recording_core(config, *args):
        core_budgets.append(config.scheduler_config.max_num_batched_tokens)
        return real_core(config, *args)

    monkeypatch.setattr(core_proc, "EngineCoreProc", recording_core)
    engine = AsyncLLM.from_engine_args(EngineArgs(str(model_dir), **ARGS), multiprocess=False)
    try:

        async def run() -> list:
            params = SamplingParams(max_tokens=3, temperature=0.0)
            return [out async for out in engine.generate("once upon a time", params, "r")]

        assert asyncio.run(run())[-1].finished
    finally:
        engine.shutdown()
    assert engine.vllm_config.scheduler_config.max_num_batched_tokens == 2048
    assert core_budgets == [2048]
