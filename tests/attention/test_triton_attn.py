"""The Triton kernels equal the torch oracle (reference.py).

Runs on the CPU through ``TRITON_INTERPRET=1`` (set by tests/conftest.py) and natively on
a GPU; nothing here is CPU-only. The interpreter executes every Triton op in numpy, one
program at a time, on two shared cores, so the shapes are tiny and the grid is chosen,
not multiplied out: ``CASES`` covers every value of every axis (block size, head size,
GQA ratio, batch kind, dtype, split-KV) at least once, and mixes them so that each axis
also meets several values of the others.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention import reference
from minivllm.attention import triton_launch_config as tlc
from minivllm.attention import triton_unified_attention as tua
from minivllm.attention.backends import triton_attn
from minivllm.attention.triton_decode_split import (
    CPU_FAKE_SM_COUNT,
    FUSED_MERGE_MAX_SEGMENTS,
    FUSED_MERGE_MIN_TOKENS,
    MAX_SEGMENTS,
    MIN_TOKENS_PER_SEGMENT,
    choose_num_segments,
)
from minivllm.attention.triton_launch_config import launch_configs, select_config
from tests.attention.paged_batch import PagedBatch, make_paged_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Batch kinds as [(cached context, new query tokens), ...] per sequence.
BATCHES = {
    "decode": [(37, 1), (5, 1), (70, 1)],
    "prefill": [(0, 23), (0, 40)],  # 40 >= 32 selects the prefill-sized tiles
    "chunked": [(29, 11), (48, 6)],  # a chunk of a prompt on top of its cached prefix
    "mixed": [(33, 1), (0, 13), (21, 9), (0, 1)],  # all three kinds in one ragged batch
    "long_decode": [(1100, 1)],  # long enough that automatic split-KV kicks in
}

# Tolerances, compared in float32 against the float32 oracle:
# - float32: the kernel runs IEEE float32 dots (no tf32) and float32 softmax; only the
#   summation order and exp2-vs-exp differ, which moves results by ~1e-6. 1e-4 keeps a
#   wide margin while any indexing mistake (a wrong block, a masked key let through)
#   changes outputs by O(0.1..1).
# - bfloat16: the output is rounded to bf16 (relative step 2^-8 ~ 0.4%), and the softmax
#   weights P are rounded to bf16 before P @ V, as in FlashAttention; outputs are O(1),
#   so a few bf16 steps is ~2e-2.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

# (block_size, head_size, group, num_kv_heads, batch, dtype, num_kv_splits, pass_hints)
# num_kv_splits: 1 = split-KV forced off, 2/4 = forced on, None = automatic.
CASES = [
    (8, 64, 1, 2, "decode", torch.float32, 1, True),
    (16, 128, 2, 2, "prefill", torch.bfloat16, 1, True),
    (32, 96, 4, 1, "chunked", torch.float32, 4, False),
    (16, 64, 8, 1, "mixed", torch.bfloat16, 4, True),
    (8, 96, 2, 1, "mixed", torch.float32, 1, False),
    (32, 64, 2, 2, "decode", torch.bfloat16, 4, False),
    (8, 128, 4, 1, "chunked", torch.bfloat16, 2, True),
    (32, 128, 8, 1, "prefill", torch.float32, 2, False),
    (16, 80, 1, 2, "mixed", torch.bfloat16, None, True),
    (16, 64, 4, 1, "long_decode", torch.bfloat16, None, True),
    (32, 96, 2, 1, "long_decode", torch.float32, 1, False),
]


def _case_id(case: tuple) -> str:
    bs, d, g, kvh, batch, dtype, splits, hints = case
    dt = "bf16" if dtype == torch.bfloat16 else "fp32"
    hint = "hints" if hints else "nohints"
    return f"bs{bs}-d{d}-gqa{g}-kvh{kvh}-{batch}-{dt}-split{splits}-{hint}"


def _check_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "an output element was never written (still NaN)"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def _write_cache_both_ways(b: PagedBatch) -> None:
    """Write K/V with the Triton op and with the oracle (on copies); caches must be equal."""
    ref_k, ref_v = b.key_cache.clone(), b.value_cache.clone()
    reference.reshape_and_cache(b.key, b.value, ref_k, ref_v, b.slot_mapping)
    triton_attn.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping)
    assert torch.equal(b.key_cache, ref_k)
    assert torch.equal(b.value_cache, ref_v)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_cache_write_and_attention_match_reference(case: tuple) -> None:
    bs, d, g, kvh, batch, dtype, splits, hints = case
    b = make_paged_batch(BATCHES[batch], block_size=bs, num_kv_heads=kvh, group=g,
                         head_size=d, dtype=dtype, device=DEVICE, seed=CASES.index(case))
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    out = torch.full_like(b.query, float("nan"))  # poison: unwritten elements stay NaN
    hint_kwargs = {"max_query_len": b.max_query_len, "max_seq_len": b.max_seq_len} if hints \
        else {}
    result = triton_attn.paged_attention(
        b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.query_start_loc,
        b.scale, out=out, num_kv_splits=splits, **hint_kwargs,
    )
    assert result is out
    _check_close(out, ref, dtype)


def test_paged_attention_allocates_output_when_none_given() -> None:
    b = make_paged_batch(BATCHES["mixed"], block_size=16, num_kv_heads=1, group=2,
                         head_size=64, dtype=torch.float32, device=DEVICE, seed=7)
    out = triton_attn.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                     b.seq_lens, b.query_start_loc, b.scale)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    _check_close(out, ref, torch.float32)


def test_reshape_and_cache_skips_negative_slots_and_casts() -> None:
    # float32 activations into a bf16 cache; tokens 1 and 3 are padding (slot -1).
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(5, 2, 96, generator=gen).to(DEVICE)
    value = torch.randn(5, 2, 96, generator=gen).to(DEVICE)
    key_cache = torch.randn(4, 8, 2, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
    value_cache = torch.randn(4, 8, 2, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
    slots = torch.tensor([17, -1, 3, -1, 30], device=DEVICE)
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    before = key_cache.clone()
    reference.reshape_and_cache(key, value, ref_k, ref_v, slots)
    triton_attn.reshape_and_cache(key, value, key_cache, value_cache, slots)
    # Natively the store rounds to nearest-even, exactly like torch's .to(); the Triton
    # interpreter truncates float32 -> bf16 instead, so there allow one bf16 step (2^-7).
    tol = 0.0 if DEVICE == "cuda" else 2.0**-7
    torch.testing.assert_close(key_cache, ref_k, atol=0.0, rtol=tol)
    torch.testing.assert_close(value_cache, ref_v, atol=0.0, rtol=tol)
    flat = key_cache.view(32, 2, 96)
    changed = (flat != before.view(32, 2, 96)).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert changed == [3, 17, 30]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query": torch.randn(3, 4, 32)}, "query must be"),
        ({"query": torch.randn(3, 3, 64)}, "multiple of num_kv_heads"),
        ({"seq_lens": torch.tensor([4.0, 5.0])}, "seq_lens"),
        ({"num_kv_splits": 3}, "num_kv_splits"),
        ({"value_cache": torch.randn(4, 8, 2, 32)}, "value_cache"),
        ({"out": torch.empty(3, 4, 32)}, "out must match"),
        ({"seq_order": torch.tensor([1, 0, 2])}, "seq_order"),
        ({"seq_order": torch.tensor([1.0, 0.0])}, "seq_order"),
    ],
)
def test_paged_attention_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    args = {
        "query": torch.randn(3, 4, 64),
        "key_cache": torch.randn(4, 8, 2, 64),
        "value_cache": torch.randn(4, 8, 2, 64),
        "block_table": torch.zeros(2, 2, dtype=torch.int32),
        "seq_lens": torch.tensor([4, 5], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 1, 3], dtype=torch.int32),
        "scale": 0.125,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        triton_attn.paged_attention(**args)


def test_reshape_and_cache_rejects_bad_slot_mapping() -> None:
    key = torch.randn(3, 2, 64)
    cache = torch.randn(4, 8, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping"):
        triton_attn.reshape_and_cache(key, key, cache, cache.clone(), torch.zeros(2).long())


def test_split_heuristic() -> None:
    sms = 132
    # Plenty of programs already: never split.
    assert choose_num_segments(64 * 8, 8192, sms) == 1
    # One long sequence, 8 KV heads: about TARGET_PROGRAMS_PER_SM programs per SM.
    assert choose_num_segments(8, 32768, sms) == 64
    # Eight sequences: 64 programs already, so fewer segments.
    assert choose_num_segments(64, 32768, sms) == 8
    # Short context: segments of at least MIN_TOKENS_PER_SEGMENT keys.
    assert choose_num_segments(8, 4 * MIN_TOKENS_PER_SEGMENT, sms) == 4
    assert choose_num_segments(8, MIN_TOKENS_PER_SEGMENT, sms) == 1
    # The automatic choice for the "long_decode" test batch on the CPU really splits.
    config = select_config(num_tokens=1, num_seqs=1, num_heads=4, num_kv_heads=1,
                           max_query_len=1, max_seq_len=1101, device=torch.device("cpu"))
    assert config.num_segments == 8
    # Results are powers of two.
    for active in range(1, sms):
        n = choose_num_segments(active, 1 << 20, sms)
        assert n & (n - 1) == 0
    # A raised threshold splits grids that fill the GPU once but not four times.
    assert choose_num_segments(256, 2000, sms, split_below=4 * sms) == 2
    assert choose_num_segments(4 * sms, 2000, sms, split_below=4 * sms) == 1


def test_decode_batches_split_until_two_programs_per_sm(monkeypatch) -> None:
    """select_config raises the threshold for decode batches only: 32 sequences of 8 KV
    heads (256 programs, 132 SMs) split in two, 64 do not; a prefill with as many programs
    does not (it would give up reading its chunk's keys densely)."""
    monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: 132)
    kwargs = dict(num_heads=16, num_kv_heads=8, max_seq_len=2000, device=torch.device("cpu"))
    decode = select_config(num_tokens=32, num_seqs=32, max_query_len=1, **kwargs)
    assert decode.num_segments == 2 and decode.fused_reduce
    assert select_config(num_tokens=64, num_seqs=64, max_query_len=1,
                         **kwargs).num_segments == 1
    prefill = select_config(num_tokens=1024, num_seqs=1, max_query_len=1024, **kwargs)
    assert prefill.num_segments == 1 and prefill.new_kv != 0


