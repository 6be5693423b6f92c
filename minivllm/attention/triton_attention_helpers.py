"""One key tile of the unified attention kernel: address translation, loads, online softmax.

These ``@triton.jit`` helpers are inlined into ``kernel_unified_attention``
(``triton_unified_attention.py``); they are split out so that each step of the inner loop
can be read, and linked from the PagedAttention chapter, on its own. Upstream counterpart:
``vllm/v1/attention/ops/triton_attention_helpers.py`` (``softmax_step``,
``compute_kv_seq_mask``), and the top of the tile loop in ``kernel_unified_attention``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_tile_offsets(
    block_table_row_ptr,
    tile_start,
    kv_end,
    kv_head,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """Address translation: keys ``tile_start .. tile_start + TILE_N - 1`` -> element
    offsets in the paged cache (the same for K and V), plus their positions and mask.

    Token ``j`` of a sequence lives in physical block ``block_table[seq, j // BLOCK_SIZE]``
    at row ``j % BLOCK_SIZE``. A tile can span several blocks, so the block table is read
    as a vector, one entry per key (neighbouring keys hit the same cached entry). Keys at
    or past ``kv_end`` read block 0, which is never dereferenced because the K/V loads
    are masked the same way.
    """
    key_pos = tile_start + tl.arange(0, TILE_N)
    key_mask = key_pos < kv_end
    physical_block = tl.load(
        block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_mask, other=0
    ).to(tl.int64)
    offsets = (
        physical_block * stride_c_block
        + (key_pos % BLOCK_SIZE) * stride_c_slot
        + kv_head * stride_c_head
    )
    return offsets, key_pos, key_mask


@triton.jit
def load_kv_tile(
    cache_ptr,
    offsets,
    key_mask,
    MASKED: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """One K or V tile, ``[TILE_N, HEAD_PAD]``: each key's head vector is one contiguous
    row of the cache, so every thread loads 16 contiguous bytes.

    A mask costs instructions, so a tile that lies wholly inside the visible range
    (``MASKED`` false) with an unpadded head loads without one.
    """
    dims = tl.arange(0, HEAD_PAD)
    ptrs = cache_ptr + offsets[:, None] + dims[None, :]
    if MASKED:
        tile = tl.load(ptrs, mask=key_mask[:, None] & (dims[None, :] < HEAD_SIZE), other=0.0)
    elif HEAD_PAD != HEAD_SIZE:
        tile = tl.load(ptrs, mask=dims[None, :] < HEAD_SIZE, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def online_softmax_update(scores, qk_scale, m_prev, l_prev):
    """One step of online softmax over a new tile of raw ``scores`` (``q . k``, float32).

    ``qk_scale`` includes ``log2(e)``, so the softmax runs in the log2 domain with the
    cheaper ``exp2``; the maximum is taken over the raw scores and scaled once per row
    (the scale is positive), so each score costs one fused multiply-add on the way into
    ``exp2``. Returns the new running max ``m`` and sum ``l``, the tile's probabilities
    ``p`` (relative to the new max) and ``alpha``, the factor that rescales everything
    accumulated so far to the new max. A row whose keys have all been masked so far keeps
    ``m = -inf``; it is shifted by 0 instead, so ``-inf - -inf`` never makes a NaN.
    """
    m_new = tl.maximum(m_prev, tl.max(scores, axis=1) * qk_scale)
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores * qk_scale - m_shift[:, None])
    alpha = tl.exp2(m_prev - m_shift)
    l_new = l_prev * alpha + tl.sum(p, axis=1)
    return m_new, l_new, p, alpha


@triton.jit
def fold_kv_tile(
    acc,
    m,
    l,  # noqa: E741 - the usual name
    q,
    k,
    v,
    visible,
    qk_scale,
    P_DTYPE: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Fold one loaded ``[keys, head]`` K and V tile into the running state ``(acc, m, l)``.

    ``visible`` (``[rows, keys]``) is only read for ``MASKED`` tiles. K is transposed
    inside the dot: Triton then lays the tile out in shared memory as the tensor cores
    want it (loading it pre-transposed was 1.3x slower on the H200 for prefill,
    docs/benchmarks/perf2/kernel_variants.json). P @ V accumulates into the rescaled
    ``acc`` in place (the dot's accumulator operand), as the tensor cores do.
    """
    if UPCAST_DOT:
        # Only under TRITON_INTERPRET=1: the interpreter multiplies bfloat16 operands as
        # the raw 16-bit integers it stores them in. Widening first is exact (a product
        # of two bf16 values fits in float32, as on the tensor cores).
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if MASKED:
        scores = tl.where(visible, scores, float("-inf"))
    m, l, p, alpha = online_softmax_update(scores, qk_scale, m, l)  # noqa: E741
    # P is rounded to the cache dtype (bf16) to feed the tensor cores, as FlashAttention
    # does; the accumulator stays float32.
    p = p.to(P_DTYPE).to(v.dtype)
    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m, l


@triton.jit
def attend_tile(
    acc,
    m,
    l,  # noqa: E741 - the usual name
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    block_table_row_ptr,
    tile,
    kv_end,
    kv_head,
    qk_scale,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Fold cached key tile ``tile`` (read through the block table) into ``(acc, m, l)``.

    ``MASKED`` tiles cross the causal diagonal or the end of the context and need the
    per-element visibility test; every other tile is wholly visible to every row, so its
    loads and scores go unmasked (most of a long prefill's tiles).
    """
    offsets, key_pos, key_mask = kv_tile_offsets(
        block_table_row_ptr,
        tile * TILE_N,
        kv_end,
        kv_head,
        stride_c_block,
        stride_c_slot,
        stride_c_head,
        BLOCK_SIZE,
        TILE_N,
    )
    k = load_kv_tile(k_cache_ptr, offsets, key_mask, MASKED, HEAD_SIZE, HEAD_PAD)
    v = load_kv_tile(v_cache_ptr, offsets, key_mask, MASKED, HEAD_SIZE, HEAD_PAD)
    visible = key_mask[None, :] & (key_pos[None, :] <= q_pos[:, None])
    return fold_kv_tile(
        acc, m, l, q, k, v, visible, qk_scale, v_cache_ptr.dtype.element_ty, MASKED,
        DOT_PRECISION, UPCAST_DOT,
    )


@triton.jit
def load_new_kv_tile(
    ptr,
    desc,
    first_row,
    row_end,
    kv_head,
    stride_tok,
    MASKED: tl.constexpr,
    USE_DESC: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """Rows ``first_row ..`` of this step's contiguous ``[tokens, kv_heads, head]`` key or
    value tensor, one KV head: ``[TILE_N, HEAD_PAD]``, no block table in the way.

    With ``USE_DESC`` the tile comes through a tensor descriptor (a TMA copy on Hopper:
    one instruction per tile instead of an address per thread; rows past the tensor read
    as zeros). Otherwise by pointers; ``MASKED`` tiles stop at ``row_end``.
    """
    if USE_DESC:
        tile = desc.load([first_row, kv_head * HEAD_SIZE])
    else:
        rows = first_row + tl.arange(0, TILE_N)
        dims = tl.arange(0, HEAD_PAD)
        ptrs = ptr + rows.to(tl.int64)[:, None] * stride_tok + kv_head * HEAD_SIZE + dims[None, :]
        if MASKED:
            mask = (rows[:, None] < row_end) & (dims[None, :] < HEAD_SIZE)
            tile = tl.load(ptrs, mask=mask, other=0.0)
        elif HEAD_PAD != HEAD_SIZE:
            tile = tl.load(ptrs, mask=dims[None, :] < HEAD_SIZE, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def attend_new_tile(
    acc,
    m,
    l,  # noqa: E741 - the usual name
    q,
    tok,
    key_ptr,
    value_ptr,
    key_desc,
    value_desc,
    q_start,
    new_end,
    tile,
    kv_head,
    qk_scale,
    stride_k_tok,
    stride_v_tok,
    P_DTYPE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,
    USE_DESC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Fold tile ``tile`` of this step's own keys (the query chunk's, read densely from the
    step's ``key``/``value`` tensors) into ``(acc, m, l)``.

    Positions here are relative to the chunk: key ``r`` is the chunk's token ``r``, and
    row token ``tok`` sees keys ``r <= tok`` (the causal mask); ``new_end`` is the number
    of the chunk's keys this q-block may see.
    """
    first = q_start + tile * TILE_N
    end = q_start + new_end
    k = load_new_kv_tile(key_ptr, key_desc, first, end, kv_head, stride_k_tok, MASKED,
                         USE_DESC, HEAD_SIZE, HEAD_PAD, TILE_N)
    v = load_new_kv_tile(value_ptr, value_desc, first, end, kv_head, stride_v_tok, MASKED,
                         USE_DESC, HEAD_SIZE, HEAD_PAD, TILE_N)
    key_rel = tile * TILE_N + tl.arange(0, TILE_N)
    visible = (key_rel[None, :] <= tok[:, None]) & (key_rel[None, :] < new_end)
    return fold_kv_tile(
        acc, m, l, q, k, v, visible, qk_scale, P_DTYPE, MASKED, DOT_PRECISION, UPCAST_DOT,
    )
