"""Split-KV ("flash-decoding"): when to cut a long context into segments, and how to merge.

A decode step of one long sequence gives the unified kernel almost nothing to do in
parallel: one program per (q-block, KV head), so a single sequence with 8 KV heads keeps 8
of the H200's 132 multiprocessors busy while 124 idle, and bandwidth collapses. Split-KV
adds a third grid axis: each of ``num_segments`` programs attends over one slice of the
context and writes an *unnormalised* partial result plus its softmax statistics (running
max ``m`` and sum ``l``); :func:`reduce_segments_kernel` then merges the slices exactly.

Upstream counterparts: the 3D mode of ``kernel_unified_attention`` and ``reduce_segments``
in ``vllm/v1/attention/ops/triton_unified_attention.py``; the CUDA ``paged_attention_v2``
kernels are the older form of the same idea.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minivllm.utils.math_utils import cdiv

# A segment shorter than this spends more on its fixed costs (q load, partial write,
# the merge) than it gains from parallelism. Small decode steps are latency-bound and
# gain from short segments (1 x 512: 8.3 us in 8 segments, 11.7 in 4, 26.5 unsplit;
# 8 x 512: 15.6 us in 4, 17.0 in 8; docs/benchmarks/perf2/kernel_variants.json); two
# 64-key tiles keep 8 x 512 at its best count.
MIN_TOKENS_PER_SEGMENT = 128
# Segments at least this long merge in their last program (no reduce launch); shorter
# ones finish together and the separate reduce grid merges them faster
# (docs/benchmarks/perf2/kernel_variants.json).
FUSED_MERGE_MIN_TOKENS = 256
# ... and only up to this many segments. With more, the launch has few sequences and its
# segments finish together (one wave of programs), so the last program's serial merge of
# every partial stands at the end of the critical path: at 1 x 32,768 in 64 segments of
# 512 keys the reduce kernel measured faster than the fused merge on the H200
# (docs/benchmarks/perf2/kernel_variants_s7.json; bench kernel times both side by side).
FUSED_MERGE_MAX_SEGMENTS = 32
# Upper bound on segments; a power of two because the reduce kernel tiles over them.
MAX_SEGMENTS = 64
# Aim for this many programs per multiprocessor so that memory latency is hidden.
TARGET_PROGRAMS_PER_SM = 4
# Multiprocessor count assumed off-GPU (the interpreter); only the heuristic reads it.
CPU_FAKE_SM_COUNT = 8


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a fixed stand-in on the CPU)."""
    if device.type != "cuda":
        return CPU_FAKE_SM_COUNT
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def choose_num_segments(
    num_active_programs: int,
    max_seq_len: int,
    num_sms: int,
    max_segments: int = MAX_SEGMENTS,
    split_below: int | None = None,
) -> int:
    """How many KV segments each (q-block, KV head) gets; 1 means "do not split".

    The rule: split only when the plain grid (``num_active_programs``, one per q-block and
    KV head) is smaller than ``split_below`` programs (default: one per multiprocessor,
    i.e. it cannot fill the GPU), and then use just enough segments to reach
    ``TARGET_PROGRAMS_PER_SM`` programs per multiprocessor, but never so many that a
    segment covers fewer than ``MIN_TOKENS_PER_SEGMENT`` keys. The result is a power of
    two in ``[1, max_segments]``.
    """
    threshold = num_sms if split_below is None else split_below
    if num_active_programs <= 0 or num_active_programs >= threshold:
        return 1
    wanted = cdiv(TARGET_PROGRAMS_PER_SM * num_sms, num_active_programs)
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SEGMENT)
    segments = min(wanted, by_length, max_segments)
    # Round down to a power of two (reduce tiles over segments).
    return 1 << (segments.bit_length() - 1)