def test_a_decode_batch_in_longest_first_order_keeps_the_short_tiles(monkeypatch) -> None:
    """Launched longest first, a decode batch keeps the 64-key tiles at every size (the
    long tiles won only the last wave, which the order removes) and splits until four
    programs per SM: 48 sequences of 8 KV heads on 132 SMs split in two, 72 do not. In
    batch order the same batches keep the long tiles and the two-per-SM rule."""
    monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: 132)
    monkeypatch.setattr(tlc, "smem_budget", lambda device: 227 * 1024)
    kwargs = dict(num_heads=16, num_kv_heads=8, max_query_len=1, max_seq_len=2000,
                  device=torch.device("cpu"))
    for ordered, tiles in ((True, (64, 2)), (False, (128, 3))):
        big = select_config(num_tokens=256, num_seqs=256, ordered=ordered, **kwargs)
        assert (big.tile_n, big.num_stages, big.num_segments) == (*tiles, 1)
    assert select_config(num_tokens=48, num_seqs=48, ordered=True, **kwargs).num_segments == 2
    assert select_config(num_tokens=48, num_seqs=48, **kwargs).num_segments == 1
    assert select_config(num_tokens=72, num_seqs=72, ordered=True, **kwargs).num_segments == 1


def test_large_batch_decode_config(monkeypatch) -> None:
    """From DECODE_LARGE_BATCH sequences on, decode in batch order uses the long-tile
    configuration (where shared memory allows it), and that configuration is exact on a
    ragged batch."""
    kwargs = dict(num_heads=16, num_kv_heads=8, max_query_len=1, max_seq_len=4096)
    small = select_config(num_tokens=64, num_seqs=64, device=torch.device(DEVICE), **kwargs)
    assert (small.tile_n, small.num_stages) == (64, 2)
    monkeypatch.setattr(tlc, "smem_budget", lambda device: 227 * 1024)
    big = select_config(num_tokens=256, num_seqs=256, device=torch.device(DEVICE), **kwargs)
    assert (big.tile_n, big.num_warps, big.num_stages) == (128, 4, 3)
    monkeypatch.setattr(tlc, "smem_budget", lambda device: 160 * 1024)
    fitted = select_config(num_tokens=256, num_seqs=256, device=torch.device(DEVICE), **kwargs)
    assert (fitted.tile_n, fitted.num_stages) == (64, 3)  # halved to fit the budget

    b = make_paged_batch([(150, 1), (7, 1), (260, 1), (64, 1)], block_size=16,
                         num_kv_heads=2, group=2, head_size=64, dtype=torch.float32,
                         device=DEVICE, seed=5)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    out = torch.full_like(b.query, float("nan"))
    tua.launch_unified_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                 b.seq_lens, b.query_start_loc, out, b.scale,
                                 tlc.AttentionLaunchConfig(16, 128, 4, 3, 1))
    _check_close(out, ref, torch.float32)


