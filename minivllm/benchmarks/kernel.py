"""``minivllm bench kernel``: the paged-attention kernels against the memory roofline and
contiguous torch SDPA, on Qwen3-0.6B attention shapes.

What is measured, all in one process so every ratio compares numbers from the same run:

* the device-to-device copy bandwidth (bytes read + written): the ceiling for decode;
* decode, batch x context grid: paged Triton time, achieved bandwidth (K+V read, q read,
  output written) as a share of the copy bandwidth, torch SDPA over the same keys laid out
  contiguously (no paging), and the torch reference backend;
* prefill and chunked prefill: TFLOP/s of the Triton kernel and of causal SDPA.

The inputs (``kernel_inputs.py``) put every logical block at a random place in memory, as
in a long-running server. Results go to ``kernel.json`` (the command, GPU, versions and
every figure) and a plot, ``kernel.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from minivllm.benchmarks.common import (
    RESULTS_DIR,
    environment,
    measure_copy_bandwidth,
    require_gpu,
)
from minivllm.benchmarks.kernel_inputs import (
    BLOCK_SIZE,
    DTYPE,
    HEAD_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
    causal_flops,
    contiguous_kv,
    make_paged_kv,
    step_qkv,
)

if TYPE_CHECKING:
    from minivllm.attention.triton_launch_config import AttentionLaunchConfig

BATCHES = (1, 8, 64, 256)
CONTEXTS = (512, 2048, 8192, 32768)
# (batch, cached prefix, new tokens): whole prefills have prefix 0.
PREFILLS = ((1, 0, 2048), (1, 0, 8192), (4, 0, 4096), (4, 4096, 512), (1, 16384, 2048))


def add_kernel_bench_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench kernel`` on ``parser``."""
    parser.add_argument("--output-dir", default=RESULTS_DIR,
                        help="where kernel.json and kernel.png are written")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--reference-max-s", type=float, default=3.0,
                        help="skip timing the torch reference where one call exceeds this")
    parser.add_argument("--skip-prefill", action="store_true")


