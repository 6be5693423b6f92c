"""Launch-configuration sweep of the unified attention kernel (GPU only, under 3 minutes).

``python -m minivllm.benchmarks.kernel_variants --output OUT.json`` times, on the shapes
that carry issue 15's targets:

* prefill (B1 x 8192, B4 x 4096, B4 with a 4096 prefix + 512 new): a grid of tile shapes
  (rows, keys, warps, stages), TFLOP/s next to causal SDPA on the same keys, and the
  winner with every sequence's pages in order in memory (what paging costs);
* decode (B1 and B8 at 512 to 32,768 keys): split-KV segment counts with the separate
  reduce kernel and with the fused merge (the last segment merges), then other key tiles
  around the best count; share of the copy bandwidth next to contiguous SDPA.

Every timed configuration is also checked against SDPA's output on its shape
(``max_abs_diff``), and the registers, spills and shared memory of each compiled variant
are recorded; the run stops adding steps when its time budget is spent, and says which
it skipped. Its first run on the H200 also compared kernel variants that the kernel has
since dropped or made permanent (docs/benchmarks/perf2/kernel_variants.json, discussed in
the PagedAttention chapter); ``triton_launch_config.py`` holds the winners.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from minivllm.attention.triton_launch_config import AttentionLaunchConfig
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.benchmarks.common import environment, measure_copy_bandwidth, require_gpu
from minivllm.benchmarks.kernel import (
    DTYPE,
    HEAD_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
    contiguous_kv,
    make_paged_kv,
)

PREFILLS = ((1, 0, 8192), (4, 0, 4096), (4, 4096, 512))  # (batch, prefix, new)
# The targets first (the run may stop early), then the shapes that place the split rule.
DECODES = ((1, 32768), (1, 512), (8, 512), (1, 2048), (8, 2048), (1, 8192), (8, 8192))
SEGMENTS = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_KEYS_PER_SEGMENT = 64  # shorter segments are never worth trying
# Tile shapes around the first run's winner (256 x 64, 8 warps, 3 stages, which spills a
# few registers); 256 x 32 and 16 warps do not spill (Triton 3.6, sm_90).
PREFILL_TILES = (  # block_m, tile_n, warps, stages
    (256, 64, 8, 3),
    (256, 32, 8, 3),
    (256, 32, 8, 4),
    (256, 64, 16, 2),
    (256, 64, 16, 3),
    (256, 64, 8, 4),
    (128, 128, 8, 2),
    (128, 64, 8, 2),
)
DECODE_BASE = AttentionLaunchConfig(16, 64, 4, 2, 1)
DECODE_TILES = ((32, 4, 2), (64, 4, 3), (128, 4, 2))  # tile_n, warps, stages


def _graph_ms(fn: Callable[[], object], flush: torch.Tensor | None, reps: int) -> float:
    """Median ms of one CUDA-graph replay of ``reps`` x (optional L2 flush, ``fn``)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            if flush is not None:
                flush.zero_()
            fn()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[1:])


class Timer:
    """Device time per call from a CUDA graph of ``reps`` calls; decode shapes start each
    call from a cold L2 (a 256 MiB flush before it, whose own time is subtracted)."""

    def __init__(self, reps: int = 20) -> None:
        self.reps = reps
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        self.flush_ms = _graph_ms(lambda: None, self.flush, reps) / reps

    def cold(self, fn: Callable[[], object]) -> float:
        return _graph_ms(fn, self.flush, self.reps) / self.reps - self.flush_ms

    def warm(self, fn: Callable[[], object]) -> float:
        return _graph_ms(fn, None, 3) / 3


def _prefill_case(batch: int, prefix: int, new: int) -> dict:
    """Inputs, SDPA's output and the FLOP count of one prefill shape."""
    from torch.nn.attention.bias import causal_lower_right

    seq_len = prefix + new
    gen = torch.Generator(device="cuda").manual_seed(seq_len * 7 + batch)
    paged = make_paged_kv(batch, seq_len, gen)
    q = torch.randn(batch * new, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    args = (
        q,
        paged["key_cache"],
        paged["value_cache"],
        paged["block_table"],
        lens,
        starts,
        torch.empty_like(q),
        HEAD_SIZE**-0.5,
    )
    group = NUM_HEADS // NUM_KV_HEADS
    k_c, v_c = (t.repeat_interleave(group, 1) for t in contiguous_kv(paged, batch, seq_len))
    q_sdpa = q.view(batch, new, NUM_HEADS, HEAD_SIZE).transpose(1, 2)
    mask = None if prefix == 0 else causal_lower_right(new, seq_len)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_sdpa, k_c, v_c, attn_mask=mask, is_causal=prefix == 0, scale=HEAD_SIZE**-0.5
        )

    expected = sdpa().transpose(1, 2).reshape_as(q)
    visible = batch * (new * prefix + new * (new + 1) / 2)
    return {
        "args": args,
        "sdpa": sdpa,
        "expected": expected,
        "flops": 4.0 * NUM_HEADS * HEAD_SIZE * visible,
        "name": f"B{batch} prefix {prefix} new {new}",
    }


