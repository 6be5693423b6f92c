"""Launch configurations of the unified attention kernel: which tiles, warps, pipeline
depth, split-KV segments and kernel variant a batch gets, and the full list the engine
compiles at start-up.

Everything here is decided on the host from shapes alone (no device read, so no sync and
nothing that breaks CUDA-graph capture). Upstream counterparts: ``_get_tile_size`` and
the launch logic of ``unified_attention`` in
``vllm/v1/attention/ops/triton_unified_attention.py``, and the split-KV sizing in
``TritonAttentionMetadataBuilder`` (``vllm/v1/attention/backends/triton_attn.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minivllm.attention.triton_decode_split import (
    FUSED_MERGE_MAX_SEGMENTS,
    FUSED_MERGE_MIN_TOKENS,
    choose_num_segments,
    num_multiprocessors,
)
from minivllm.utils.math_utils import cdiv, next_power_of_2


@dataclass(frozen=True)
class AttentionLaunchConfig:
    """Tile sizes and launch parameters of one ``kernel_unified_attention`` launch."""

    block_m: int  # rows per program: BLOCK_Q tokens x group heads
    tile_n: int  # keys per inner-loop iteration
    num_warps: int
    num_stages: int
    num_segments: int  # 1 = no split-KV
    fused_reduce: bool = False  # split-KV: the last segment merges (no reduce launch)
    # Where a prefill reads the chunk's own keys: 0 = the paged cache, 1 = this step's
    # dense key/value tensors by pointers, 2 = the same through tensor descriptors (TMA).
    new_kv: int = 0


# Tuned on an H200 (see docs/benchmarks/kernel.json and the PagedAttention chapter).
DECODE_TILE_N, DECODE_WARPS, DECODE_STAGES = 64, 4, 2
# From this many sequences on, a decode-sized launch in batch order uses longer key tiles
# with a deeper pipeline: with ragged contexts (a continuous batch) they are 6-14% faster,
# with equal contexts within 1-3% (docs/benchmarks/kernel_sweep_ragged.json). First set
# at 128, where 64 x 2,048 equal contexts had shown the long tiles slower; at 96 sequences
# of 800 to 2,000 tokens they took 0.93x the time, at 64 still more than the short ones
# (docs/benchmarks/perf3/kernel_sweep_workload.json). What they won was the last wave:
# one such program fits an SM, so a long context started late kept one SM busy alone.
# A decode batch launched longest first (``ordered``, see "Launch order" in
# triton_unified_attention.py) has no such wave, and there the short tiles, three
# programs to an SM, are the fastest candidate from 96 sequences up or within 1% of it
# (docs/benchmarks/perf5/kernel_sweep_decode*.json): it keeps them.
DECODE_LARGE_BATCH = 96
DECODE_LARGE_TILE_N, DECODE_LARGE_WARPS, DECODE_LARGE_STAGES = 128, 4, 3
# A decode-sized batch in batch order is split into KV segments while it has fewer
# programs than DECODE_SPLIT_PROGRAMS_PER_SM per SM; a decode batch launched longest
# first, while it has fewer than ORDERED_DECODE_SPLIT_PROGRAMS_PER_SM (see select_config).
DECODE_SPLIT_PROGRAMS_PER_SM = 2
ORDERED_DECODE_SPLIT_PROGRAMS_PER_SM = 4
PREFILL_BLOCK_M, PREFILL_TILE_N, PREFILL_WARPS, PREFILL_STAGES = 128, 128, 8, 2
# Prefills whose sequences are all at most this long use smaller tiles. A prompt of a few
# hundred tokens gives each program a loop of a few key tiles, too short for the deep
# pipeline to pay for itself, and the 128 x 128 tiles' shared memory leaves room for one
# program per SM, so many short programs run in many waves. On the throughput workload's
# mixed steps (240 decodes beside prompt chunks of 100 to 1,024 tokens) the small tiles
# take about 0.6x the time; on 4 x 4,096 they are on par, on 1 x 8,192 slower
# (docs/benchmarks/perf3/kernel_sweep_workload.json).
PREFILL_SHORT_MAX_SEQ_LEN = 4096
PREFILL_SHORT_BLOCK_M, PREFILL_SHORT_TILE_N, PREFILL_SHORT_WARPS, PREFILL_SHORT_STAGES = (
    64, 64, 4, 3,
)
# Above this query length a q-block uses the prefill tile.
PREFILL_MIN_QUERY_LEN = 32
# A prefill whose chunk keys come through TMA descriptors keeps three K/V tiles in flight:
# 546 / 481 TFLOP/s on 1 x 8,192 / 4 x 4,096 against 443 / 416 with two, and against
# 397 / 375 for the previous default, 256 x 64 tiles through the block table
# (docs/benchmarks/perf2/kernel_variants3.json).
PREFILL_DENSE_STAGES = 3
# Where a prefill-sized launch (no split-KV) reads each chunk's own keys: 0 = the paged
# cache, 1 = this step's dense key/value tensors by pointers, 2 = the same through TMA
# tensor descriptors (Hopper; 1 elsewhere). The cached prefix always comes through the
# block table.
PREFILL_NEW_KV = 2
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
    ordered: bool = False,
) -> AttentionLaunchConfig:
    """Pick tiles and the split-KV segment count from host-side sizes only (no sync).

    Decode-like batches (short queries) use the smallest row tile the tensor cores
    accept, 16 rows, because only ``group`` rows per sequence carry a real query, with
    longer key tiles from ``DECODE_LARGE_BATCH`` sequences on unless the batch is
    ``ordered`` (a decode batch launched longest context first); long queries use 128-row
    tiles to reuse each K/V tile across many queries (64-row tiles with 64 keys while no
    sequence is longer than ``PREFILL_SHORT_MAX_SEQ_LEN``), and read their chunk's own
    keys from this step's dense key/value tensors (``new_kv``) unless they split. Split-KV
    is chosen by :func:`choose_num_segments` unless ``num_kv_splits`` forces it.
    """
    group = num_heads // num_kv_heads
    head_pad = next_power_of_2(head_size)
    block_m, tile_n, warps, stages = _family_tiles(max_query_len, num_seqs, max_seq_len, ordered)
    block_m = max(block_m, next_power_of_2(group))
    if num_kv_splits is None:
        active = max(num_seqs, cdiv(num_tokens, block_m // group)) * num_kv_heads
        sms = num_multiprocessors(device)
        # A decode batch splits until it has DECODE_SPLIT_PROGRAMS_PER_SM programs per SM,
        # not just one: at 32 sequences of 800 to 2,000 tokens (256 programs on 132 SMs)
        # two segments took about 0.75x the time of one; at 64 (512 programs) splitting
        # no longer paid (docs/benchmarks/perf3/kernel_sweep_workload.json). Launched
        # longest first, two segments still pay at 48 and 64 sequences (0.92x and 0.93x
        # the time, docs/benchmarks/perf5/kernel_sweep_decode.json), hence the higher
        # threshold. A prefill keeps the plain rule: splitting it gives up reading its
        # chunk's keys densely.
        decode = max_query_len < PREFILL_MIN_QUERY_LEN
        per_sm = ORDERED_DECODE_SPLIT_PROGRAMS_PER_SM if ordered else DECODE_SPLIT_PROGRAMS_PER_SM
        segments = choose_num_segments(
            active, max_seq_len, sms, split_below=per_sm * sms if decode else None
        )
    else:
        segments = num_kv_splits
    # A prefill-sized launch without split-KV reads each chunk's own keys densely:
    # through TMA where the tile is a whole 16-bit head (what was measured), else by
    # pointers.
    new_kv = 0
    if max_query_len >= PREFILL_MIN_QUERY_LEN and segments == 1:
        new_kv = PREFILL_NEW_KV
        if new_kv == 2 and not (
            tma_available(device) and head_pad == head_size and element_size <= 2
        ):
            new_kv = 1
        if new_kv == 2:
            stages = PREFILL_DENSE_STAGES
    # Large heads or float32 would overflow shared memory with the bf16/d128 tiles tuned
    # above: halve the key tile, then the pipeline depth, until the stages fit.
    kv_tile_bytes = 2 * head_pad * element_size  # K + V, per key
    budget = smem_budget(device)
    while stages * tile_n * kv_tile_bytes > budget and tile_n > 16:
        tile_n //= 2
    while stages * tile_n * kv_tile_bytes > budget and stages > 1:
        stages -= 1
    # The fused merge runs in the last program of each (q-block, KV head), row after row:
    # it hides behind the other programs when segments are long, but with short ones, or
    # with very many that all finish together, it lengthens the critical path more than
    # the separate reduce launch it saves.
    fused = (
        1 < segments <= FUSED_MERGE_MAX_SEGMENTS
        and max_query_len < PREFILL_MIN_QUERY_LEN
        and num_seqs < DECODE_LARGE_BATCH
        and max_seq_len // segments >= FUSED_MERGE_MIN_TOKENS
    )
    return AttentionLaunchConfig(block_m, tile_n, warps, stages, segments, fused, new_kv)


def tma_available(device: torch.device) -> bool:
    """Whether tensor descriptors can be used: Hopper or newer (the interpreter emulates
    them, so the CPU tests run the same path)."""
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] >= 9


def _family_tiles(
    max_query_len: int, num_seqs: int, max_seq_len: int, ordered: bool = False
) -> tuple[int, int, int, int]:
    """``(block_m, tile_n, num_warps, num_stages)`` of the batch's tile family."""
    if max_query_len >= PREFILL_MIN_QUERY_LEN:
        if max_seq_len <= PREFILL_SHORT_MAX_SEQ_LEN:
            return (PREFILL_SHORT_BLOCK_M, PREFILL_SHORT_TILE_N, PREFILL_SHORT_WARPS,
                    PREFILL_SHORT_STAGES)
        return PREFILL_BLOCK_M, PREFILL_TILE_N, PREFILL_WARPS, PREFILL_STAGES
    if num_seqs >= DECODE_LARGE_BATCH and not ordered:
        return 16, DECODE_LARGE_TILE_N, DECODE_LARGE_WARPS, DECODE_LARGE_STAGES
    return 16, DECODE_TILE_N, DECODE_WARPS, DECODE_STAGES


