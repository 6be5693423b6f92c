"""Compile every kernel variant while the engine starts, never in the middle of a run.

Upstream counterparts: ``vllm/model_executor/warmup/kernel_warmup.py`` (``kernel_warmup``)
and ``Worker.compile_or_warm_up_model`` in ``vllm/v1/worker/gpu_worker.py``, which run
dummy batches of every size the engine will meet before it reports ready.

Triton compiles a kernel the first time it is launched with a new *specialization*: a
new value of any ``tl.constexpr`` (tile sizes, the split-KV segment count), and a
pointer or integer argument that changes between "divisible by 16" and not. A variant
first met during a user's run costs a second or more of compilation right then (half the
throughput of a whole benchmark run, measured on the H200). minivllm removes both
causes: the host-to-device copies keep every tensor 16-byte aligned (see
``copy_to_device``), and this warm-up launches each attention configuration the
heuristics can choose, the linear layers' small-M kernel for each layer shape, and the
sampler's one-pass kernel. The other layer kernels have one variant each, compiled by the
first forward pass or graph capture, except Qwen3's fused q/k norm + RoPE kernel, which has
two: the memory-profiling pass (no cache yet) compiles the one without the cache write and
graph capture the one with it; with ``enforce_eager`` the writing variant compiles at the
first step, as the separate cache-write kernel it replaces did.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)


def kernel_warmup(runner: Any) -> None:
    """Compile the attention kernel variants ``runner``'s model can launch, and the
    linear layers' small-M kernels (Triton on a GPU only: the interpreter and the torch
    backend compile nothing)."""
    if runner.device.type == "cuda":
        from minivllm.model_executor.layers.norm_linear import warm_up_norm_gemv
        from minivllm.model_executor.layers.utils import warm_up_small_m_kernels

        with torch.inference_mode():
            warm_up_small_m_kernels(runner.model)
            warm_up_norm_gemv(runner.model)  # the norm + projection kernel of decode
            _warm_up_sampler(runner)
    if runner.attn_backend.name != "triton" or runner.device.type != "cuda":
        return
    from minivllm.attention.backends.triton_attn import warm_up_attention

    num_heads = _num_heads(runner)
    key_cache, value_cache = runner.kv_caches[0]
    start = time.perf_counter()
    count = warm_up_attention(key_cache, value_cache, num_heads, runner.model_config.max_model_len)
    if getattr(runner, "drafter", None) is not None:
        # A draft model's head counts and head size make variants of their own.
        from minivllm.worker.kv_cache import attention_layers

        key_cache, value_cache = runner.draft_kv_caches[0]
        num_heads = attention_layers(runner.drafter.model)[0].num_heads
        max_len = runner.model_config.max_model_len
        count += warm_up_attention(key_cache, value_cache, num_heads, max_len)
    torch.cuda.synchronize(runner.device)
    logger.info(
        "compiled %d attention kernel variants in %.1f s", count, time.perf_counter() - start
    )


def _warm_up_sampler(runner: Any) -> None:
    """The one-pass sampling kernels (``sample/gumbel.py``): one variant per model, set by
    its logits' dtype and width, so one row of real logits compiles them."""
    from minivllm.sample.gumbel import gumbel_sample

    config = runner.model_config
    hidden = torch.zeros(1, config.hf_config.hidden_size, dtype=config.dtype, device=runner.device)
    logits = runner.model.compute_logits(hidden)  # the layout the sampler gets (all ranks)
    zeros = torch.zeros(1, dtype=torch.int64, device=runner.device)
    gumbel_sample(logits, torch.ones(1, device=runner.device), zeros, zeros)


def _num_heads(runner: Any) -> int:
    """Query heads per layer on this rank, read from the model's first Attention layer."""
    from minivllm.worker.kv_cache import attention_layers

    return attention_layers(runner.model)[0].num_heads
