"""The unified paged-attention Triton kernel: prefill, chunked prefill and decode in one.

Upstream counterpart: ``kernel_unified_attention`` and its launcher ``unified_attention``
in ``vllm/v1/attention/ops/triton_unified_attention.py`` (the ``TRITON_ATTN`` backend).
minivllm keeps the core of that design and leaves out quantised caches, ALiBi, softcap,
sinks, sliding windows and Intel tensor descriptors. The PagedAttention chapter walks
through it; in short:

* The batch is one flat run of query tokens; ``query_start_loc`` says where each
  sequence's tokens start. The grid's first axis enumerates *q-blocks* (``BLOCK_Q``
  consecutive tokens of one sequence) and each program finds its sequence by binary
  search, so prefills, chunks and single decode tokens share one launch.
* A tile holds ``BLOCK_M = BLOCK_Q * group`` rows: every query head that shares one KV
  head, for each of the q-block's tokens (GQA packing). One K/V tile load then serves
  the whole group, which is what makes grouped-query decode memory-efficient.
* K and V are read tile by tile through the block table (:func:`kv_tile_offsets`), and
  softmax is computed online in float32 (:func:`online_softmax_update`). Only the tiles
  on the causal diagonal (or at the end of the context) are masked (:func:`attend_tile`).
* With ``NUM_SEGMENTS > 1`` the KV range is split across a second grid axis; partial
  results go to scratch buffers, merged by the last segment to finish
  (``merge_if_last_segment``) or by ``reduce_segments_kernel`` (split-KV).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minivllm.attention.triton_decode_split import (
    choose_num_segments,
    launch_reduce_segments,
    merge_if_last_segment,
    num_multiprocessors,
    segment_counters,
)

LOG2_E = 1.4426950408889634
# Triton reads this once at import; the interpreter needs the bf16 dot work-around below.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def find_seq_idx(
    query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr, SEARCH_WIDTH: tl.constexpr
):
    """Which sequence owns global q-block ``q_block``.

    Sequence ``s`` owns the q-blocks ``first(s) = query_start_loc[s] // BLOCK_Q + s``
    onwards. ``first`` is strictly increasing in ``s`` (the ``+ s`` reserves one spare
    block per sequence for its ragged end), so the owner is the last ``s`` with
    ``first(s) <= q_block``. Up to ``SEARCH_WIDTH`` sequences one vector load answers
    it (count the ``s`` with ``first(s) <= q_block``); a binary search needs ``log2``
    dependent loads, each a full memory round trip at the start of every program, which a
    small decode step feels. Larger batches (or ``SEARCH_WIDTH == 0``) bisect.
    """
    seq: tl.int32 = 0
    if SEARCH_WIDTH > 0:
        if num_seqs <= SEARCH_WIDTH:
            s = tl.arange(0, SEARCH_WIDTH)
            in_batch = s < num_seqs
            first = tl.load(query_start_loc_ptr + s, mask=in_batch, other=0) // BLOCK_Q + s
            seq = tl.sum(((first <= q_block) & in_batch).to(tl.int32), axis=0) - 1
        else:
            seq = bisect_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    else:
        seq = bisect_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    return seq


@triton.jit
def bisect_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary search for :func:`find_seq_idx`: the last ``s`` with ``first(s) <= q_block``."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid
        else:
            hi = mid - 1
    return lo


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
    PAGE_TILES: tl.constexpr,
):
    """Address translation: keys ``tile_start .. tile_start + TILE_N - 1`` -> element
    offsets in the paged cache (the same for K and V), plus their positions and mask.

    Token ``j`` of a sequence lives in physical block ``block_table[seq, j // BLOCK_SIZE]``
    at row ``j % BLOCK_SIZE``. With ``PAGE_TILES`` (block size a power of two) the tile
    reads one table entry per page it covers and lays the pages' rows side by side: 8
    loads for 128 keys in 16-token pages, instead of one per key. Otherwise each key looks
    up its own entry. Keys at or past ``kv_end`` read block 0, which is never
    dereferenced because the K/V loads are masked the same way.
    """
    key_pos = tile_start + tl.arange(0, TILE_N)
    key_mask = key_pos < kv_end
    if PAGE_TILES:
        # PAGES x ROWS == TILE_N keys; a tile shorter than a page lies inside one page.
        PAGES: tl.constexpr = TILE_N // BLOCK_SIZE if TILE_N > BLOCK_SIZE else 1
        ROWS: tl.constexpr = TILE_N // PAGES
        page = tile_start // BLOCK_SIZE + tl.arange(0, PAGES)
        physical_block = tl.load(
            block_table_row_ptr + page, mask=page * BLOCK_SIZE < kv_end, other=0
        ).to(tl.int64)
        row = tile_start % BLOCK_SIZE + tl.arange(0, ROWS)
        offsets = physical_block[:, None] * stride_c_block + row[None, :] * stride_c_slot
        # The reshape hides from Triton that every offset is a multiple of 16 elements
        # (the launcher only picks this path when the cache strides are); without the
        # hint the K/V loads cannot be vectorised, nor prefetched by the pipeliner.
        offsets = tl.multiple_of(tl.reshape(offsets, [TILE_N]), 16)
    else:
        physical_block = tl.load(
            block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_mask, other=0
        ).to(tl.int64)
        offsets = physical_block * stride_c_block + (key_pos % BLOCK_SIZE) * stride_c_slot
    return offsets + kv_head * stride_c_head, key_pos, key_mask


@triton.jit
def load_kv_tile(
    cache_ptr,
    offsets,
    key_mask,
    TRANSPOSED: tl.constexpr,
    MASKED: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """One K or V tile: ``[TILE_N, HEAD_PAD]``, or ``[HEAD_PAD, TILE_N]`` if ``TRANSPOSED``.

    A mask costs instructions and can stop the loads from being vectorised, so a tile that
    lies wholly inside the visible range (``MASKED`` false) with an unpadded head loads
    without one.
    """
    dims = tl.arange(0, HEAD_PAD)
    if TRANSPOSED:
        ptrs = cache_ptr + offsets[None, :] + dims[:, None]
        key_ok = key_mask[None, :]
        dim_ok = dims[:, None] < HEAD_SIZE
    else:
        ptrs = cache_ptr + offsets[:, None] + dims[None, :]
        key_ok = key_mask[:, None]
        dim_ok = dims[None, :] < HEAD_SIZE
    if MASKED:
        tile = tl.load(ptrs, mask=key_ok & dim_ok, other=0.0)
    elif HEAD_PAD != HEAD_SIZE:
        tile = tl.load(ptrs, mask=dim_ok, other=0.0)
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
    PAGE_TILES: tl.constexpr,
    K_TRANSPOSED: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Fold key tile ``tile`` into the running state ``(acc, m, l)`` of the Q tile.

    ``MASKED`` tiles cross the causal diagonal or the end of the context and need the
    per-element visibility test; every other tile is wholly visible to every row, so its
    loads and scores go unmasked (most of a long prefill's tiles).
    """
    offsets, key_pos, key_mask = kv_tile_offsets(
        block_table_row_ptr, tile * TILE_N, kv_end, kv_head,
        stride_c_block, stride_c_slot, stride_c_head, BLOCK_SIZE, TILE_N, PAGE_TILES,
    )
    k = load_kv_tile(k_cache_ptr, offsets, key_mask, K_TRANSPOSED, MASKED, HEAD_SIZE, HEAD_PAD)
    v = load_kv_tile(v_cache_ptr, offsets, key_mask, False, MASKED, HEAD_SIZE, HEAD_PAD)
    if UPCAST_DOT:
        # Only under TRITON_INTERPRET=1: the interpreter multiplies bfloat16 operands as
        # the raw 16-bit integers it stores them in. Widening first is exact (a product
        # of two bf16 values fits in float32, as on the tensor cores).
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if K_TRANSPOSED:
        scores = tl.dot(q, k, input_precision=DOT_PRECISION)
    else:
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if MASKED:
        visible = key_mask[None, :] & (key_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    m, l, p, alpha = online_softmax_update(scores, qk_scale, m, l)  # noqa: E741
    # P is rounded to the cache dtype (bf16) to feed the tensor cores, as FlashAttention
    # does; the accumulator stays float32.
    p = p.to(v_cache_ptr.dtype.element_ty).to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return acc, m, l


# Triton specializes integer arguments on "== 1" and "divisible by 16": the sequence count
# and the block table's width change from step to step, and each new class would compile
# another variant mid-run. The other strides are fixed by the model and the cache.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt_seq"])
def kernel_unified_attention(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    counter_ptr,
    qk_scale,
    num_seqs: tl.int32,
    stride_q_tok: tl.int64,
    stride_q_head: tl.int64,
    stride_o_tok: tl.int64,
    stride_o_head: tl.int64,
    stride_bt_seq: tl.int64,
    stride_c_block: tl.int64,
    stride_c_slot: tl.int64,
    stride_c_head: tl.int64,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    DIAGONAL_SPLIT: tl.constexpr,
    PAGE_TILES: tl.constexpr,
    K_TRANSPOSED: tl.constexpr,
    LONGEST_FIRST: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    SEARCH_WIDTH: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Attention of one q-block, for one KV head's query-head group, over one KV segment."""
    # Axis 0 enumerates (q-block, KV head) pairs, KV heads fastest: the programs of one
    # q-block run side by side and read neighbouring cache rows (heads are adjacent in a
    # page). LONGEST_FIRST walks the q-blocks backwards: in a causal prefill the last
    # q-blocks see the most keys, and starting them first keeps the final wave short.
    NUM_KV_HEADS: tl.constexpr = NUM_HEADS // GROUP
    pair = tl.program_id(0)
    kv_head = pair % NUM_KV_HEADS
    q_block = pair // NUM_KV_HEADS
    if LONGEST_FIRST:
        q_block = tl.num_programs(0) // NUM_KV_HEADS - 1 - q_block
    segment = tl.program_id(1)

    # -- which sequence, and which of its tokens, this program serves ----------------
    seq = find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q, SEARCH_WIDTH)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return  # a spare q-block past this sequence's last token
    context_len = seq_len - q_len  # tokens cached before this step

    # -- the Q tile: BLOCK_Q tokens x GROUP heads, flattened into BLOCK_M rows --------
    rows = tl.arange(0, BLOCK_M)
    tok = local_block * BLOCK_Q + rows // GROUP  # token index within the sequence
    head = kv_head * GROUP + rows % GROUP
    row_mask = (tok < q_len) & (rows < BLOCK_Q * GROUP)
    dims = tl.arange(0, HEAD_PAD)
    dim_mask = dims < HEAD_SIZE
    tok_global = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + tok_global[:, None] * stride_q_tok + head[:, None] * stride_q_head + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    if UPCAST_DOT:
        q = q.to(tl.float32)
    q_pos = context_len + tok  # absolute position: a row sees keys 0..q_pos (causal)

    # -- the KV range: everything up to the block's last token, maybe one segment of it
    kv_end = tl.minimum(seq_len, context_len + (local_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE_N)
    tiles_per_segment = tl.cdiv(num_tiles, NUM_SEGMENTS)
    tile_lo = segment * tiles_per_segment
    tile_hi = tl.minimum(tile_lo + tiles_per_segment, num_tiles)
    # Keys 0 .. (the q-block's first position) are visible to all of its rows: the tiles
    # wholly below that need no mask. Only the last one or two tiles (the diagonal, and
    # the end of the context) do.
    num_full = (context_len + local_block * BLOCK_Q + 1) // TILE_N if DIAGONAL_SPLIT else 0
    tile_mid = tl.maximum(tile_lo, tl.minimum(tile_hi, num_full))

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)  # noqa: E741 - the usual name
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    block_table_row = block_table_ptr + seq * stride_bt_seq
    for tile in range(tile_lo, tile_mid):
        acc, m, l = attend_tile(  # noqa: E741
            acc, m, l, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, tile, kv_end,
            kv_head, qk_scale, stride_c_block, stride_c_slot, stride_c_head,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_N, PAGE_TILES, K_TRANSPOSED, False,
            DOT_PRECISION, UPCAST_DOT,
        )
    for tile in range(tile_mid, tile_hi):
        acc, m, l = attend_tile(  # noqa: E741
            acc, m, l, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, tile, kv_end,
            kv_head, qk_scale, stride_c_block, stride_c_slot, stride_c_head,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_N, PAGE_TILES, K_TRANSPOSED, True,
            DOT_PRECISION, UPCAST_DOT,
        )

    if NUM_SEGMENTS == 1:
        out = acc / l[:, None]
        tl.store(
            out_ptr + tok_global[:, None] * stride_o_tok + head[:, None] * stride_o_head
            + dims[None, :],
            out,
            mask=row_mask[:, None] & dim_mask[None, :],
        )
    else:
        # Unnormalised partials; every segment writes, even an empty one (m=-inf, l=0),
        # so the merge needs no bookkeeping of which segments ran.
        part_row = (tok_global * NUM_HEADS + head) * NUM_SEGMENTS + segment
        tl.store(part_max_ptr + part_row, m, mask=row_mask)
        tl.store(part_sum_ptr + part_row, l, mask=row_mask)
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_PAD + dims[None, :],
            acc,
            mask=row_mask[:, None],
        )
        if FUSED_REDUCE:
            merge_if_last_segment(
                out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, counter_ptr + pair,
                q_start, q_len, local_block, kv_head, stride_o_tok, stride_o_head,
                NUM_HEADS, GROUP, HEAD_SIZE, HEAD_PAD, BLOCK_Q, NUM_SEGMENTS,
            )


@dataclass(frozen=True)
class AttentionLaunchConfig:
    """Tile sizes, launch parameters and kernel variant of one unified-kernel launch.

    The flags after ``num_segments`` select code paths inside the kernel; they exist so
    that one sweep (``minivllm.benchmarks.kernel_variants``) can measure each idea on its
    own. The defaults are the measured winners.
    """

    block_m: int  # rows per program: BLOCK_Q tokens x group heads
    tile_n: int  # keys per inner-loop iteration
    num_warps: int
    num_stages: int
    num_segments: int  # 1 = no split-KV
    diagonal_split: bool = True  # mask only the tiles on the causal diagonal
    page_tiles: bool = True  # one block-table load per page (power-of-two block sizes)
    k_transposed: bool = False  # load K as [head, keys] instead of [keys, head]
    longest_first: bool = True  # start the q-blocks with the most keys first
    fused_reduce: bool = True  # split-KV: the last segment merges (no reduce launch)
    flat_search: bool = True  # find the sequence with one vector load (small batches)


# Batches of up to this many sequences find their sequence with one vector load.
FLAT_SEARCH_WIDTH = 256
# Tuned on an H200 (see docs/benchmarks/kernel.json and the PagedAttention chapter).
DECODE_TILE_N, DECODE_WARPS, DECODE_STAGES = 64, 4, 2
# From this many sequences on, decode uses longer key tiles with a deeper pipeline: with
# ragged contexts (a continuous batch) they are 6-14% faster, with equal contexts within
# 1-3% (docs/benchmarks/kernel_sweep_ragged.json).
DECODE_LARGE_BATCH = 128
DECODE_LARGE_TILE_N, DECODE_LARGE_WARPS, DECODE_LARGE_STAGES = 128, 4, 3
PREFILL_BLOCK_M, PREFILL_TILE_N, PREFILL_WARPS, PREFILL_STAGES = 128, 128, 8, 2
# Above this query length a q-block uses the large prefill tile.
PREFILL_MIN_QUERY_LEN = 32
# Shared memory the K/V pipeline may use: Triton keeps ``num_stages`` copies of a K and a
# V tile in flight. H100/H200 allow 227 KiB per program; staying at 160 KiB leaves room for
# Triton's own scratch (and for smaller GPUs).
SMEM_BUDGET_BYTES = 160 * 1024
# On a GPU the budget is what the device lets one program opt into, minus this margin.
SMEM_SCRATCH_BYTES = 16 * 1024


def smem_budget(device: torch.device) -> int:
    """Shared memory the K/V pipeline may use on ``device`` (the fixed budget off-GPU,
    or when torch does not report the device's opt-in limit)."""
    if device.type != "cuda":
        return SMEM_BUDGET_BYTES
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_smem_budget(index)


@functools.cache
def _cuda_smem_budget(index: int) -> int:
    optin = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)
    return optin - SMEM_SCRATCH_BYTES if optin > SMEM_BUDGET_BYTES else SMEM_BUDGET_BYTES