def test_ops_are_registered_and_pass_opcheck() -> None:
    b = make_paged_batch([(9, 3), (0, 2)], block_size=8, num_kv_heads=1, group=2,
                         head_size=64, dtype=torch.float32, device=DEVICE, seed=11)
    out = torch.empty_like(b.query)
    # Schema, fake (meta) implementation and functionalization checks from torch.
    torch.library.opcheck(
        torch.ops.minivllm.paged_attention.default,
        (b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.query_start_loc,
         out, b.scale, b.max_query_len, b.max_seq_len, None),
        test_utils=("test_schema", "test_faketensor"),
    )
    # With this step's key/value (optional tensors in the schema).
    torch.library.opcheck(
        torch.ops.minivllm.paged_attention.default,
        (b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.query_start_loc,
         out, b.scale, b.max_query_len, b.max_seq_len, None, b.key, b.value),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.minivllm.reshape_and_cache.default,
        (b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_ops_compose_with_torch_compile() -> None:
    b = make_paged_batch(BATCHES["mixed"], block_size=8, num_kv_heads=1, group=2,
                         head_size=64, dtype=torch.float32, device=DEVICE, seed=5)
    ref_k, ref_v = b.key_cache.clone(), b.value_cache.clone()
    reference.reshape_and_cache(b.key, b.value, ref_k, ref_v, b.slot_mapping)
    ref = reference.paged_attention(b.query, ref_k, ref_v, b.block_table, b.seq_lens,
                                    b.query_start_loc, b.scale)

    def step(q, k, v, k_cache, v_cache, slots, table, lens, starts):
        triton_attn.reshape_and_cache(k, v, k_cache, v_cache, slots)
        return triton_attn.paged_attention(q, k_cache, v_cache, table, lens, starts, b.scale,
                                          max_query_len=13, max_seq_len=33) * 2.0

    # aot_eager traces through the fake implementations and functionalizes the in-place
    # cache write, without needing a C++ compiler for Inductor on the CPU.
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = compiled(b.query, b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping,
                   b.block_table, b.seq_lens, b.query_start_loc)
    assert torch.equal(b.key_cache, ref_k)  # the mutation survived functionalization
    _check_close(out, ref * 2.0, torch.float32)


@pytest.mark.gpu
def test_ops_replay_in_a_cuda_graph() -> None:
    b = make_paged_batch([(300, 1), (41, 1), (1000, 1)], block_size=16, num_kv_heads=2,
                         group=4, head_size=128, dtype=torch.bfloat16, device="cuda", seed=9)
    out = torch.full_like(b.query, float("nan"))

    def step() -> None:
        triton_attn.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache,
                                     b.slot_mapping)
        # The launch order is sorted inside the graph, as AttentionMetadata.seq_order is.
        order = torch.argsort(b.seq_lens, descending=True)
        triton_attn.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                   b.seq_lens, b.query_start_loc, b.scale, out=out,
                                   max_query_len=1, max_seq_len=4096, seq_order=order)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm up: compile the kernels outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # New inputs in the captured buffers, then replay.
    b.query.copy_(torch.randn_like(b.query))
    b.key.copy_(torch.randn_like(b.key))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_k, ref_v = b.key_cache.clone(), b.value_cache.clone()
    reference.reshape_and_cache(b.key, b.value, ref_k, ref_v, b.slot_mapping)
    assert torch.equal(ref_k, b.key_cache)
    ref = reference.paged_attention(b.query, ref_k, ref_v, b.block_table, b.seq_lens,
                                    b.query_start_loc, b.scale)
    _check_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("sms", [None, 132], ids=["cpu-sms", "h200-sms"])
