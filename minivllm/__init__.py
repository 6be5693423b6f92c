"""minivllm: a compact, complete, readable reimplementation of vLLM's inference engine.

The public API mirrors vLLM's offline one::

    from minivllm import LLM, SamplingParams
    llm = LLM(model="path/to/hf-folder")
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))

The names below are imported lazily, so ``import minivllm.core.block_pool`` (say, in a
notebook about the block pool) does not pull in the model code.
"""

from __future__ import annotations

import importlib
from typing import Any

from minivllm.logger import configure_root_logger

configure_root_logger()

_EXPORTS = {
    "LLM": "minivllm.llm",
    "SamplingParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "EngineArgs": "minivllm.engine.arg_utils",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
