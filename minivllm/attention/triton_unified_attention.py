"""The unified paged-attention Triton kernel: prefill, chunked prefill and decode in one.

Upstream counterpart: ``kernel_unified_attention`` and its launcher ``unified_attention``
in ``vllm/v1/attention/ops/triton_unified_attention.py`` (the ``TRITON_ATTN`` backend).
minivllm keeps the core of that design and leaves out quantised caches, ALiBi, softcap,
sinks, sliding windows and Intel tensor descriptors. The PagedAttention chapter walks
through it; in short:

* The batch is one flat run of query tokens; ``query_start_loc`` says where each
  sequence's tokens start. The grid's first axis enumerates *q-blocks* (``BLOCK_Q``
  consecutive tokens of one sequence), longest first, and each program finds its
  sequence by binary search, so prefills, chunks and single decode tokens share one
  launch. A decode batch may instead come with ``seq_order``, its sequences longest
  context first: program ``i`` then serves the ``i``-th of them (see *Launch order*).
* A tile holds ``BLOCK_M = BLOCK_Q * group`` rows: every query head that shares one KV
  head, for each of the q-block's tokens (GQA packing). One K/V tile load then serves
  the whole group, which is what makes grouped-query decode memory-efficient.
* K and V are read tile by tile through the block table (:func:`kv_tile_offsets`), and
  softmax is computed online in float32 (:func:`online_softmax_update`). Only the tiles
  on the causal diagonal (or at the end of the context) are masked (:func:`attend_tile`).
* With ``NUM_SEGMENTS > 1`` the KV range is split across a second grid axis; partial
  results go to scratch buffers, merged by the last segment to finish
  (``merge_if_last_segment``) or by ``reduce_segments_kernel`` (split-KV).

Launch order. A decode program's work is its context length, and contexts in a
continuous batch are ragged (a few hundred to a few thousand tokens). The GPU starts
programs in grid order as multiprocessors free up, so if a long context happens to come
last, the whole launch waits for it while most SMs idle: the classic makespan problem.
Starting the longest first (the "longest processing time" rule) keeps the last wave
short. The host knows every length, but the order is taken on the device
(``torch.argsort`` of ``seq_lens``, once per step, in ``AttentionMetadata.seq_order``)
so that it sits inside a captured CUDA graph and follows lengths that async scheduling
corrects on the device. The order changes which program runs when, never what one
computes: the output is bitwise the same.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minivllm.attention.triton_attention_helpers import attend_new_tile, attend_tile
from minivllm.attention.triton_decode_split import (
    launch_reduce_segments,
    merge_if_last_segment,
    segment_counters,
)
from minivllm.attention.triton_launch_config import AttentionLaunchConfig
from minivllm.utils.math_utils import next_power_of_2

LOG2_E = 1.4426950408889634
# Triton reads this once at import; the interpreter needs the bf16 dot work-around below.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary search: which sequence owns global q-block ``q_block``.

    Sequence ``s`` owns the q-blocks ``first(s) = query_start_loc[s] // BLOCK_Q + s``
    onwards. ``first`` is strictly increasing in ``s`` (the ``+ s`` reserves one spare
    block per sequence for its ragged end), so the owner is the last ``s`` with
    ``first(s) <= q_block``.
    """
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