def _decode_case(batch: int, context: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + context)
    paged = make_paged_kv(batch, context, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    args = (
        q,
        paged["key_cache"],
        paged["value_cache"],
        paged["block_table"],
        lens,
        starts,
        torch.empty_like(q),
        HEAD_SIZE**-0.5,
    )
    k_c, v_c = contiguous_kv(paged, batch, context)
    # GQA packed as the kernel packs it: a KV head's query heads act as its query rows.
    q_sdpa = q.view(batch, NUM_KV_HEADS, NUM_HEADS // NUM_KV_HEADS, HEAD_SIZE)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q_sdpa, k_c, v_c, scale=HEAD_SIZE**-0.5)

    nbytes = 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize
    return {
        "args": args,
        "sdpa": sdpa,
        "expected": sdpa().reshape_as(q),
        "bytes": nbytes + 2 * q.numel() * q.element_size(),
        "batch": batch,
        "context": context,
        "name": f"B{batch} C{context}",
    }


def _run_config(case: dict, cfg: AttentionLaunchConfig, time_fn: Callable) -> dict:
    """Time one configuration on one shape and check its output against SDPA's."""
    out = case["args"][6]
    row = {"shape": case["name"], "config": asdict(cfg)}
    try:
        out.fill_(float("nan"))
        launch_unified_attention(*case["args"], cfg)
        row["max_abs_diff"] = (out.float() - case["expected"].float()).abs().max().item()
        row["exact"] = bool(row["max_abs_diff"] < 2e-2)  # bf16 tolerance of the tests
        row["ms"] = time_fn(lambda: launch_unified_attention(*case["args"], cfg))
    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record, go on
        row["error"] = repr(exc)[:300]
    return row


def _kernel_stats() -> list[dict] | str:
    """Registers, spills and shared memory of each compiled variant of the unified kernel
    (read from Triton's in-process cache, whose layout is internal: best effort)."""
    from minivllm.attention.triton_unified_attention import kernel_unified_attention as kernel

    try:
        stats = []
        for cache in kernel.device_caches.values():
            compiled_kernels = cache[0] if isinstance(cache, tuple) else cache
            for compiled in compiled_kernels.values():
                constants = getattr(getattr(compiled, "src", None), "constants", {}) or {}
                named = {}
                for key, value in constants.items():
                    index = key[0] if isinstance(key, tuple) and key else key
                    if isinstance(index, int) and index < len(kernel.arg_names):
                        index = kernel.arg_names[index]
                    if isinstance(value, (bool, int, str)):
                        named[str(index)] = value
                metadata = compiled.metadata
                stats.append(
                    {
                        "constants": named,
                        "n_regs": getattr(compiled, "n_regs", None),
                        "n_spills": getattr(compiled, "n_spills", None),
                        "shared_bytes": getattr(metadata, "shared", None),
                        "num_warps": getattr(metadata, "num_warps", None),
                        "num_stages": getattr(metadata, "num_stages", None),
                    }
                )
        return stats
    except Exception as exc:  # noqa: BLE001 - private Triton attributes may move
        return f"unavailable: {exc!r}"


class Sweep:
    """Runs the steps in order until the time budget is spent."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.results: dict = {"skipped": []}

    def over(self, step: str) -> bool:
        if time.monotonic() > self.deadline:
            self.results["skipped"].append(step)
            print(f"skipped (time budget): {step}", flush=True)
            return True
        return False


def sweep_prefill(sweep: Sweep, timer: Timer) -> None:
    cases = [_prefill_case(*shape) for shape in PREFILLS]
    rows = sweep.results["prefill"] = []
    sweep.results["prefill_sdpa"] = sdpa = {}
    for case in cases:
        ms = timer.warm(case["sdpa"])
        sdpa[case["name"]] = {"ms": ms, "tflops": case["flops"] / ms / 1e9}

    def measure(cfg: AttentionLaunchConfig, step: str) -> float:
        """Geometric-mean ratio to SDPA over the shapes (lower is better)."""
        ratios = []
        for case in cases:
            row = _run_config(case, cfg, timer.warm)
            row["step"] = step
            if "ms" in row:
                row["tflops"] = case["flops"] / row["ms"] / 1e9
                row["over_sdpa"] = row["ms"] / sdpa[case["name"]]["ms"]
                ratios.append(row["over_sdpa"])
            rows.append(row)
        if len(ratios) < len(cases):
            return float("inf")
        score = statistics.geometric_mean(ratios)
        print(
            f"prefill {step:<28} {cfg.block_m}/{cfg.tile_n}/{cfg.num_warps}/"
            f"{cfg.num_stages}: x{score:.2f} of SDPA time "
            + " ".join(f"{r.get('tflops', 0):.0f}" for r in rows[-len(cases) :])
            + " TFLOP/s",
            flush=True,
        )
        return score

    best, best_score = None, float("inf")
    for tiles in PREFILL_TILES:
        if sweep.over(f"prefill tiles {tiles}"):
            return
        cfg = AttentionLaunchConfig(*tiles, num_segments=1)
        score = measure(cfg, "tiles")
        if score < best_score:
            best, best_score = cfg, score
    if best is None or sweep.over("prefill probes"):
        return
    sweep.results["prefill_best"] = asdict(best)
    # Probes of the winner: without software pipelining (does the K/V prefetch work?),
    # and with every sequence's pages in order in memory (what does paging cost?).
    measure(replace(best, num_stages=1), "probe: num_stages=1")
    for case in cases:
        table = case["args"][3]
        in_order = torch.arange(table.numel(), dtype=table.dtype, device=table.device)
        args = (*case["args"][:3], in_order.view_as(table), *case["args"][4:])
        ms = timer.warm(lambda args=args: launch_unified_attention(*args, best))
        rows.append(
            {
                "shape": case["name"],
                "config": asdict(best),
                "ms": ms,
                "step": "probe: pages in order (timing only)",
                "tflops": case["flops"] / ms / 1e9,
            }
        )
        print(f"prefill pages in order {case['name']}: {rows[-1]['tflops']:.0f} TFLOP/s")


def _decode_row(
    case: dict, cfg: AttentionLaunchConfig, timer: Timer, copy_bw: float, sdpa_ms: float
) -> dict:
    row = _run_config(case, cfg, timer.cold)
    if "ms" in row:
        row["pct_copy_bw"] = 100 * case["bytes"] / (row["ms"] * 1e-3) / copy_bw
        row["over_sdpa"] = row["ms"] / sdpa_ms
    return row


def sweep_decode(sweep: Sweep, timer: Timer, copy_bw: float) -> None:
    rows = sweep.results["decode"] = []
    sweep.results["decode_sdpa"] = sdpa = {}
    for batch, context in DECODES:
        if sweep.over(f"decode B{batch} C{context}"):
            return
        case = _decode_case(batch, context)
        sdpa_ms = timer.cold(case["sdpa"])
        sdpa[case["name"]] = {
            "ms": sdpa_ms,
            "pct_copy_bw": 100 * case["bytes"] / (sdpa_ms * 1e-3) / copy_bw,
        }
        segments = [s for s in SEGMENTS if context // s >= MIN_KEYS_PER_SEGMENT]
        configs = [
            replace(DECODE_BASE, num_segments=s, fused_reduce=f)
            for s in segments
            for f in ((False, True) if s > 1 else (False,))
        ]
        shape_rows = [_decode_row(case, cfg, timer, copy_bw, sdpa_ms) for cfg in configs]
        # Other key tiles only around the best segment count (each count compiles anew).
        timed = [r for r in shape_rows if "ms" in r]
        if not timed:  # every configuration failed on this shape: keep the errors
            rows += shape_rows
            continue
        lead = min(timed, key=lambda r: r["ms"])["config"]
        shape_rows += [
            _decode_row(
                case,
                replace(
                    DECODE_BASE,
                    tile_n=t,
                    num_warps=w,
                    num_stages=st,
                    num_segments=s,
                    fused_reduce=lead["fused_reduce"] and s > 1,
                ),
                timer,
                copy_bw,
                sdpa_ms,
            )
            for t, w, st in DECODE_TILES
            for s in segments
            if lead["num_segments"] // 2 <= s <= lead["num_segments"] * 2
        ]
        rows += shape_rows
        best = min((r for r in shape_rows if "ms" in r), key=lambda r: r["ms"])
        c = best["config"]
        print(
            f"decode {case['name']:<10} sdpa {sdpa_ms * 1e3:.1f} us; best "
            f"{c['tile_n']}/{c['num_warps']}/{c['num_stages']} seg {c['num_segments']} "
            f"fused {c['fused_reduce']}: {best['ms'] * 1e3:.1f} us "
            f"({best['pct_copy_bw']:.0f}% BW, x{best['over_sdpa']:.2f} SDPA)",
            flush=True,
        )
        case = None
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m minivllm.benchmarks.kernel_variants --output OUT.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="the JSON file to write")
    parser.add_argument(
        "--budget-s", type=float, default=140.0, help="start no new step after this many seconds"
    )
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args(argv)
    try:
        require_gpu(args, "kernel_variants", cpu_flag=False)
    except ValueError as exc:  # one line and exit status 2, as bench kernel
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    sweep = Sweep(args.budget_s)
    copy_bw = measure_copy_bandwidth()
    sweep.results.update(environment(), copy_bandwidth_bytes_per_s=copy_bw)
    sweep.results["timing"] = (
        "CUDA graphs: prefill 3 calls per replay (warm L2); decode 20 x (256 MiB L2 flush + "
        "call) per replay minus the flushes alone; median of 6 replays"
    )
    timer = Timer()
    try:
        if not args.skip_prefill:
            sweep_prefill(sweep, timer)
        if not args.skip_decode:
            sweep_decode(sweep, timer, copy_bw)
    finally:
        sweep.results["kernel_stats"] = _kernel_stats()
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(sweep.results, indent=2) + "\n")


if __name__ == "__main__":
    main()
