"""Tile/warp/stage sweep for the unified kernel on the benchmark shapes (GPU only).

How the defaults in ``triton_launch_config.py`` were first chosen:
``python -m minivllm.benchmarks.kernel_sweep OUT.json`` times every candidate launch
configuration on the decode shapes that carry the targets, on the ragged full batch of
the throughput workload, and on one long prefill, compares the decode configurations
that win somewhere on equal and on ragged contexts, and writes all timings, so the
choice can be re-checked on other hardware (``--ragged-only``: skip the first sweeps).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from minivllm.attention.triton_launch_config import AttentionLaunchConfig
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.benchmarks.common import environment, measure_copy_bandwidth
from minivllm.benchmarks.kernel import _bench_graph
from minivllm.benchmarks.kernel_inputs import (
    DTYPE,
    HEAD_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
    launcher_args,
    make_paged_kv,
)

DECODE_SHAPES = ((64, 8192), (8, 8192), (1, 32768))
DECODE_CONFIGS = (  # tile_n, warps, stages
    (32, 4, 3), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (64, 8, 2), (128, 8, 2),
)
SPLITS = {1: (32, 64, 128), 8: (8, 16)}  # segment counts tried per small batch
PREFILL_CONFIGS = (  # block_m, tile_n, warps, stages
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3),
    (128, 32, 4, 2), (128, 128, 8, 2), (128, 64, 4, 2),
)


def _decode_inputs(batch: int, context: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(batch + context)
    paged = make_paged_kv(batch, context, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    return launcher_args(q, paged, lens, starts)


def sweep_decode(copy_bw: float) -> list[dict]:
    """Time every decode config (and split counts for the small batches)."""
    rows = []
    for batch, context in DECODE_SHAPES:
        args = _decode_inputs(batch, context)
        nbytes = 2 * batch * context * 8 * HEAD_SIZE * 2 + 2 * args[0].numel() * 2
        splits = SPLITS.get(batch, (1,))
        for (tile, warps, stages), segs in itertools.product(DECODE_CONFIGS, splits):
            cfg = AttentionLaunchConfig(16, tile, warps, stages, segs)
            try:
                ms = _bench_graph(lambda cfg=cfg, args=args: launch_unified_attention(*args, cfg))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                rows.append({"batch": batch, "context": context, "config": cfg.__dict__,
                             "error": repr(exc)[:200]})
                continue
            rows.append({"batch": batch, "context": context, "config": cfg.__dict__, "ms": ms,
                         "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw})
        best = min((r for r in rows if r.get("batch") == batch and r.get("context") == context
                    and "ms" in r), key=lambda r: r["ms"])
        print(f"decode B{batch} C{context}: best {best['config']} "
              f"{best['ms']:.4f} ms {best['pct_copy_bw']:.0f}%", flush=True)
        args = None
        torch.cuda.empty_cache()
    return rows


def _ragged_decode_inputs(batch: int, lo: int, hi: int, seed: int) -> tuple[tuple, int]:
    """Launch arguments for one decode step of ``batch`` sequences whose contexts are
    uniform in ``lo..hi``, and the K/V bytes the step must read."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    paged = make_paged_kv(batch, hi, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    args = launcher_args(q, paged, lens, starts)
    return args, 2 * int(lens.sum()) * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize


RAGGED_CONFIGS = DECODE_CONFIGS + ((32, 4, 2), (32, 2, 2), (32, 2, 3), (64, 2, 2), (16, 2, 3))


