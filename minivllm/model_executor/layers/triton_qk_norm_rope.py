"""Qwen3's per-head q/k RMSNorm and the rotary embedding, in place, in one Triton launch.

Upstream counterpart: ``fused_qk_norm_rope`` (``vllm/_custom_ops.py``, CUDA kernel in
``csrc/libtorch_stable/fused_qknorm_rope_kernel.cu``), which upstream's compiler pass
``vllm/compilation/passes/fusion/qk_norm_rope_fusion.py`` substitutes for the sequence
"split qkv, RMSNorm each q head, RMSNorm each k head, rotary embedding". Same contract:
the query and key heads of the fused qkv projection output are normalised over their
``D`` values with a weight of ``D`` entries (one for q, one for k) and then rotated by
their token's position, in place; v is not touched.

Why: at batch 1 a decoder layer is bound by how many kernels it launches, not by bytes.
Unfused, this is three launches per layer (the q norm, the k norm, the rotary kernel),
each a few microseconds of mostly fixed cost for a few kilobytes of data; fused it is
one, and the normalised q and k never make a round trip through memory.

One program handles a block of up to eight heads of one token (grid
``[T, ceil(Hq / 8) + ceil(Hk / 8)]``): it reads each head once as a row for the sum of
squares, then as its two halves (``x_i`` and its neox partner ``x_{i + D/2}``, from L1),
normalises, multiplies by the weight and rotates; the heads of a block share one load of
the weight and of the token's cos/sin. An earlier version ran one one-warp program per
head: a decode step of 256 tokens was then 6,144 programs, each a chain of dependent
loads of 256 bytes, in two waves, and it was slower at every batch of eight tokens or
more, several times slower on a long prefill (the Benchmarks chapter has the profile).

Rounding is that of the two unfused kernels, step by step (``triton_layernorm.rms_norm``
followed by ``triton_rotary.rotary_embedding``): the sum of squares is a ``tl.sum`` over a
``[next_pow2(D)]`` row with the same warp count, ``x * rstd`` and the weight product are
each rounded to the model dtype, then every rotary product and sum. In Triton's
interpreter the fused and unfused results have the same bits; compiled, each kernel's
reduction layout is Triton's choice, so the float32 sum of squares may be added in
another order, and both agree with the torch reference within the same tolerances.

The paged KV-cache write rides along (:func:`qk_norm_rope_kv_cache`, op
``qk_norm_rope_kv_cache``): the program of a block of k heads, which holds their rotated
values in registers, also stores them and the token's v heads at the token's cache slot,
which saves the separate ``reshape_and_cache`` launch of every decoder layer and its
re-read of k. Upstream gets the same from a compiler pass that fuses RoPE with the cache
write (``vllm/compilation/passes/fusion/rope_kvcache_fusion.py``, on ROCm). The stores
write the values the unfused path writes to q/k, cast to the cache's dtype as
``reshape_and_cache`` casts them, so the cache holds the same bits either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.backends.triton_attn import check_reshape_and_cache_args
from minivllm.utils.math_utils import cdiv, next_power_of_2
from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop


@triton.jit
def qk_norm_rope_kernel(
    positions_ptr,
    query_ptr,
    key_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_sin_cache_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    query_stride,
    key_stride,
    cache_stride,
    value_stride,
    stride_c_block: tl.int64,
    stride_c_slot: tl.int64,
    stride_c_head: tl.int64,
    num_q_heads,
    num_k_heads,
    head_size,
    eps,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HEADS: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
):
    """Token ``program_id(0)``; ``program_id(1)`` is a block of ``HEADS`` heads, the q
    heads' blocks first, then the k heads'. With ``WRITE_CACHE`` a k block also stores
    its rotated k heads and the token's v heads at ``slot_mapping[token]`` (the value and
    cache arguments are stand-ins without it)."""
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    num_q_blocks = tl.cdiv(num_q_heads, HEADS)
    if block < num_q_blocks:
        first, count = block * HEADS, num_q_heads
        base = query_ptr + token * query_stride
        weight_ptr = q_weight_ptr
    else:
        first, count = (block - num_q_blocks) * HEADS, num_k_heads
        base = key_ptr + token * key_stride
        weight_ptr = k_weight_ptr
    dtype = query_ptr.dtype.element_ty
    half: tl.constexpr = HEAD_SIZE // 2

    heads = first + tl.arange(0, HEADS)
    rows = base + heads[:, None] * HEAD_SIZE  # [HEADS, 1] pointers, one per head
    head_mask = (heads < count)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    x = tl.load(rows + d, mask=head_mask & (d < HEAD_SIZE), other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / head_size + eps)[:, None]

    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < half
    both = head_mask & mask[None, :]
    x1 = tl.load(rows + cols[None, :], mask=both, other=0.0).to(tl.float32)
    x2 = tl.load(rows + half + cols[None, :], mask=both, other=0.0).to(tl.float32)
    # The weight and the token's cos/sin are shared by every head of the block.
    w1 = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(weight_ptr + half + cols, mask=mask, other=0.0).to(tl.float32)[None, :]
    x1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    x2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)

    pos = tl.load(positions_ptr + token).to(tl.int64)
    cache_row = cos_sin_cache_ptr + pos * cache_stride
    cos = tl.load(cache_row + cols, mask=mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(cache_row + half + cols, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = sin[None, :]
    x1c = (x1 * cos).to(dtype).to(tl.float32)
    x2s = (x2 * sin).to(dtype).to(tl.float32)
    x2c = (x2 * cos).to(dtype).to(tl.float32)
    x1s = (x1 * sin).to(dtype).to(tl.float32)
    out1 = (x1c - x2s).to(dtype)
    out2 = (x2c + x1s).to(dtype)
    tl.store(rows + cols[None, :], out1, mask=both)
    tl.store(rows + half + cols[None, :], out2, mask=both)

    # Two ifs: the constexpr one removes the cache write from the variant without it.
    if WRITE_CACHE:  # noqa: SIM102
        if block >= num_q_blocks:
            # What reshape_and_cache would copy: the k heads just stored (still in
            # registers, so never read back) and the token's v heads, to the token's
            # slot. A negative slot is CUDA-graph padding: nothing is stored.
            slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
            if slot >= 0:
                dst = (slot // CACHE_BLOCK_SIZE) * stride_c_block
                dst += (slot % CACHE_BLOCK_SIZE) * stride_c_slot
                dst += heads[:, None].to(tl.int64) * stride_c_head
                # The stores cast to the cache's element type, as reshape_and_cache's do.
                tl.store(key_cache_ptr + dst + cols[None, :], out1, mask=both)
                tl.store(key_cache_ptr + dst + half + cols[None, :], out2, mask=both)
                row_mask = head_mask & (d < HEAD_SIZE)
                v_rows = value_ptr + token * value_stride + heads[:, None] * HEAD_SIZE
                v = tl.load(v_rows + d, mask=row_mask)
                tl.store(value_cache_ptr + dst + d, v, mask=row_mask)


# Heads per program (at most; fewer when the model has fewer).
HEADS_PER_PROGRAM = 8


def heads_per_program(num_q_heads: int, num_k_heads: int) -> int:
    """Heads one program normalises and rotates: a power of two up to
    :data:`HEADS_PER_PROGRAM`, enough for the larger of the two head counts."""
    return min(HEADS_PER_PROGRAM, next_power_of_2(max(num_q_heads, num_k_heads)))


def _launch(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    epsilon: float,
    value: torch.Tensor | None = None,
    key_cache: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> None:
    """Launch :func:`qk_norm_rope_kernel` on validated tensors; it writes the cache when
    ``key_cache`` is given (then so are ``value``, ``value_cache`` and ``slot_mapping``)."""
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    num_q_heads = query.shape[1] // head_size
    num_k_heads = key.shape[1] // head_size
    block = next_power_of_2(head_size)
    heads = heads_per_program(num_q_heads, num_k_heads)
    grid = (num_tokens, cdiv(num_q_heads, heads) + cdiv(num_k_heads, heads))
    write = key_cache is not None
    if not write:
        # Never read (WRITE_CACHE is a constexpr False): stand-ins, as the skinny GEMM's
        # missing bias, so the argument list keeps one shape.
        value, key_cache, value_cache, slot_mapping = key, key, key, positions
    qk_norm_rope_kernel[grid](
        positions,
        query,
        key,
        q_weight,
        k_weight,
        cos_sin_cache,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        query.stride(0),
        key.stride(0),
        cos_sin_cache.stride(0),
        value.stride(0),
        *(key_cache.stride()[:3] if write else (0, 0, 0)),
        num_q_heads,
        num_k_heads,
        head_size,
        epsilon,
        HEAD_SIZE=head_size,
        BLOCK_D=block,
        BLOCK_HALF=next_power_of_2(head_size // 2),
        HEADS=heads,
        WRITE_CACHE=write,
        CACHE_BLOCK_SIZE=key_cache.shape[1] if write else 1,
        num_warps=min(max(heads * block // 256, 1), 8),
    )


direct_register_custom_op(
    "qk_norm_rope",
    "(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor q_weight, Tensor k_weight, "
    "Tensor cos_sin_cache, int head_size, float epsilon) -> ()",
    _launch,
    fake_noop,
)

# A second op rather than optional arguments of the first: the schema then marks the
# caches as written ((c!), (d!)) without making every argument optional.
direct_register_custom_op(
    "qk_norm_rope_kv_cache",
    "(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor q_weight, Tensor k_weight, "
    "Tensor cos_sin_cache, int head_size, float epsilon, Tensor value, "
    "Tensor(c!) key_cache, Tensor(d!) value_cache, Tensor slot_mapping) -> ()",
    _launch,
    fake_noop,
)


def _check(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
) -> None:
    num_tokens = positions.shape[0]
    if positions.dim() != 1 or positions.is_floating_point():
        raise ValueError(
            f"positions must be a 1-D integer tensor, got "
            f"{tuple(positions.shape)}/{positions.dtype}"
        )
    if head_size <= 0 or head_size % 2:
        raise ValueError(f"head_size must be even and positive, got {head_size}")
    for name, t in (("query", query), ("key", key)):
        if t.dim() != 2 or t.shape[0] != num_tokens or t.shape[1] % head_size or (t.stride(1) != 1):
            raise ValueError(
                f"{name} must be [{num_tokens}, heads * {head_size}] with contiguous rows, "
                f"got shape {tuple(t.shape)} strides {tuple(t.stride())}"
            )
    if key.dtype != query.dtype:
        raise ValueError(f"key dtype {key.dtype} must match query dtype {query.dtype}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w.shape != (head_size,) or w.dtype != query.dtype or not w.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous [{head_size}] tensor of "
                f"{query.dtype}, got {tuple(w.shape)}/{w.dtype}"
            )
    if (
        cos_sin_cache.dim() != 2
        or cos_sin_cache.shape[1] != head_size
        or (cos_sin_cache.stride(1) != 1)
    ):
        raise ValueError(
            f"cos_sin_cache must be [max_position, {head_size}], got {tuple(cos_sin_cache.shape)}"
        )


def _check_cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    head_size: int,
) -> None:
    """The checks of reshape_and_cache, on the heads as it would see them, plus what the
    kernel assumes of ``value``: ``key``'s dtype, row layout and size."""
    if value.shape != key.shape or value.dtype != key.dtype or value.stride(1) != 1:
        raise ValueError(
            f"value must be a {tuple(key.shape)} {key.dtype} tensor with contiguous rows, "
            f"got {tuple(value.shape)}/{value.dtype} strides {tuple(value.stride())}"
        )
    if slot_mapping.dim() == 1 and slot_mapping.stride(0) != 1:
        raise ValueError("slot_mapping must be contiguous")
    num_tokens = key.shape[0]
    check_reshape_and_cache_args(
        key.view(num_tokens, -1, head_size), value.view(num_tokens, -1, head_size),
        key_cache, value_cache, slot_mapping,
    )  # fmt: skip