def select_config(
    *,
    num_tokens: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    max_query_len: int,
    max_seq_len: int,
    device: torch.device,
    num_kv_splits: int | None = None,
    head_size: int = 128,
    element_size: int = 2,
) -> AttentionLaunchConfig:
    """Pick tiles and the split-KV segment count from host-side sizes only (no sync).

    Decode-like batches (short queries) use the smallest row tile the tensor cores
    accept, 16 rows, because only ``group`` rows per sequence carry a real query, with
    longer key tiles from ``DECODE_LARGE_BATCH`` sequences on; long queries use 128-row
    tiles to reuse each K/V tile across many queries. Split-KV is
    chosen by :func:`choose_num_segments` unless ``num_kv_splits`` forces it.
    """
    group = num_heads // num_kv_heads
    if max_query_len >= PREFILL_MIN_QUERY_LEN:
        block_m = max(PREFILL_BLOCK_M, triton.next_power_of_2(group))
        tile_n, warps, stages = PREFILL_TILE_N, PREFILL_WARPS, PREFILL_STAGES
    elif num_seqs >= DECODE_LARGE_BATCH:
        block_m = max(16, triton.next_power_of_2(group))
        tile_n, warps, stages = DECODE_LARGE_TILE_N, DECODE_LARGE_WARPS, DECODE_LARGE_STAGES
    else:
        block_m = max(16, triton.next_power_of_2(group))
        tile_n, warps, stages = DECODE_TILE_N, DECODE_WARPS, DECODE_STAGES
    # Large heads or float32 would overflow shared memory with the bf16/d128 tiles tuned
    # above: halve the key tile, then the pipeline depth, until the stages fit.
    kv_tile_bytes = 2 * triton.next_power_of_2(head_size) * element_size  # K + V, per key
    budget = smem_budget(device)
    while stages * tile_n * kv_tile_bytes > budget and tile_n > 16:
        tile_n //= 2
    while stages * tile_n * kv_tile_bytes > budget and stages > 1:
        stages -= 1
    if num_kv_splits is None:
        block_q = block_m // group
        active = max(num_seqs, triton.cdiv(num_tokens, block_q)) * num_kv_heads
        segments = choose_num_segments(active, max_seq_len, num_multiprocessors(device))
    else:
        segments = num_kv_splits
    # The fused merge runs in one program per q-block, row after row: right for the few
    # rows of a decode q-block, slower than the separate reduce grid for 128-row tiles.
    fused = max_query_len < PREFILL_MIN_QUERY_LEN
    return AttentionLaunchConfig(block_m, tile_n, warps, stages, segments, fused_reduce=fused)