def sweep_ragged_decode(copy_bw: float, batch: int = 256) -> list[dict]:
    """Time decode configs on the throughput workload's shape: 256 sequences whose
    contexts are uniform in 100..1100 (seed 0), so programs finish at different times."""
    args, nbytes = _ragged_decode_inputs(batch, 100, 1100, seed=0)
    nbytes += 2 * args[0].numel() * DTYPE.itemsize  # the queries read, the outputs written
    rows = []
    for (tile, warps, stages), segs in itertools.product(RAGGED_CONFIGS, (1, 2)):
        cfg = AttentionLaunchConfig(16, tile, warps, stages, segs)
        try:
            ms = _bench_graph(lambda cfg=cfg: launch_unified_attention(*args, cfg))
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
            rows.append({"batch": batch, "context": "100..1100", "config": cfg.__dict__,
                         "error": repr(exc)[:200]})
            continue
        rows.append({"batch": batch, "context": "100..1100", "config": cfg.__dict__, "ms": ms,
                     "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw})
        print(f"ragged B{batch} {cfg}: {ms:.4f} ms {rows[-1]['pct_copy_bw']:.0f}%", flush=True)
    return rows


# (batch, shortest context, longest context): equal contexts, and ragged ones as a
# continuous batch has them.
COMPARE_SHAPES = ((256, 2048, 2048), (256, 8192, 8192), (128, 1024, 1024), (128, 4096, 4096),
                  (128, 100, 1100), (64, 2048, 2048), (32, 100, 1100), (256, 1000, 3000))
COMPARE_CONFIGS = ((64, 4, 2), (128, 4, 3), (64, 4, 3), (128, 4, 2))


def compare_decode_configs(copy_bw: float) -> list[dict]:
    """The decode configurations that win somewhere, on equal and on ragged contexts."""
    rows = []
    for batch, lo, hi in COMPARE_SHAPES:
        args, nbytes = _ragged_decode_inputs(batch, lo, hi, seed=batch + hi)
        for tile, warps, stages in COMPARE_CONFIGS:
            cfg = AttentionLaunchConfig(16, tile, warps, stages, 1)
            ms = _bench_graph(lambda cfg=cfg, args=args: launch_unified_attention(*args, cfg))
            rows.append({"batch": batch, "context": [lo, hi], "config": cfg.__dict__, "ms": ms,
                         "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw})
        print(f"B{batch} C{lo}..{hi}: " + " | ".join(
            f"{r['config']['tile_n']}/{r['config']['num_warps']}/{r['config']['num_stages']} "
            f"{r['pct_copy_bw']:.0f}%" for r in rows[-len(COMPARE_CONFIGS):]), flush=True)
        args = None
        torch.cuda.empty_cache()
    return rows


def sweep_prefill(batch: int = 1, new: int = 8192) -> list[dict]:
    """Time the prefill configs on one long causal prefill."""
    gen = torch.Generator(device="cuda").manual_seed(new)
    paged = make_paged_kv(batch, new, gen)
    q = torch.randn(batch * new, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device="cuda", generator=gen)
    lens = torch.full((batch,), new, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    args = launcher_args(q, paged, lens, starts)
    flops = 4.0 * NUM_HEADS * HEAD_SIZE * batch * new * (new + 1) / 2
    rows = []
    for block_m, tile, warps, stages in PREFILL_CONFIGS:
        cfg = AttentionLaunchConfig(block_m, tile, warps, stages, 1)
        try:
            ms = _bench_graph(lambda cfg=cfg: launch_unified_attention(*args, cfg))
        except Exception as exc:  # noqa: BLE001
            rows.append({"config": cfg.__dict__, "error": repr(exc)[:200]})
            continue
        rows.append({"config": cfg.__dict__, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12})
        print(f"prefill {cfg}: {ms:.3f} ms {rows[-1]['tflops']:.0f} TFLOP/s", flush=True)
    return rows


def main() -> None:
    """Run both sweeps and write the JSON given on the command line."""
    copy_bw = measure_copy_bandwidth()
    result = {**environment(), "copy_bandwidth_bytes_per_s": copy_bw}
    if "--ragged-only" not in sys.argv:
        result["decode"] = sweep_decode(copy_bw)
        result["prefill"] = sweep_prefill()
    result["ragged_decode"] = sweep_ragged_decode(copy_bw)
    result["decode_config_comparison"] = compare_decode_configs(copy_bw)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
