"""Triton kernel that writes one step's keys and values into the paged KV cache.

Upstream counterpart: ``reshape_and_cache_kernel_flash`` in
``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`` (and its CUDA twin
``reshape_and_cache_flash_kernel`` in ``csrc/cache_kernels.cu``). The idea is a scatter:
token ``t`` goes to cache slot ``slot_mapping[t]``, which the scheduler chose when it
allocated blocks. A slot is a flat index over all blocks, so the kernel splits it into
``(block, offset)`` and copies every KV head of the token there. Negative slots mean
"padding, do not write" (CUDA-graph batches are padded to a captured size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.utils.math_utils import next_power_of_2


@triton.jit
def reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_k_tok: tl.int64,
    stride_k_head: tl.int64,
    stride_v_tok: tl.int64,
    stride_v_head: tl.int64,
    stride_c_block: tl.int64,
    stride_c_slot: tl.int64,
    stride_c_head: tl.int64,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """One program per token: copy its ``[num_kv_heads, head_size]`` K and V rows."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return  # a padding token: nothing to store
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    # Power-of-two tiles (Triton needs them) padded over the real head count and size.
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_SIZE)

    dst = block * stride_c_block + offset * stride_c_slot
    dst = dst + heads[:, None] * stride_c_head + dims[None, :]
    k = tl.load(key_ptr + token * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :],
                mask=mask)
    v = tl.load(value_ptr + token * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :],
                mask=mask)
    # The store casts to the cache's element type (e.g. float32 activations, bf16 cache).
    tl.store(key_cache_ptr + dst, k, mask=mask)
    tl.store(value_cache_ptr + dst, v, mask=mask)


def launch_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Launch :func:`reshape_and_cache_kernel` on already-validated tensors.

    ``key``/``value`` may be strided views (the engine slices them out of a fused qkv
    projection); only their last dimension must be contiguous. Both caches must share
    one layout, checked by the caller.
    """
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=key_cache.shape[1],
        HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_PAD=next_power_of_2(head_size),
    )