@pytest.mark.parametrize("heads", [(16, 8, 128), (32, 8, 128), (8, 8, 64)])
def test_warm_up_covers_every_config_select_config_returns(heads: tuple, sms, monkeypatch) -> None:
    """The start-up warm-up compiles launch_configs(); a config the heuristics can pick
    outside that list would compile in the middle of a run. Also with an H200's
    multiprocessor count and a long context, where small decode batches split many ways
    and both merges are chosen."""
    num_heads, num_kv_heads, head_size = heads
    device = torch.device("cpu")
    max_model_len = 8192
    if sms is not None:
        monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: sms)
        max_model_len = 32768
    configs = launch_configs(num_heads=num_heads, num_kv_heads=num_kv_heads,
                             head_size=head_size, element_size=2,
                             max_model_len=max_model_len, device=device)
    assert len(configs) == len(set(configs))
    ordered_configs = launch_configs(num_heads=num_heads, num_kv_heads=num_kv_heads,
                                    head_size=head_size, element_size=2,
                                    max_model_len=max_model_len, device=device,
                                    ordered=True)
    assert set(ordered_configs) < set(configs)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        num_seqs = int(torch.randint(1, 300, (1,), generator=gen))
        max_query_len = int(torch.randint(1, 600, (1,), generator=gen)) if num_seqs % 3 else 1
        num_tokens = num_seqs + max_query_len - 1
        max_seq_len = int(torch.randint(max_query_len, max_model_len + 1, (1,), generator=gen))
        config = select_config(num_tokens=num_tokens, num_seqs=num_seqs, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, max_query_len=max_query_len,
                               max_seq_len=max_seq_len, device=device, head_size=head_size,
                               element_size=2)
        assert config in configs, (num_tokens, num_seqs, max_query_len, max_seq_len, config)
        if max_query_len == 1:  # a decode batch also runs in its seq_order
            ordered = select_config(num_tokens=num_tokens, num_seqs=num_seqs,
                                    num_heads=num_heads, num_kv_heads=num_kv_heads,
                                    max_query_len=1, max_seq_len=max_seq_len, device=device,
                                    head_size=head_size, element_size=2, ordered=True)
            assert ordered in ordered_configs, (num_seqs, max_seq_len, ordered)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-merge", "reduce-kernel"])
