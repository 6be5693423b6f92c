"""Who starts the engine, and the step's default token budget that follows from it and the GPU.

Upstream counterparts: ``UsageContext`` in ``vllm/usage/usage_lib.py`` and
``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``, which
``EngineArgs.create_engine_config(usage_context)`` reads when ``max_num_batched_tokens``
is not given. A bigger budget means fewer, larger steps: better throughput for a batch
job (the ``LLM`` class), longer gaps between one stream's tokens while a prompt is
prefilled beside them (a server). Which side wins depends on how quickly the device
gets through a large step, hence a table by usage and device.
"""

from __future__ import annotations

import enum

import torch

_GiB = 1 << 30


class UsageContext(str, enum.Enum):
    """Who builds the engine: the ``LLM`` class or the OpenAI-compatible server.

    Upstream has more members (``ENGINE_CONTEXT``, ``OPENAI_BATCH_RUNNER``, ...); minivllm
    keeps the two its entry points pass.
    """

    LLM_CLASS = "LLM_CLASS"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"


def get_batch_defaults(device_name: str | None, total_memory: int) -> dict[UsageContext, int]:
    """The default ``max_num_batched_tokens`` per usage, for a GPU or for none.

    Args:
        device_name: The GPU's name (``torch.cuda.get_device_name``), or None when the
            engine runs on the CPU.
        total_memory: The GPU's total memory in bytes (ignored without a GPU).

    The GPU rows are upstream's: a GPU with at least 70 GiB that is not an A100 (H100,
    H200, MI300x) gets through a step of 16,384 tokens fast enough that the ``LLM`` class
    should take it (fewer mixed prefill steps, each one bound by the GPU), and 8,192 for
    the server; every other GPU gets 8,192 and 2,048 (upstream measured that the larger
    budget slows an A100 down, vLLM PR #17885).

    The CPU row is minivllm's own: 8,192 for both usages. Upstream gives the CPU 4,096
    (``LLM``) and 2,048 (server), times the number of ranks, a tuning for its optimised
    CPU kernels that nobody has measured for minivllm's; a smaller budget only cuts the
    CPU's steps into more of them. minivllm's tests and CI run on the CPU, and every
    default they rely on was 8,192 before this table existed, so the CPU keeps it.
    """
    if device_name is None:
        return {UsageContext.LLM_CLASS: 8192, UsageContext.OPENAI_API_SERVER: 8192}
    if total_memory >= 70 * _GiB and "a100" not in device_name.lower():
        return {UsageContext.LLM_CLASS: 16384, UsageContext.OPENAI_API_SERVER: 8192}
    return {UsageContext.LLM_CLASS: 8192, UsageContext.OPENAI_API_SERVER: 2048}


def gpu_facts(device: torch.device) -> tuple[str | None, int]:
    """The name and total memory (bytes) of the GPU ``device`` names; (None, 0) off CUDA.

    Asked in the process that resolves the configuration (the server's front end too):
    its workers are spawned, never forked, so initialising CUDA here is safe.
    """
    if device.type != "cuda":
        return None, 0
    props = torch.cuda.get_device_properties(device)
    return props.name, props.total_memory


def default_max_num_batched_tokens(usage_context: UsageContext, device: torch.device) -> int:
    """The default step budget for ``usage_context`` on ``device`` (see ``get_batch_defaults``)."""
    return get_batch_defaults(*gpu_facts(device))[UsageContext(usage_context)]