def launch_configs(
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    element_size: int,
    max_model_len: int,
    device: torch.device,
) -> list[AttentionLaunchConfig]:
    """Every configuration :func:`select_config` can return for one model: each tile
    family (small-batch decode, large-batch decode, prefill) with each split-KV segment
    count the heuristic can choose for contexts up to ``max_model_len``.

    Each is a separate compiled kernel (tiles and segments are ``tl.constexpr``), so the
    engine compiles them all while it starts rather than in the middle of a request.
    """
    # One active program is the emptiest grid, so it gets the most segments.
    most = choose_num_segments(1, max_model_len, num_multiprocessors(device))
    families = ((1, 1), (1, DECODE_LARGE_BATCH), (PREFILL_MIN_QUERY_LEN, 1))
    configs = []
    for max_query_len, num_seqs in families:
        for log_segments in range(most.bit_length()):
            config = select_config(
                num_tokens=num_seqs * max_query_len,
                num_seqs=num_seqs,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                max_query_len=max_query_len,
                max_seq_len=max_model_len,
                device=device,
                num_kv_splits=1 << log_segments,
                head_size=head_size,
                element_size=element_size,
            )
            if config not in configs:
                configs.append(config)
    return configs


def _page_tiles_fit(key_cache: torch.Tensor) -> bool:
    """Whether :func:`kv_tile_offsets` may read the block table once per page: the tile
    and the page must divide one another (a power-of-two block size), and every cache
    stride must be a multiple of 16 elements (the alignment it promises Triton)."""
    block_size = key_cache.shape[1]
    aligned = all(stride % 16 == 0 for stride in key_cache.stride()[:3])
    return block_size & (block_size - 1) == 0 and aligned


