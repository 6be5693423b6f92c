"""Launch-configuration sweep of the unified attention kernel (GPU only, under 3 minutes).

``python -m minivllm.benchmarks.kernel_variants --output OUT.json`` times, on the shapes
that carry issue 15's targets:

* decode (B1 x 32,768, B1 and B8 x 512): the launch-config rule's choice, then the
  candidates of ``DECODE_VARIANTS`` (deeper K/V pipelines, 64-row tiles, segment counts);
  share of the copy bandwidth next to contiguous SDPA;
* prefill (B1 x 8192, B4 x 4096, B4 with a 4096 prefix + 512 new): the rule's choice,
  then ``PREFILL_VARIANTS`` (the chunk's own keys from the paged cache, or densely from
  this step's key/value tensors by pointers or TMA descriptors, and tile shapes); TFLOP/s
  next to causal SDPA on the same keys.

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
from dataclasses import asdict
from pathlib import Path

import torch

from minivllm.attention.triton_launch_config import AttentionLaunchConfig, select_config
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.benchmarks.common import environment, measure_copy_bandwidth, require_gpu
from minivllm.benchmarks.kernel import l2_flush
from minivllm.benchmarks.kernel_inputs import (
    HEAD_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
    decode_case,
    prefill_case,
)

# Where the cases live: the GPU; a CPU check of the sweep itself sets "cpu".
DEVICE = "cuda"
PREFILLS = ((1, 0, 8192), (4, 0, 4096), (4, 4096, 512))  # (batch, prefix, new)
# The targets first (the run may stop early), then the shapes that place the split rule.
DECODES = ((1, 32768), (1, 512), (8, 512), (1, 2048), (8, 2048), (1, 8192), (8, 8192))
# Third round: where the chunk's own keys come from (the paged cache, or this step's
# dense key/value tensors by pointers or through TMA descriptors) and tile shapes around
# each; None = what select_config picks for the shape.
PREFILL_VARIANTS: tuple[tuple[str, AttentionLaunchConfig | None], ...] = (
    ("default", None),
    ("tma 128x128 s2", AttentionLaunchConfig(128, 128, 8, 2, 1, new_kv=2)),
    ("tma 128x128 s3", AttentionLaunchConfig(128, 128, 8, 3, 1, new_kv=2)),
    ("tma 128x64 s3", AttentionLaunchConfig(128, 64, 8, 3, 1, new_kv=2)),
    ("tma 256x64 s3", AttentionLaunchConfig(256, 64, 8, 3, 1, new_kv=2)),
    ("ptr 128x128 s2", AttentionLaunchConfig(128, 128, 8, 2, 1, new_kv=1)),
    ("ptr 256x64 s3", AttentionLaunchConfig(256, 64, 8, 3, 1, new_kv=1)),
    ("tma 64x64 w4 s3", AttentionLaunchConfig(64, 64, 4, 3, 1, new_kv=2)),
    ("paged 128x128 s3", AttentionLaunchConfig(128, 128, 8, 3, 1)),
)
# Decode. The first third-round run (kernel_variants3.json) found every configuration
# that fits one wave at ~50 us on 1 x 32,768, whatever its pipeline depth, while 8 x 32,768
# (programs 8x longer) reaches the copy bandwidth: the cost is per program. So: fewer,
# longer segments with more bytes in flight each (wider tiles, 8 warps, deeper
# pipelines), and the reduce kernel against the fused merge.
# (block_m, tile_n, warps, stages, segments, fused merge).
DECODE_VARIANTS = {
    (1, 32768): (
        (16, 64, 4, 2, 64, False), (16, 64, 4, 2, 32, True), (16, 64, 4, 2, 16, True),
        (16, 64, 4, 5, 16, True), (16, 128, 8, 5, 16, True), (16, 128, 8, 5, 32, True),
        (16, 128, 4, 3, 32, True), (16, 64, 8, 2, 64, True), (16, 128, 8, 3, 16, True),
        (16, 256, 8, 2, 16, True),
    ),
    (1, 512): ((16, 128, 8, 5, 4, False), (16, 64, 8, 2, 4, False)),
    (8, 512): ((16, 128, 8, 5, 4, False), (16, 64, 8, 2, 4, False)),
}


def _graph_ms(fn: Callable[[], object], flush: Callable[[], object] | None, reps: int) -> float:
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
                flush()
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
    call from a cold L2 (a 256 MiB flush before it, whose own time is subtracted; it reads
    the buffer, see ``kernel.l2_flush``; kernel_variants.json and kernel_variants3.json
    were measured with a flush that zeroed it)."""

    def __init__(self, reps: int = 20) -> None:
        self.reps = reps
        self.flush = l2_flush()
        self.flush_ms = _graph_ms(lambda: None, self.flush, reps) / reps

    def cold(self, fn: Callable[[], object]) -> float:
        return _graph_ms(fn, self.flush, self.reps) / self.reps - self.flush_ms

    def warm(self, fn: Callable[[], object]) -> float:
        return _graph_ms(fn, None, 3) / 3


def _run_config(case: dict, cfg: AttentionLaunchConfig, time_fn: Callable) -> dict:
    """Time one configuration on one shape and check its output against SDPA's."""
    out = case["args"][6]
    row = {"shape": case["name"], "config": asdict(cfg)}
    try:
        out.fill_(float("nan"))
        launch_unified_attention(*case["args"], cfg, **case["new_kv"])
        row["max_abs_diff"] = (out.float() - case["expected"].float()).abs().max().item()
        row["exact"] = bool(row["max_abs_diff"] < 2e-2)  # bf16 tolerance of the tests
        row["ms"] = time_fn(lambda: launch_unified_attention(*case["args"], cfg, **case["new_kv"]))
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