@triton.jit
def merge_segments(
    out_row_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    first_part,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """Merge the ``NUM_SEGMENTS`` partials of one (token, query head) into its output row.

    Segment ``s`` holds ``acc_s = sum_j 2^(x_j - m_s) v_j`` and ``l_s = sum_j 2^(x_j - m_s)``
    (log2 domain, see the unified kernel). With ``M = max_s m_s`` the exact result is
    ``sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s``. A segment that saw no visible key
    stored ``m_s = -inf``, so its weight is ``2^-inf = 0``. The loads bypass L1 (``.cg``):
    in the fused merge other programs wrote the partials moments ago.
    """
    segs = tl.arange(0, NUM_SEGMENTS)
    dims = tl.arange(0, HEAD_PAD)
    row = first_part + segs  # [NUM_SEGMENTS]
    seg_max = tl.load(part_max_ptr + row, cache_modifier=".cg")
    seg_sum = tl.load(part_sum_ptr + row, cache_modifier=".cg")
    overall_max = tl.max(seg_max, axis=0)
    weight = tl.exp2(seg_max - overall_max)
    denom = tl.sum(seg_sum * weight, axis=0)
    parts = tl.load(part_out_ptr + row[:, None] * HEAD_PAD + dims[None, :], cache_modifier=".cg")
    acc = tl.sum(parts * weight[:, None], axis=0)
    tl.store(out_row_ptr + dims, acc / denom, mask=dims < HEAD_SIZE)


@triton.jit
def reduce_segments_kernel(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_o_tok: tl.int64,
    stride_o_head: tl.int64,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """One program per (token, query head): merge its segments into the final output."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    merge_segments(
        out_ptr + token * stride_o_tok + head * stride_o_head,
        part_out_ptr, part_max_ptr, part_sum_ptr, (token * NUM_HEADS + head) * NUM_SEGMENTS,
        HEAD_SIZE, HEAD_PAD, NUM_SEGMENTS,
    )


@triton.jit
def merge_if_last_segment(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    counter_ptr,
    q_start,
    q_len,
    local_block,
    kv_head,
    stride_o_tok,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """The fused reduction: the last segment of a (q-block, KV head) to finish merges all.

    Called by every segment program right after it stored its partials. Each takes a
    ticket from the pair's counter; the one that draws ``NUM_SEGMENTS - 1`` knows every
    other segment's partials are written, merges the q-block's rows and resets the counter
    to 0 for the next launch (so a CUDA graph can replay it). This saves the separate
    reduce launch, which costs more than the merge itself in a small decode step.
    """
    # Every thread's stores must be done before the ticket (acquire-release, GPU scope)
    # tells another program they are.
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == NUM_SEGMENTS - 1:
        tl.store(counter_ptr, 0)
        for r in range(BLOCK_Q * GROUP):
            tok = local_block * BLOCK_Q + r // GROUP
            if tok < q_len:
                token = (q_start + tok).to(tl.int64)
                head = kv_head * GROUP + r % GROUP
                merge_segments(
                    out_ptr + token * stride_o_tok + head * stride_o_head,
                    part_out_ptr, part_max_ptr, part_sum_ptr,
                    (token * NUM_HEADS + head) * NUM_SEGMENTS,
                    HEAD_SIZE, HEAD_PAD, NUM_SEGMENTS,
                )


# The fused reduction's tickets: one int32 per (q-block, KV head) program pair, zero
# between launches (the last segment resets its pair). One buffer per device, allocated
# on first use (the start-up warm-up) so that CUDA-graph capture never allocates it;
# launches on one device are assumed to be ordered on one stream, as in the engine.
MIN_COUNTERS = 1 << 16
_counters: dict[str, torch.Tensor] = {}


def segment_counters(device: torch.device, num_pairs: int) -> torch.Tensor:
    """The zeroed ticket counters for ``num_pairs`` program pairs on ``device``."""
    key = str(device)
    counters = _counters.get(key)
    if counters is None or counters.numel() < num_pairs:
        counters = torch.zeros(max(num_pairs, MIN_COUNTERS), dtype=torch.int32, device=device)
        _counters[key] = counters
    return counters


def launch_reduce_segments(
    out: torch.Tensor, part_out: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor
) -> None:
    """Merge ``[tokens, heads, segments(, head_pad)]`` partials into ``out``."""
    num_tokens, num_heads, num_segments, head_pad = part_out.shape
    reduce_segments_kernel[(num_tokens, num_heads)](
        out,
        part_out,
        part_max,
        part_sum,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_SIZE=out.shape[2],
        HEAD_PAD=head_pad,
        NUM_SEGMENTS=num_segments,
    )