def test_both_split_kv_merges_match_reference(fused: bool) -> None:
    """Split-KV merged by the last segment (atomic tickets) and by the reduce kernel, on a
    ragged batch with every kind of row (decode-sized tiles, so chunks span q-blocks)."""
    b = make_paged_batch([(45, 1), (0, 7), (21, 19)], block_size=8, num_kv_heads=1,
                         group=2, head_size=64, dtype=torch.bfloat16, device=DEVICE, seed=13)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    for _ in range(2):  # the second launch finds the tickets reset by the first
        out = torch.full_like(b.query, float("nan"))
        tua.launch_unified_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                     b.seq_lens, b.query_start_loc, out, b.scale,
                                     tlc.AttentionLaunchConfig(16, 16, 4, 2, 4, fused))
        _check_close(out, ref, torch.bfloat16)


def test_fused_merge_only_for_long_decode_segments(monkeypatch) -> None:
    # One KV head: a single sequence leaves the grid nearly empty, so it always splits.
    # The interpreter's SM count on every device: with an H200's 132 SMs the long context
    # would take MAX_SEGMENTS segments, which merge in the reduce kernel (next test).
    monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: CPU_FAKE_SM_COUNT)
    kwargs = dict(num_heads=2, num_kv_heads=1, device=torch.device(DEVICE))
    long = select_config(num_tokens=1, num_seqs=1, max_query_len=1, max_seq_len=32768,
                         **kwargs)
    short = select_config(num_tokens=1, num_seqs=1, max_query_len=1, max_seq_len=512,
                          **kwargs)
    prefill = select_config(num_tokens=64, num_seqs=1, max_query_len=64, max_seq_len=32768,
                            **kwargs)
    assert long.num_segments > 1 and long.fused_reduce
    assert short.num_segments > 1 and not short.fused_reduce
    assert prefill.num_segments > 1 and not prefill.fused_reduce