def launch_configs(
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    element_size: int,
    max_model_len: int,
    device: torch.device,
    ordered: bool = False,
) -> list[AttentionLaunchConfig]:
    """Every configuration :func:`select_config` can return for one model: each tile
    family (small-batch decode, large-batch decode, short and long prefill) with each
    split-KV segment count the heuristic can choose for contexts up to ``max_model_len``.
    With ``ordered``, those of decode batches launched in a given sequence order (one
    family, with each segment count).

    Each is a separate compiled kernel (tiles and segments are ``tl.constexpr``), so the
    engine compiles them all while it starts rather than in the middle of a request.
    """
    # One active program is the emptiest grid, so it gets the most segments.
    most = choose_num_segments(1, max_model_len, num_multiprocessors(device))
    families = (
        ((1, 1),) if ordered else ((1, 1), (1, DECODE_LARGE_BATCH), (PREFILL_MIN_QUERY_LEN, 1))
    )
    configs = []
    for max_query_len, num_seqs in families:
        for log_segments in range(most.bit_length()):
            # The longest and the shortest context: long segments (fused merge), short ones.
            for max_seq_len in (max_model_len, 1):
                config = select_config(
                    num_tokens=num_seqs * max_query_len,
                    num_seqs=num_seqs,
                    num_heads=num_heads,
                    num_kv_heads=num_kv_heads,
                    max_query_len=max_query_len,
                    max_seq_len=max_seq_len,
                    device=device,
                    num_kv_splits=1 << log_segments,
                    head_size=head_size,
                    element_size=element_size,
                    ordered=ordered,
                )
                if config not in configs:
                    configs.append(config)
    return configs