# Triton specializes integer arguments on "== 1" and "divisible by 16": the sequence count
# and the block table's width change from step to step, and each new class would compile
# another variant mid-run. The other strides are fixed by the model and the cache.
# Pointers are specialized on 16-byte alignment: a mixed step's chunks are attended as
# views of the batch's per-sequence tensors that start after its decodes (DecodeSplit in
# forward_context.py), at any offset (the launcher also hands ``seq_lens`` in as the unused
# ``seq_order_ptr``); those loads are a few words per program or tile.
@triton.jit(
    do_not_specialize=[
        "num_seqs", "stride_bt_seq", "seq_lens_ptr", "block_table_ptr", "query_start_loc_ptr",
        "seq_order_ptr",
    ]
)  # fmt: skip
def kernel_unified_attention(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    seq_order_ptr,
    key_ptr,
    value_ptr,
    key_desc,
    value_desc,
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
    stride_k_tok: tl.int64,
    stride_v_tok: tl.int64,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    NEW_KV: tl.constexpr,
    SEQ_ORDER: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Attention of one q-block, for one KV head's query-head group, over one KV segment."""
    # Axis 0 enumerates (q-block, KV head) pairs, KV heads fastest: the programs of one
    # q-block run side by side and read neighbouring cache rows (heads are adjacent in a
    # page). The q-blocks are walked backwards, longest first: in a causal prefill the
    # last q-blocks see the most keys, and starting them first keeps the final wave short.
    NUM_KV_HEADS: tl.constexpr = NUM_HEADS // GROUP
    pair = tl.program_id(0)
    kv_head = pair % NUM_KV_HEADS
    q_block = tl.num_programs(0) // NUM_KV_HEADS - 1 - pair // NUM_KV_HEADS
    segment = tl.program_id(1)

    # -- which sequence, and which of its tokens, this program serves ----------------
    if SEQ_ORDER:
        # One q-block per sequence (every query fits BLOCK_Q), sequences in the given
        # order: longest context first (see "Launch order" above).
        seq = tl.load(seq_order_ptr + pair // NUM_KV_HEADS).to(tl.int32)
    else:
        seq = find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if SEQ_ORDER:  # noqa: SIM108 - Triton merges names set in both branches of an if
        local_block = 0
    else:
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
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)  # noqa: E741 - the usual name
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    block_table_row = block_table_ptr + seq * stride_bt_seq
    if NEW_KV == 0:
        # Every key from the paged cache.
        num_tiles = tl.cdiv(kv_end, TILE_N)
        tiles_per_segment = tl.cdiv(num_tiles, NUM_SEGMENTS)
        tile_lo = segment * tiles_per_segment
        tile_hi = tl.minimum(tile_lo + tiles_per_segment, num_tiles)
        # Keys 0 .. (the q-block's first position) are visible to all of its rows: the
        # tiles wholly below that need no mask. Only the last one or two tiles (the
        # diagonal, and the end of the context) do.
        num_full = (context_len + local_block * BLOCK_Q + 1) // TILE_N
        tile_mid = tl.maximum(tile_lo, tl.minimum(tile_hi, num_full))
        cached_end = kv_end
    else:
        # The cached prefix from the paged cache (visible to every row: only its ragged
        # last tile is masked), this step's own keys from the dense key/value tensors.
        tile_lo = 0
        tile_mid = context_len // TILE_N
        tile_hi = tl.cdiv(context_len, TILE_N)
        cached_end = context_len
    for tile in range(tile_lo, tile_mid):
        acc, m, l = attend_tile(  # noqa: E741
            acc, m, l, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, tile, cached_end,
            kv_head, qk_scale, stride_c_block, stride_c_slot, stride_c_head,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_N, False,
            DOT_PRECISION, UPCAST_DOT,
        )
    for tile in range(tile_mid, tile_hi):
        acc, m, l = attend_tile(  # noqa: E741
            acc, m, l, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, tile, cached_end,
            kv_head, qk_scale, stride_c_block, stride_c_slot, stride_c_head,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_N, True,
            DOT_PRECISION, UPCAST_DOT,
        )
    if NEW_KV != 0:
        # The chunk's keys 0 .. new_end - 1; those up to the q-block's first token are
        # visible to all of its rows, the diagonal tiles are masked.
        new_end = kv_end - context_len
        new_full = (local_block * BLOCK_Q + 1) // TILE_N
        for tile in range(0, new_full):
            acc, m, l = attend_new_tile(  # noqa: E741
                acc, m, l, q, tok, key_ptr, value_ptr, key_desc, value_desc, q_start,
                new_end, tile, kv_head, qk_scale, stride_k_tok, stride_v_tok,
                v_cache_ptr.dtype.element_ty, HEAD_SIZE, HEAD_PAD, TILE_N, False,
                NEW_KV == 2, DOT_PRECISION, UPCAST_DOT,
            )
        for tile in range(new_full, tl.cdiv(new_end, TILE_N)):
            acc, m, l = attend_new_tile(  # noqa: E741
                acc, m, l, q, tok, key_ptr, value_ptr, key_desc, value_desc, q_start,
                new_end, tile, kv_head, qk_scale, stride_k_tok, stride_v_tok,
                v_cache_ptr.dtype.element_ty, HEAD_SIZE, HEAD_PAD, TILE_N, True,
                NEW_KV == 2, DOT_PRECISION, UPCAST_DOT,
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
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
) -> None:
    """Launch the unified kernel (and the split-KV reduce) on validated tensors.

    ``key``/``value`` are this step's ``[num_tokens, num_kv_heads, head_size]`` keys and
    values (already written to the cache); a configuration with ``new_kv`` reads the
    chunk's own keys from them instead of the cache. Without them, or when they cannot
    stand in for the cache (another dtype), the cache is read. ``seq_order`` (a
    permutation of the sequences, ``[num_seqs]`` int32/int64) is the order programs serve
    them in; the caller guarantees that no query is longer than ``BLOCK_Q``
    (``config.block_m // group``; the engine passes it for one-token queries only), so
    each sequence is one q-block.
    """
    num_tokens, num_heads, head_size = query.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    num_kv_heads = key_cache.shape[2]
    block_size = key_cache.shape[1]
    group = num_heads // num_kv_heads
    head_pad = next_power_of_2(head_size)
    block_q = config.block_m // group
    segments = config.num_segments
    fused = segments > 1 and config.fused_reduce
    # Upper bound on q-blocks without reading query lengths from the device:
    # sum_s ceil(len_s / BLOCK_Q) <= num_tokens // BLOCK_Q + num_seqs. In a given order,
    # exactly one per sequence.
    q_blocks = num_seqs if seq_order is not None else num_tokens // block_q + num_seqs
    grid = (q_blocks * num_kv_heads, segments)
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
    new_kv = _new_kv_mode(config, key, value, key_cache, head_size, head_pad, segments)
    key_desc = value_desc = None
    if new_kv == 2:
        key_desc = _row_descriptor(key, config.tile_n)
        value_desc = _row_descriptor(value, config.tile_n)
    if new_kv == 0:
        key = value = query  # never read; any tensor serves as the pointer
    kernel_unified_attention[grid](
        out, query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
        seq_lens if seq_order is None else seq_order,  # any tensor serves when unused
        key, value, key_desc, value_desc,
        part_out, part_max, part_sum, counters,
        scale * LOG2_E,  # scores live in the log2 domain so the kernel can use exp2
        num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_table.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        key.stride(0), value.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_SIZE=head_size,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=config.block_m,
        BLOCK_Q=block_q,
        TILE_N=config.tile_n,
        NUM_SEGMENTS=segments,
        FUSED_REDUCE=fused,
        NEW_KV=new_kv,
        SEQ_ORDER=seq_order is not None,
        # float32 runs in exact IEEE mode (tf32 would cost ~1e-3 relative error).
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST_DOT=_INTERPRETED,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if segments > 1 and not fused:
        launch_reduce_segments(out, part_out, part_max, part_sum)


def _new_kv_mode(
    config: AttentionLaunchConfig,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    key_cache: torch.Tensor,
    head_size: int,
    head_pad: int,
    segments: int,
) -> int:
    """The ``NEW_KV`` mode this launch can honour: the configuration's, or 0 (the cache)
    when the step's keys are missing or differ from what the cache holds (a cast on the
    way in), or the launch splits the KV range (segments index absolute tiles)."""
    if config.new_kv == 0 or key is None or value is None or segments > 1:
        return 0
    if key.dtype != key_cache.dtype or value.dtype != key_cache.dtype:
        return 0
    if config.new_kv == 2 and (head_pad != head_size or not _descriptor_ok(key, value)):
        return 1
    return config.new_kv


def _descriptor_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides, and a contiguous head dim."""
    return all(
        t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and (t.data_ptr() % 16 == 0)
        and (t.stride(0) * t.element_size()) % 16 == 0
        for t in tensors
    )


def _row_descriptor(t: torch.Tensor, tile_n: int) -> TensorDescriptor:
    """``t`` (``[tokens, kv_heads, head]``) as a 2-D ``[tokens, kv_heads * head]``
    descriptor whose blocks are ``tile_n`` rows of one head."""
    num_tokens, num_kv_heads, head_size = t.shape
    rows = t.view(num_tokens, num_kv_heads * head_size)
    return TensorDescriptor(rows, list(rows.shape), [rows.stride(0), 1], [tile_n, head_size])