def test_many_segments_merge_in_the_reduce_kernel(monkeypatch) -> None:
    """One long sequence on an H200-sized GPU splits into MAX_SEGMENTS segments, all
    finishing together: the reduce kernel merges them (FUSED_MERGE_MAX_SEGMENTS). Four
    sequences as long split fewer ways and keep the fused merge; the start-up list holds
    both."""
    monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: 132)
    kwargs = dict(num_heads=16, num_kv_heads=8, max_query_len=1, max_seq_len=32768,
                  device=torch.device(DEVICE))
    one = select_config(num_tokens=1, num_seqs=1, **kwargs)
    assert one.num_segments == MAX_SEGMENTS > FUSED_MERGE_MAX_SEGMENTS
    assert 32768 // one.num_segments >= FUSED_MERGE_MIN_TOKENS and not one.fused_reduce
    four = select_config(num_tokens=4, num_seqs=4, **kwargs)
    assert 1 < four.num_segments <= FUSED_MERGE_MAX_SEGMENTS and four.fused_reduce
    configs = launch_configs(num_heads=16, num_kv_heads=8, head_size=128, element_size=2,
                             max_model_len=32768, device=torch.device(DEVICE))
    assert one in configs and four in configs


def test_long_prefills_read_their_chunk_through_tma_and_match_reference() -> None:
    """A prefill that does not split reads its chunk's keys through tensor descriptors
    with the deeper pipeline (exact on q-blocks that cross the diagonal mid-tile, over a
    prefix), with the small tiles when every sequence is short and the 128 x 128 tiles
    when one is long; one that splits reads the cache with the plain prefill tile."""
    b = make_paged_batch([(0, 130), (20, 140)], block_size=16, num_kv_heads=1, group=2,
                         head_size=64, dtype=torch.bfloat16, device=DEVICE, seed=17)
    kwargs = dict(num_heads=2, num_kv_heads=1, max_query_len=140, max_seq_len=160,
                  device=torch.device(DEVICE), head_size=64, element_size=2)
    config = select_config(num_tokens=270, num_seqs=2, num_kv_splits=1, **kwargs)
    if tlc.tma_available(torch.device(DEVICE)):  # Hopper, or the interpreter
        assert config.new_kv == 2 and config.num_stages == tlc.PREFILL_DENSE_STAGES
    assert (config.block_m, config.tile_n) == (tlc.PREFILL_SHORT_BLOCK_M,
                                               tlc.PREFILL_SHORT_TILE_N)
    long = select_config(num_tokens=270, num_seqs=2, num_kv_splits=1,
                         **{**kwargs, "max_seq_len": tlc.PREFILL_SHORT_MAX_SEQ_LEN + 1})
    assert (long.block_m, long.tile_n) == (tlc.PREFILL_BLOCK_M, tlc.PREFILL_TILE_N)
    assert long.new_kv == config.new_kv
    split = select_config(num_tokens=270, num_seqs=2, num_kv_splits=2, **kwargs)
    assert split.new_kv == 0 and split.num_stages == tlc.PREFILL_SHORT_STAGES
    # float32 caches and padded heads were not measured through TMA: pointers.
    assert select_config(num_tokens=270, num_seqs=2, num_kv_splits=1,
                         **{**kwargs, "element_size": 4}).new_kv == 1
    assert select_config(num_tokens=270, num_seqs=2, num_kv_splits=1,
                         **{**kwargs, "head_size": 80}).new_kv == 1
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    for cfg in (config, long, split):
        out = torch.full_like(b.query, float("nan"))
        tua.launch_unified_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                     b.seq_lens, b.query_start_loc, out, b.scale, cfg,
                                     key=b.key, value=b.value)
        _check_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("new_kv", [1, 2], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("batch", ["prefill", "chunked", "mixed"])
def test_chunk_keys_read_from_the_step_match_reference(batch: str, new_kv: int,
                                                       monkeypatch) -> None:
    """With this step's key/value given, the chunk's own keys come from them (by pointers
    or tensor descriptors), the cached prefix through the block table: exact on whole
    prefills, chunks over a prefix (tiles straddle the prefix's end) and mixed batches."""
    dtype = torch.bfloat16 if new_kv == 2 else torch.float32
    b = make_paged_batch(BATCHES[batch], block_size=8, num_kv_heads=2, group=2,
                         head_size=64, dtype=dtype, device=DEVICE, seed=23)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    modes = []
    real_mode = tua._new_kv_mode
    monkeypatch.setattr(tua, "_new_kv_mode", lambda *a: modes.append(real_mode(*a)) or modes[-1])
    out = torch.full_like(b.query, float("nan"))
    tua.launch_unified_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                 b.seq_lens, b.query_start_loc, out, b.scale,
                                 tlc.AttentionLaunchConfig(32, 16, 4, 2, 1, new_kv=new_kv),
                                 key=b.key, value=b.value)
    assert modes == [new_kv]
    _check_close(out, ref, dtype)