def launch_unified_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    config: AttentionLaunchConfig,
) -> None:
    """Launch the unified kernel (and the split-KV reduce) on validated tensors."""
    num_tokens, num_heads, head_size = query.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    num_kv_heads = key_cache.shape[2]
    block_size = key_cache.shape[1]
    group = num_heads // num_kv_heads
    head_pad = triton.next_power_of_2(head_size)
    block_q = config.block_m // group
    segments = config.num_segments
    fused = segments > 1 and config.fused_reduce
    # Upper bound on q-blocks without reading query lengths from the device:
    # sum_s ceil(len_s / BLOCK_Q) <= num_tokens // BLOCK_Q + num_seqs.
    grid = ((num_tokens // block_q + num_seqs) * num_kv_heads, segments)
    if segments > 1:
        part_out = torch.empty(
            (num_tokens, num_heads, segments, head_pad), dtype=torch.float32, device=out.device
        )
        part_max = torch.empty((num_tokens, num_heads, segments), dtype=torch.float32,
                               device=out.device)
        part_sum = torch.empty_like(part_max)
    else:
        # Never touched when NUM_SEGMENTS == 1; any tensor serves as the pointer.
        part_out = part_max = part_sum = out
    counters = segment_counters(out.device, grid[0]) if fused else out
    kernel_unified_attention[grid](
        out, query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
        part_out, part_max, part_sum, counters,
        scale * LOG2_E,  # scores live in the log2 domain so the kernel can use exp2
        num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_table.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_SIZE=head_size,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=config.block_m,
        BLOCK_Q=block_q,
        TILE_N=config.tile_n,
        NUM_SEGMENTS=segments,
        DIAGONAL_SPLIT=config.diagonal_split,
        PAGE_TILES=config.page_tiles and _page_tiles_fit(key_cache),
        K_TRANSPOSED=config.k_transposed,
        LONGEST_FIRST=config.longest_first,
        FUSED_REDUCE=fused,
        SEARCH_WIDTH=FLAT_SEARCH_WIDTH if config.flat_search else 0,
        # float32 runs in exact IEEE mode (tf32 would cost ~1e-3 relative error).
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST_DOT=_INTERPRETED,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if segments > 1 and not fused:
        launch_reduce_segments(out, part_out, part_max, part_sum)