def _default_config(case: dict) -> AttentionLaunchConfig:
    """What the engine's launch-config rule picks for ``case``."""
    q, key_cache, _, _, lens = case["args"][:5]
    return select_config(
        num_tokens=q.shape[0],
        num_seqs=lens.shape[0],
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        device=q.device,
        head_size=HEAD_SIZE,
        element_size=key_cache.element_size(),
        **case["hints"],
    )


def _print_row(kind: str, variant: str, row: dict) -> None:
    """One line of the compact table the GPU request prints."""
    cfg = row["config"]
    tiles = (
        f"{cfg['block_m']}x{cfg['tile_n']} w{cfg['num_warps']} s{cfg['num_stages']} "
        f"seg{cfg['num_segments']}{'f' if cfg['fused_reduce'] else ''} kv{cfg['new_kv']}"
    )
    if "ms" not in row:
        print(f"{kind} | {variant:<18} | {row['shape']:<22} | {tiles} | ERROR {row['error'][:80]}")
        return
    if kind == "prefill":
        value = f"{row['tflops']:6.0f} TFLOP/s"
        ratio = f"{1 / row['over_sdpa']:.2f}x SDPA TFLOP/s"
    else:
        value = f"{row['ms'] * 1e3:6.1f} us {row['pct_copy_bw']:4.0f}% BW"
        ratio = f"{row['over_sdpa']:.2f}x SDPA time"
    flag = "" if row.get("exact") else " NOT EXACT"
    print(f"{kind} | {variant:<18} | {row['shape']:<22} | {tiles} | {value} | {ratio}{flag}",
          flush=True)


def sweep_prefill(sweep: Sweep, timer: Timer) -> None:
    """Each of ``PREFILL_VARIANTS`` on every prefill shape, TFLOP/s next to SDPA's."""
    cases = [prefill_case(*shape, DEVICE) for shape in PREFILLS]
    rows = sweep.results["prefill"] = []
    sweep.results["prefill_sdpa"] = sdpa = {}
    for case in cases:
        ms = timer.warm(case["sdpa"])
        sdpa[case["name"]] = {"ms": ms, "tflops": case["flops"] / ms / 1e9}
        tflops = sdpa[case["name"]]["tflops"]
        print(f"prefill | SDPA               | {case['name']:<22} | {tflops:.0f} TFLOP/s")
    for variant, cfg in PREFILL_VARIANTS:
        if sweep.over(f"prefill {variant}"):
            return
        for case in cases:
            row = _run_config(case, cfg or _default_config(case), timer.warm)
            row["step"] = variant
            if "ms" in row:
                row["tflops"] = case["flops"] / row["ms"] / 1e9
                row["over_sdpa"] = row["ms"] / sdpa[case["name"]]["ms"]
            rows.append(row)
            _print_row("prefill", variant, row)


def _decode_row(
    case: dict, cfg: AttentionLaunchConfig, timer: Timer, copy_bw: float, sdpa_ms: float
) -> dict:
    row = _run_config(case, cfg, timer.cold)
    if "ms" in row:
        row["pct_copy_bw"] = 100 * case["bytes"] / (row["ms"] * 1e-3) / copy_bw
        row["over_sdpa"] = row["ms"] / sdpa_ms
    return row


def sweep_decode(sweep: Sweep, timer: Timer, copy_bw: float) -> None:
    """The default and each of ``DECODE_VARIANTS`` on its shape, against contiguous SDPA."""
    rows = sweep.results["decode"] = []
    sweep.results["decode_sdpa"] = sdpa = {}
    for (batch, context), variants in DECODE_VARIANTS.items():
        if sweep.over(f"decode B{batch} C{context}"):
            return
        case = decode_case(batch, context, DEVICE)
        sdpa_ms = timer.cold(case["sdpa"])
        sdpa[case["name"]] = {
            "ms": sdpa_ms,
            "pct_copy_bw": 100 * case["bytes"] / (sdpa_ms * 1e-3) / copy_bw,
        }
        print(f"decode  | SDPA               | {case['name']:<22} | {sdpa_ms * 1e3:.1f} us "
              f"{sdpa[case['name']]['pct_copy_bw']:.0f}% BW", flush=True)
        named = [("default", _default_config(case))]
        named += [("candidate", AttentionLaunchConfig(*v)) for v in variants]
        for variant, cfg in named:
            if sweep.over(f"decode {case['name']} {cfg}"):
                return
            row = _decode_row(case, cfg, timer, copy_bw, sdpa_ms)
            row["step"] = variant
            rows.append(row)
            _print_row("decode ", variant, row)
        case = None
        if DEVICE == "cuda":
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
        "CUDA graphs: prefill 3 calls per replay (warm L2); decode 20 x (256 MiB L2 flush by "
        "reading, + call) per replay minus the flushes alone; median of 6 replays"
    )
    timer = Timer()
    try:
        # Decode first: its compiles are quick, so the budget cuts prefill variants, if any.
        if not args.skip_decode:
            sweep_decode(sweep, timer, copy_bw)
        if not args.skip_prefill:
            sweep_prefill(sweep, timer)
    finally:
        sweep.results["kernel_stats"] = _kernel_stats()
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(sweep.results, indent=2) + "\n")


if __name__ == "__main__":
    main()