def test_prefills_read_the_step_keys_through_the_backend(monkeypatch) -> None:
    """select_config gives prefill-sized launches without split-KV the dense mode, and
    paged_attention forwards key/value to it; decode launches and split ones read the
    cache; a key that the cache write cast (float32 into bf16) falls back to the cache."""
    monkeypatch.setattr(tlc, "PREFILL_NEW_KV", 2)
    kwargs = dict(num_heads=4, num_kv_heads=2, device=torch.device(DEVICE), head_size=64)
    prefill = select_config(num_tokens=63, num_seqs=2, max_query_len=40, max_seq_len=40,
                            num_kv_splits=1, **kwargs)
    dense = 2 if tlc.tma_available(torch.device(DEVICE)) else 1  # pointers before Hopper
    assert prefill.new_kv == dense
    assert select_config(num_tokens=63, num_seqs=2, max_query_len=40, max_seq_len=40,
                         num_kv_splits=2, **kwargs).new_kv == 0
    assert select_config(num_tokens=2, num_seqs=2, max_query_len=1, max_seq_len=40,
                         **kwargs).new_kv == 0
    b = make_paged_batch(BATCHES["prefill"], block_size=16, num_kv_heads=2, group=2,
                         head_size=64, dtype=torch.bfloat16, device=DEVICE, seed=29)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    modes = []
    real_mode = tua._new_kv_mode
    monkeypatch.setattr(tua, "_new_kv_mode", lambda *a: modes.append(real_mode(*a)) or modes[-1])
    for key, value in ((b.key, b.value), (b.key.float(), b.value.float())):
        out = triton_attn.paged_attention(
            b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens,
            b.query_start_loc, b.scale, max_query_len=b.max_query_len,
            max_seq_len=b.max_seq_len, num_kv_splits=1, key=key, value=value)
        _check_close(out, ref, torch.bfloat16)
    assert modes == [dense, 0]
    with pytest.raises(ValueError, match="key and value"):
        triton_attn.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale, key=b.key)
    with pytest.raises(ValueError, match="value must be"):
        triton_attn.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale, key=b.key,
                                    value=b.value[:-1])


