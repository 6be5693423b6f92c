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
heuristics can choose, the linear layers' small-M kernel for each layer shape, the fused
gate/up + SiLU-and-mul kernel for each of its tile configurations, the
sampler's one-pass kernel, and the LM head at every row count a step samples (cuBLAS,
not Triton: nothing compiles, but the first GEMM of a new shape costs milliseconds). The
other layer kernels have one variant each, compiled by the first forward pass or graph
capture, except Qwen3's fused q/k norm + RoPE kernel, which has two: the memory-profiling
pass (no cache yet) compiles the one without the cache write, and this warm-up the one
with it (graph capture would too, but with ``enforce_eager`` nothing is captured, and the
first step compiled it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)


def kernel_warmup(runner: Any) -> None:
    """Compile the attention kernel variants ``runner``'s model can launch and the
    linear layers' small-M kernels, and run the LM head at every sampled row count (on a
    GPU only: the interpreter and the torch backend compile nothing, and a CPU GEMM has no
    first-use cost)."""
    if runner.device.type == "cuda":
        from minivllm.model_executor.layers.norm_linear import warm_up_norm_gemv
        from minivllm.model_executor.layers.utils import (
            warm_up_gate_up_silu,
            warm_up_small_m_kernels,
        )

        with torch.inference_mode():
            warm_up_small_m_kernels(runner.model)
            warm_up_norm_gemv(runner.model)  # the norm + projection kernel of decode
            _warm_up_sampler(runner)
            warm_up_logits(runner)
            for model in _models(runner):
                warm_up_kv_cache_write(model)
                warm_up_gate_up_silu(model)  # gate_up_proj + SiLU-and-mul of decode
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


def _models(runner: Any) -> list[torch.nn.Module]:
    """The runner's model and, with speculative decoding, its draft model."""
    drafter = getattr(runner, "drafter", None)
    return [runner.model] + ([drafter.model] if drafter is not None else [])


def warm_up_kv_cache_write(model: torch.nn.Module) -> int:
    """Launch the q/k norm + RoPE op of ``model``'s first Qwen3-style attention layer once
    with a cache write to the padding slot (-1: nothing is stored), so the kernel's
    cache-writing variant compiles now. Its inputs are laid out as a step's: column
    slices of one qkv row, the layer's own cache pair, int64 positions and slots, so the
    launch has the same specialization. One layer is enough: every layer of a model has
    the same shapes. Returns the number of launches (0 for models without the fused op,
    before the cache is bound, or with a backend that writes its own cache)."""
    from minivllm.attention.layer import KVCacheUpdate

    for module in model.modules():
        fused = getattr(module, "qk_norm_rotary", None)
        if fused is None:
            continue
        attn = module.attn
        if not attn.can_fuse_kv_cache_write():
            return 0
        weight = module.q_norm.weight
        qkv = torch.zeros(1, module.q_size + 2 * module.kv_size, dtype=weight.dtype,
                          device=weight.device)  # fmt: skip
        q, k, v = qkv.split([module.q_size, module.kv_size, module.kv_size], dim=-1)
        positions = torch.zeros(1, dtype=torch.long, device=weight.device)
        slots = torch.full((1,), -1, dtype=torch.long, device=weight.device)
        with torch.inference_mode():
            fused(positions, q, k, weight, module.k_norm.weight, v,
                  KVCacheUpdate(*attn.kv_cache, slots))  # fmt: skip
        return 1
    return 0


def warm_up_logits(runner: Any) -> int:
    """Run the LM head once for every row count a step can sample (1 to
    ``max_num_seqs``, times ``1 + k`` with ``k`` drafts to verify); returns how many.

    The LM head runs eagerly after each step's graph, on as many rows as the step samples,
    and cuBLAS picks its kernel per shape: in a fresh process the first GEMM of a new row
    count cost a few milliseconds on the H200 (cuBLAS settling on another kernel), at
    about one count in eight, and nothing the second time
    (``docs/benchmarks/perf7/gemm_first_use.log``). A throughput run's batch shrinks
    through every count as requests finish, so its first run paid each of those at the
    step that first met the count.
    """
    config = runner.model_config
    rows = _max_sampled_rows(runner)
    hidden = torch.zeros(rows, config.hf_config.hidden_size, dtype=config.dtype,
                         device=runner.device)  # fmt: skip
    for n in range(1, rows + 1):
        runner.model.compute_logits(hidden[:n])
    return rows


def _warm_up_sampler(runner: Any) -> None:
    """The one-pass sampling kernel (``sample/gumbel.py``): one variant per model and key
    mode (per-row keys, one batch key), set by its logits' dtype and width, so one row of
    real logits compiles them; and its workspace, sized for the most rows a step samples
    (as ``warm_up_logits`` counts them), so no step allocates it."""
    from minivllm.sample.gumbel import gumbel_sample, reserve_workspace

    config = runner.model_config
    hidden = torch.zeros(1, config.hf_config.hidden_size, dtype=config.dtype, device=runner.device)
    logits = runner.model.compute_logits(hidden)  # the layout the sampler gets (all ranks)
    zeros = torch.zeros(1, dtype=torch.int64, device=runner.device)
    temperature = torch.ones(1, device=runner.device)
    gumbel_sample(logits, temperature, zeros, zeros)
    gumbel_sample(logits, temperature, 0, None)
    reserve_workspace(runner.device, _max_sampled_rows(runner), logits.shape[-1])


def _max_sampled_rows(runner: Any) -> int:
    """The most logits rows one step can sample: ``max_num_seqs``, times ``1 + k`` with
    ``k`` drafts to verify."""
    spec = runner.vllm_config.speculative_config
    k = spec.num_speculative_tokens if spec else 0
    return runner.scheduler_config.max_num_seqs * (1 + k)


def _num_heads(runner: Any) -> int:
    """Query heads per layer on this rank, read from the model's first Attention layer."""
    from minivllm.worker.kv_cache import attention_layers

    return attention_layers(runner.model)[0].num_heads
