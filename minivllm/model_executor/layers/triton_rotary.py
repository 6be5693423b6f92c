"""Neox-style rotary embedding of q and k, in place, in one Triton launch.

Upstream counterpart: ``csrc/libtorch_stable/pos_encoding_kernels.cu``
(``rotary_embedding``), called from ``RotaryEmbedding.forward_cuda`` in
``vllm/model_executor/layers/rotary_embedding/base.py``. Same contract: ``query``
``[T, Hq * D]`` and ``key`` ``[T, Hk * D]`` are rotated in place by the angles of
``positions[t]``, read from a ``[max_position, D]`` cache that holds cos then sin.

One program handles one token: it gathers that token's cos/sin row once and rotates
all query heads and then all key heads with it, as a ``[heads, D/2]`` tile. q and k are
usually column slices of the fused qkv projection output, so rows are addressed by a
row stride and nothing is copied.

Rounding follows ``RotaryEmbedding.forward_native``, which computes in the model dtype:
cos/sin are cast to the query's dtype, and each product and the final sum are rounded
to it. In bfloat16 that makes the kernel agree with torch (and Hugging Face) bit for bit
up to fused multiply-adds, instead of being "more exact" and different.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.utils.math_utils import next_power_of_2
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit
def _rotate_heads(
    base_ptr,
    num_heads,
    cos,
    sin,
    HEAD_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotate ``num_heads`` heads laid out back to back at ``base_ptr`` (one token)."""
    half: tl.constexpr = HEAD_SIZE // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (cols < half)
    first = base_ptr + heads * HEAD_SIZE + cols  # x_i; its partner x_{i + D/2} is `+ half`
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    dtype = base_ptr.dtype.element_ty
    # Round each product to the model dtype, as the torch code's separate ops do.
    x1c = (x1 * cos).to(dtype).to(tl.float32)
    x2s = (x2 * sin).to(dtype).to(tl.float32)
    x2c = (x2 * cos).to(dtype).to(tl.float32)
    x1s = (x1 * sin).to(dtype).to(tl.float32)
    tl.store(first, (x1c - x2s).to(dtype), mask=mask)
    tl.store(first + half, (x2c + x1s).to(dtype), mask=mask)


@triton.jit
def rotary_embedding_kernel(
    positions_ptr,
    query_ptr,
    key_ptr,
    cos_sin_cache_ptr,
    query_stride,
    key_stride,
    cache_stride,
    num_q_heads,
    num_k_heads,
    HEAD_SIZE: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Token ``program_id(0)``: rotate its query heads and key heads by its position."""
    token = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = HEAD_SIZE // 2
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    cache_row = cos_sin_cache_ptr + pos * cache_stride
    dtype = query_ptr.dtype.element_ty
    # [1, D/2] angles, cast to the activations' dtype like forward_native's `.to(query.dtype)`.
    cos = tl.load(cache_row + cols, mask=cols < half, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(cache_row + half + cols, mask=cols < half, other=0.0)
    sin = sin.to(dtype).to(tl.float32)
    _rotate_heads(query_ptr + token * query_stride, num_q_heads, cos, sin,
                  HEAD_SIZE, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(key_ptr + token * key_stride, num_k_heads, cos, sin,
                  HEAD_SIZE, BLOCK_HK, BLOCK_HALF)


def _rotary_embedding_impl(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           head_size: int, cos_sin_cache: torch.Tensor) -> None:
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    num_q_heads = query.shape[1] // head_size
    num_k_heads = key.shape[1] // head_size
    rotary_embedding_kernel[(num_tokens,)](
        positions,
        query,
        key,
        cos_sin_cache,
        query.stride(0),
        key.stride(0),
        cos_sin_cache.stride(0),
        num_q_heads,
        num_k_heads,
        HEAD_SIZE=head_size,
        BLOCK_HQ=next_power_of_2(num_q_heads),
        BLOCK_HK=next_power_of_2(num_k_heads),
        BLOCK_HALF=next_power_of_2(head_size // 2),
        num_warps=4,
    )


direct_register_custom_op(
    "rotary_embedding",
    "(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
    "Tensor cos_sin_cache) -> ()",
    _rotary_embedding_impl,
    fake_noop,
)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[T, Hq * D]`` and ``key`` ``[T, Hk * D]`` in place; return them.

    Rows may be strided (slices of a wider tensor) but each row must be contiguous.
    Positions are not range-checked (that would need a device sync); they must be below
    ``cos_sin_cache.shape[0]``.
    """
    num_tokens = positions.shape[0]
    for name, t in (("query", query), ("key", key)):
        if t.dim() != 2 or t.shape[0] != num_tokens or t.shape[1] % head_size or (
            t.stride(1) != 1
        ):
            raise ValueError(
                f"{name} must be [{num_tokens}, heads * {head_size}] with contiguous rows, "
                f"got shape {tuple(t.shape)} strides {tuple(t.stride())}"
            )
    if key.dtype != query.dtype:
        raise ValueError(f"key dtype {key.dtype} must match query dtype {query.dtype}")
    if positions.dim() != 1 or positions.is_floating_point():
        raise ValueError(f"positions must be a 1-D integer tensor, got "
                         f"{tuple(positions.shape)}/{positions.dtype}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_size or (
        cos_sin_cache.stride(1) != 1
    ):
        raise ValueError(f"cos_sin_cache must be [max_position, {head_size}], got "
                         f"{tuple(cos_sin_cache.shape)}")
    torch.ops.minivllm.rotary_embedding(positions, query, key, head_size, cos_sin_cache)
    return query, key