@pytest.fixture
def launched_orders(monkeypatch) -> list:
    """The ``seq_order`` of every launch the backend makes."""
    orders = []
    real = tua.launch_unified_attention

    def spy(*args, seq_order=None, **kwargs) -> None:
        orders.append(seq_order)
        real(*args, seq_order=seq_order, **kwargs)

    monkeypatch.setattr(triton_attn, "launch_unified_attention", spy)
    return orders


@pytest.mark.parametrize("splits", [1, 2, None], ids=["one-segment", "two-segments", "auto"])
def test_decode_in_a_given_order_is_bitwise_the_same(splits, launched_orders) -> None:
    """A decode batch whose programs take the sequences in ``seq_order`` (longest first,
    and an arbitrary permutation) writes exactly the bytes of the default order: the
    order moves programs in time, not the arithmetic of any of them."""
    seqs = [(37, 1), (150, 1), (5, 1), (90, 1), (61, 1)]
    b = make_paged_batch(seqs, block_size=16, num_kv_heads=2, group=2, head_size=64,
                         dtype=torch.bfloat16, device=DEVICE, seed=21)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    outs = []
    for order in (None, torch.argsort(b.seq_lens, descending=True), torch.tensor([3, 0, 4, 1, 2])):
        out = torch.full_like(b.query, float("nan"))
        triton_attn.paged_attention(
            b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens,
            b.query_start_loc, b.scale, out=out, max_query_len=1, max_seq_len=b.max_seq_len,
            num_kv_splits=splits,
            seq_order=None if order is None else order.to(device=DEVICE, dtype=torch.int32),
        )
        _check_close(out, ref, torch.bfloat16)
        outs.append(out)
    assert launched_orders[0] is None and all(o is not None for o in launched_orders[1:])
    assert all(torch.equal(outs[0], out) for out in outs[1:])


def test_seq_order_is_ignored_for_batches_with_longer_queries(launched_orders) -> None:
    """A batch with longer queries keeps the kernel's own q-block walk (a sequence may be
    several q-blocks there); the launcher is not handed the order."""
    b = make_paged_batch(BATCHES["mixed"], block_size=8, num_kv_heads=1, group=2,
                         head_size=64, dtype=torch.float32, device=DEVICE, seed=5)
    _write_cache_both_ways(b)
    ref = reference.paged_attention(b.query, b.key_cache, b.value_cache, b.block_table,
                                    b.seq_lens, b.query_start_loc, b.scale)
    order = torch.argsort(b.seq_lens, descending=True)
    out = triton_attn.paged_attention(
        b.query, b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.query_start_loc,
        b.scale, max_query_len=b.max_query_len, max_seq_len=b.max_seq_len, seq_order=order,
    )
    assert launched_orders == [None]
    _check_close(out, ref, torch.float32)