def qk_norm_rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm every head of ``query`` ``[T, Hq * D]`` with ``q_weight`` ``[D]`` and of
    ``key`` ``[T, Hk * D]`` with ``k_weight``, then rotate both by ``positions``; in place.

    Rows may be strided (column slices of the qkv output) but each row must be contiguous.
    Positions are not range-checked (that would need a device sync); they must be below
    ``cos_sin_cache.shape[0]``. Returns ``(query, key)``.
    """
    _check(positions, query, key, q_weight, k_weight, cos_sin_cache, head_size)
    torch.ops.minivllm.qk_norm_rope(
        positions, query, key, q_weight, k_weight, cos_sin_cache, head_size, float(epsilon)
    )
    return query, key


def qk_norm_rope_kv_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    epsilon: float,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`qk_norm_rope`, and in the same launch the paged KV-cache write that
    ``reshape_and_cache`` (``minivllm/attention/triton_reshape_and_cache.py``) would do
    next: the rotated key heads and ``value``'s heads of token ``t`` go to slot
    ``slot_mapping[t]`` of ``key_cache``/``value_cache``
    ``[num_blocks, block_size, Hk, D]`` (any strides with a contiguous last dim, one
    layout for both), nothing when the slot is negative. The same bits as that kernel.

    ``value`` is ``[T, Hk * D]`` with contiguous rows (the v slice of qkv). Slots are not
    range-checked, as in ``reshape_and_cache``. Returns ``(query, key)``.
    """
    _check(positions, query, key, q_weight, k_weight, cos_sin_cache, head_size)
    _check_cache_write(key, value, key_cache, value_cache, slot_mapping, head_size)
    torch.ops.minivllm.qk_norm_rope_kv_cache(
        positions, query, key, q_weight, k_weight, cos_sin_cache, head_size, float(epsilon),
        value, key_cache, value_cache, slot_mapping,
    )  # fmt: skip
    return query, key