def _bench(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` with triton's do_bench (L2 flushed between calls)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _capture(fn: Callable[[], object], times: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(times):
            fn()
    return graph


def l2_flush(dirty: bool = False) -> Callable[[], object]:
    """A callable that evicts L2 by streaming a 256 MiB buffer through it.

    By default it *reads* the buffer, which leaves L2 full of clean lines: the next kernel
    starts cold, as after a model's weight-reading GEMMs. ``dirty=True`` zeroes it
    instead (the first two rounds' flush): L2 is then full of dirty lines, and the next
    kernel also pays for writing up to an L2's worth of them back to memory.
    """
    buffer = torch.zeros(256 << 20, dtype=torch.int8, device="cuda")
    if dirty:
        return buffer.zero_
    return lambda: torch.sum(buffer, dtype=torch.int32)


def _bench_graph(fn: Callable[[], object], reps: int = 20, dirty_flush: bool = False) -> float:
    """Device milliseconds of one cold-cache call of ``fn``, launch overhead amortised.

    One CUDA graph holds ``reps`` times "flush L2, call fn"; a second holds only the
    flushes. The difference over ``reps`` is the time of ``fn`` alone, starting from a
    cold L2 each time, with kernels back to back as in a captured model step (a single
    replay per measurement would add ~10 us of graph-launch latency to every figure).
    ``dirty_flush`` picks the flush that leaves dirty lines (see :func:`l2_flush`).
    """
    flush = l2_flush(dirty_flush)

    def flushed() -> None:
        flush()
        fn()

    with_fn = _capture(flushed, reps)
    flush_only = _capture(flush, reps)
    return (_bench(with_fn.replay) - _bench(flush_only.replay)) / reps


def host_overhead_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Host microseconds per call of ``fn`` when the GPU is not the bottleneck."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * host / calls


def _wall_ms(fn: Callable[[], object], max_s: float) -> tuple[float | None, str]:
    """Wall-clock median of a host-syncing function; None when one call is over ``max_s``."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    if first > max_s:
        return None, f"skipped: one call took {first:.1f} s (> {max_s} s)"
    times = []
    for _ in range(max(1, min(5, int(1.0 / max(first, 1e-3))))):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2], "wall clock, host syncs included"


def bench_decode(batch: int, context: int, copy_bw: float, ref_max_s: float) -> dict:
    """One decode step of ``batch`` sequences whose context is ``context`` tokens."""
    from minivllm.attention import reference
    from minivllm.attention.backends import triton_attn

    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + context)
    paged = make_paged_kv(batch, context, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    scale = HEAD_SIZE**-0.5
    out = torch.empty_like(q)
    args = (q, paged["key_cache"], paged["value_cache"], paged["block_table"], seq_lens, starts,
            scale)

    def paged_fn() -> None:
        triton_attn.paged_attention(*args, out=out, max_query_len=1, max_seq_len=context)

    t_paged = _bench_graph(paged_fn)
    # The same call after a flush that leaves L2 dirty: what the first two rounds measured.
    t_paged_dirty = _bench_graph(paged_fn, dirty_flush=True)
    t_paged_eager = _bench(paged_fn)
    from minivllm.attention.triton_launch_config import select_config

    config = select_config(num_tokens=batch, num_seqs=batch, num_heads=NUM_HEADS,
                           num_kv_heads=NUM_KV_HEADS, max_query_len=1, max_seq_len=context,
                           device=q.device)
    merges = _bench_merges(args[:-1], out, scale, config)
    k_c, v_c = contiguous_kv(paged, batch, context)
    # SDPA with GQA packed the same way the kernel packs it: the group's query heads act
    # as query rows of their KV head, so the flash kernel reads each KV head once.
    q_sdpa = q.view(batch, NUM_KV_HEADS, NUM_HEADS // NUM_KV_HEADS, HEAD_SIZE)
    sdpa_out = F.scaled_dot_product_attention(q_sdpa, k_c, v_c, scale=scale)
    t_sdpa = _bench_graph(lambda: F.scaled_dot_product_attention(q_sdpa, k_c, v_c,
                                                                 scale=scale))
    err = (out.float() - sdpa_out.reshape_as(out).float()).abs().max().item()
    k_c = v_c = None  # free the contiguous copy before the reference allocates
    t_ref, ref_note = _wall_ms(lambda: reference.paged_attention(*args), ref_max_s)

    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize
    nbytes = kv_bytes + 2 * q.numel() * q.element_size()  # + q read + output written
    return {
        "batch": batch, "context": context, "bytes": nbytes,
        "num_kv_splits": config.num_segments, "fused_reduce": config.fused_reduce, **merges,
        "paged_ms": t_paged, "paged_pct_copy_bw": 100 * nbytes / (t_paged * 1e-3) / copy_bw,
        "sdpa_ms": t_sdpa, "sdpa_pct_copy_bw": 100 * nbytes / (t_sdpa * 1e-3) / copy_bw,
        "paged_over_sdpa": t_paged / t_sdpa,
        "paged_ms_dirty_flush": t_paged_dirty,
        "paged_pct_copy_bw_dirty_flush": 100 * nbytes / (t_paged_dirty * 1e-3) / copy_bw,
        "paged_eager_ms": t_paged_eager,
        "reference_ms": t_ref, "reference_note": ref_note,
        "max_abs_diff_vs_sdpa": err,
    }


def _bench_merges(
    tensors: tuple, out: torch.Tensor, scale: float, config: AttentionLaunchConfig
) -> dict:
    """A split decode timed with each merge, side by side (the default's tiles and segments):
    ``paged_ms_fused_merge`` (the last segment merges), ``paged_ms_reduce_kernel`` (a second
    launch), and how far either result is from the default's ``out``. Empty unsplit."""
    from dataclasses import replace

    from minivllm.attention.triton_unified_attention import launch_unified_attention

    if config.num_segments == 1:
        return {}
    results: dict = {"merges_max_abs_diff": 0.0}
    for name, fused in (("fused_merge", True), ("reduce_kernel", False)):
        variant, result = replace(config, fused_reduce=fused), torch.empty_like(out)
        results[f"paged_ms_{name}"] = _bench_graph(
            lambda v=variant, r=result: launch_unified_attention(*tensors, r, scale, v))
        diff = (result.float() - out.float()).abs().max().item()
        results["merges_max_abs_diff"] = max(results["merges_max_abs_diff"], diff)
    return results


def bench_prefill(batch: int, prefix: int, new: int) -> dict:
    """Prefill (``prefix == 0``) or a chunk of ``new`` tokens over a cached prefix."""
    from torch.nn.attention.bias import causal_lower_right

    from minivllm.attention.backends import triton_attn

    seq_len = prefix + new
    gen = torch.Generator(device="cuda").manual_seed(seq_len * 7 + batch)
    paged = make_paged_kv(batch, seq_len, gen)
    q, key, value = step_qkv(paged, batch, prefix, new, gen)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    scale = HEAD_SIZE**-0.5
    out = torch.empty_like(q)

    def paged_fn() -> None:
        # As the Attention layer calls it: with this step's key/value.
        triton_attn.paged_attention(q, paged["key_cache"], paged["value_cache"],
                                   paged["block_table"], seq_lens, starts, scale, out=out,
                                   max_query_len=new, max_seq_len=seq_len, key=key,
                                   value=value)

    t_paged = _bench_graph(paged_fn)
    k_c, v_c = contiguous_kv(paged, batch, seq_len)
    group = NUM_HEADS // NUM_KV_HEADS
    k_c, v_c = k_c.repeat_interleave(group, 1), v_c.repeat_interleave(group, 1)
    q_sdpa = q.view(batch, new, NUM_HEADS, HEAD_SIZE).transpose(1, 2)
    if prefix == 0:
        sdpa = lambda: F.scaled_dot_product_attention(q_sdpa, k_c, v_c, is_causal=True,
                                                      scale=scale)
    else:
        bias = causal_lower_right(new, seq_len)
        sdpa = lambda: F.scaled_dot_product_attention(q_sdpa, k_c, v_c, attn_mask=bias,
                                                      scale=scale)
    sdpa_out = sdpa()
    t_sdpa = _bench_graph(sdpa)
    err = (out.view(batch, new, NUM_HEADS, HEAD_SIZE).float()
           - sdpa_out.transpose(1, 2).float()).abs().max().item()
    flops = causal_flops(batch, prefix, new)
    return {
        "batch": batch, "prefix": prefix, "new_tokens": new, "flops": flops,
        "paged_ms": t_paged, "paged_tflops": flops / (t_paged * 1e-3) / 1e12,
        "sdpa_ms": t_sdpa, "sdpa_tflops": flops / (t_sdpa * 1e-3) / 1e12,
        "paged_over_sdpa": t_paged / t_sdpa, "max_abs_diff_vs_sdpa": err,
    }


def _host_overheads() -> dict:
    """Host cost of one call: the registered op vs the bare launcher (a tiny decode)."""
    from minivllm.attention.backends import triton_attn
    from minivllm.attention.triton_launch_config import select_config
    from minivllm.attention.triton_unified_attention import launch_unified_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    paged = make_paged_kv(8, 512, gen)
    q = torch.randn(8, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    lens = torch.full((8,), 512, dtype=torch.int32, device="cuda")
    starts = torch.arange(9, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    args = (q, paged["key_cache"], paged["value_cache"], paged["block_table"], lens, starts)
    cfg = select_config(num_tokens=8, num_seqs=8, num_heads=NUM_HEADS,
                        num_kv_heads=NUM_KV_HEADS, max_query_len=1, max_seq_len=512,
                        device=q.device, num_kv_splits=1)
    return {
        "custom_op": host_overhead_us(lambda: triton_attn.paged_attention(
            *args, 0.1, out=out, max_query_len=1, max_seq_len=512, num_kv_splits=1)),
        "bare_launcher": host_overhead_us(lambda: launch_unified_attention(
            *args, out, 0.1, cfg)),
    }


def _fits(batch: int, context: int) -> bool:
    # Paged K/V plus the contiguous copy for SDPA, plus 10 % headroom.
    need = 2 * 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize * 1.1
    free, _ = torch.cuda.mem_get_info()
    return need < free


def _environment() -> dict:
    """Every benchmark's environment, plus what the kernels' timings depend on."""
    props = torch.cuda.get_device_properties(0)
    return {
        **environment(),
        "sm_count": props.multi_processor_count,
        "shapes": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS,
                   "head_size": HEAD_SIZE, "block_size": BLOCK_SIZE, "dtype": str(DTYPE)},
    }


def run_kernel_bench(args: argparse.Namespace) -> dict:
    """Run the whole benchmark, write ``kernel.json`` and ``kernel.png``; return the results."""
    require_gpu(args, "kernel", cpu_flag=False)  # it times CUDA graphs
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = _environment()
    results["copy_bandwidth_bytes_per_s"] = copy_bw = measure_copy_bandwidth()
    print(f"copy bandwidth: {copy_bw / 1e12:.2f} TB/s", flush=True)
    results["timing"] = (
        "device time per call: median over do_bench runs of a CUDA graph of 20 x (L2 flush + "
        "call), minus the same graph without the call, divided by 20; the flush reads a 256 "
        "MiB buffer (clean L2); *_dirty_flush: the flush zeroes it instead (L2 full of dirty "
        "lines, the first two rounds' method); paged_ms_fused_merge / paged_ms_reduce_kernel: "
        "a split decode with each merge (bare launcher, default tiles and segments), timed "
        "the same way; paged_eager_ms is one "
        "eager call timed by do_bench, host overhead included; the reference is wall clock "
        "(it syncs with the host)")
    results["host_overhead_us"] = _host_overheads()
    print(f"host overhead per call (us): {results['host_overhead_us']}", flush=True)
    results["decode"] = []
    for batch in args.batches:
        for context in args.contexts:
            if not _fits(batch, context):
                results["decode"].append({"batch": batch, "context": context,
                                          "skipped": "does not fit in free GPU memory"})
                continue
            row = bench_decode(batch, context, copy_bw, args.reference_max_s)
            results["decode"].append(row)
            print(f"decode B{batch:<4} C{context:<6} split={row['num_kv_splits']:<3} "
                  f"paged {row['paged_ms']:.4f} ms ({row['paged_pct_copy_bw']:.0f}% BW; "
                  f"dirty-L2 flush {row['paged_pct_copy_bw_dirty_flush']:.0f}%)  "
                  f"sdpa {row['sdpa_ms']:.4f} ms  x{row['paged_over_sdpa']:.2f}  "
                  f"ref {row['reference_ms']}  merge: fused {row.get('paged_ms_fused_merge')} "
                  f"reduce kernel {row.get('paged_ms_reduce_kernel')}", flush=True)
            torch.cuda.empty_cache()
    results["prefill"] = []
    if not args.skip_prefill:
        for batch, prefix, new in PREFILLS:
            row = bench_prefill(batch, prefix, new)
            results["prefill"].append(row)
            print(f"prefill B{batch} prefix {prefix} new {new}: paged "
                  f"{row['paged_tflops']:.0f} TFLOP/s, sdpa {row['sdpa_tflops']:.0f} TFLOP/s",
                  flush=True)
            torch.cuda.empty_cache()
    (out_dir / "kernel.json").write_text(json.dumps(results, indent=2) + "\n")
    from minivllm.benchmarks.kernel_plot import plot_kernel_results

    plot_kernel_results(results, out_dir / "kernel.png")
    return results


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``python -m minivllm.benchmarks.kernel`` (the CLI calls the same)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_kernel_bench_args(parser)
    try:
        run_kernel_bench(parser.parse_args(argv))
    except ValueError as exc:  # one line and exit status 2, as the minivllm command
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


if __name__ == "__main__":
    main()
