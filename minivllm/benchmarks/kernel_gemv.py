"""The small-M GEMM kernel against ``torch.nn.functional.linear`` (cuBLAS) on the linear
layers of Qwen3-0.6B, and the launch-configuration sweep behind its defaults (GPU only).

``python -m minivllm.benchmarks.kernel_gemv --output OUT.json [--sweep]`` times, for each
layer shape (qkv 1024 -> 4096, o_proj 2048 -> 1024, gate_up 1024 -> 6144, down_proj
3072 -> 1024, lm_head 1024 -> 151936) and each batch size M (1, 2, 4, 8):

* ``F.linear`` (what the layers ran before, cuBLAS);
* the kernel with the configuration the layers use (``default_config``);
* with ``--sweep``, every candidate configuration of :data:`DOT_CONFIGS` and
  :data:`FMA_CONFIGS` with every split-K count of the shape; above 16 rows
  (``--batches 32 64 128 256``, a busy server's decode steps) :data:`MID_CONFIGS` with
  row blocks of :data:`MID_ROWS` instead;
* with ``--gated down_proj``, that layer again on ``[gate | up]``: the kernel with
  SiLU-and-mul fused into its loads against the activation kernel followed by cuBLAS,
  as the layer runs either way.

Timing: a CUDA graph of back-to-back calls, each on a different copy of the weight (enough
copies to exceed the L2 cache several times), so every call streams its weight from HBM as
in a model step, and launch overhead is amortised as under graph replay. Bandwidth is the
weight bytes (plus x and y) over the time. Each configuration's output is checked against a
float32 ``F.linear`` of the same inputs and run twice for bitwise equality (the split-K
reduction must be deterministic). ``--budget-s`` stops the sweep in time and marks the
rest skipped, so a GPU call with a time limit still returns a result. Before timing, a
sweep compiles every variant in ``--compile-workers`` processes (``kernel_gemv_compile.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minivllm.benchmarks.common import environment, measure_copy_bandwidth
from minivllm.benchmarks.kernel_gemv_compile import compile_in_parallel
from minivllm.utils.math_utils import next_power_of_2  # no Triton in the parent

DTYPE = torch.bfloat16
# (name, N output features, K input features) of Qwen3-0.6B's linear layers.
SHAPES = (
    ("qkv_proj", 4096, 1024),
    ("o_proj", 1024, 2048),
    ("gate_up_proj", 6144, 1024),
    ("down_proj", 1024, 3072),
    ("lm_head", 151936, 1024),
)
BATCHES = (1, 2, 4, 8)
# tensor-core candidates (block_n, block_k, num_warps, num_stages); BLOCK_M is 16.
DOT_CONFIGS = (
    (16, 256, 4, 3), (16, 512, 4, 3), (32, 256, 4, 3), (16, 128, 4, 4), (32, 128, 4, 4),
    (64, 128, 4, 3), (16, 256, 4, 4), (16, 512, 8, 3), (32, 256, 8, 3), (64, 256, 8, 3),
    (16, 128, 2, 4), (16, 256, 2, 3), (16, 1024, 8, 2),
)  # fmt: skip
# CUDA-core candidates (block_n, block_k, num_warps, num_stages), for M <= 4.
FMA_CONFIGS = (
    (8, 512, 4, 2), (16, 256, 4, 2), (8, 256, 4, 2), (4, 512, 4, 2), (8, 512, 4, 3),
    (8, 1024, 8, 2), (16, 512, 8, 2), (4, 1024, 4, 2), (8, 256, 2, 3), (4, 256, 2, 3),
)  # fmt: skip
# The tilings also tried with an L2 prefetch of the weights, and with programmatic
# dependent launch on top (which overlaps that prefetch with the previous kernel's end).
PREFETCH_SHORTLIST = (
    ((16, 128, 2, 4), True), ((32, 128, 4, 4), True), ((16, 256, 2, 3), True),
    ((4, 1024, 4, 2), False), ((8, 1024, 8, 2), False), ((4, 512, 4, 2), False),
)  # fmt: skip
# Decode batches above 16 rows (a busy server's steps): tensor-core tiles of BLOCK_M rows
# (several programs share a weight tile across row blocks, the repeats served from L2).
# (block_n, block_k, num_warps, num_stages); each tried with every row block of MID_ROWS
# up to the batch, and every split of the shape.
MID_CONFIGS = (
    (16, 128, 4, 3), (32, 128, 4, 3), (64, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 3),
    (16, 256, 4, 3), (32, 64, 4, 4), (64, 64, 4, 4),
)  # fmt: skip
MID_ROWS = (16, 32, 64, 128)
L2_FLUSH_BYTES = 256 << 20  # rotate weight copies totalling at least this much


def split_counts(n: int) -> tuple[int, ...]:
    """Split-K counts worth trying: narrow layers have too few output tiles to fill the GPU."""
    return (1, 2, 4, 8) if n <= 2048 else (1, 2) if n <= 8192 else (1,)


def _time_graph(calls: list[Callable[[], object]], replays: int = 10) -> float:
    """Microseconds per call: one CUDA graph of all ``calls`` back to back, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls[:2]:
            fn()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


class Shape:
    """Inputs for one (layer, M): ``x``, rotating weight copies, outputs, the reference."""

    def __init__(self, name: str, n: int, k: int, m: int, gated: bool = False) -> None:
        gen = torch.Generator(device="cuda").manual_seed(n * 31 + k * 7 + m)
        self.name, self.n, self.k, self.m, self.gated = name, n, k, m, gated
        self.weight_bytes = n * k * DTYPE.itemsize
        copies = max(2, -(-L2_FLUSH_BYTES // self.weight_bytes))
        w = torch.randn(n, k, dtype=DTYPE, device="cuda", generator=gen) * k**-0.5
        self.weights = [w] + [w.clone() for _ in range(copies - 1)]
        # gated: x is [gate | up], and the layer's input is silu(gate) * up (down_proj
        # after gate_up_proj); torch then runs the activation kernel before cuBLAS.
        self.x = torch.randn(m, 2 * k if gated else k, dtype=DTYPE, device="cuda", generator=gen)
        self.out = torch.empty(m, n, dtype=DTYPE, device="cuda")
        x = self.x.float()
        x = F.silu(x[:, :k]) * x[:, k:] if gated else x
        self.reference = F.linear(x, w.float())
        self.calls = max(20, copies)
        self.bytes = self.weight_bytes + (self.x.numel() + m * n) * DTYPE.itemsize

    def row(self, us: float, copy_bw: float) -> dict:
        """The timing as a result row (time, bandwidth, share of copy bandwidth)."""
        bw = self.bytes / (us * 1e-6)
        return {"us": us, "gb_per_s": bw / 1e9, "pct_copy_bw": 100 * bw / copy_bw}

    def _rotation(self) -> list[torch.Tensor]:
        """The weight copy each call of a timed graph reads, in turn."""
        return [self.weights[i % len(self.weights)] for i in range(self.calls)]

    def time_torch(self) -> float:
        """``F.linear`` (cuBLAS), microseconds per call; with ``gated``, the layers'
        SiLU-and-mul kernel first."""
        if self.gated:
            from minivllm.model_executor.layers.triton_activation import silu_and_mul

            return _time_graph(
                [lambda w=w: F.linear(silu_and_mul(self.x), w) for w in self._rotation()]
            )
        return _time_graph([lambda w=w: F.linear(self.x, w) for w in self._rotation()])

    def check(self, launch: Callable[[torch.Tensor], None]) -> dict:
        """Error against the float32 reference, and whether two runs agree bit for bit."""
        launch(self.weights[0])
        first = self.out.clone()
        launch(self.weights[0])
        scale = self.reference.abs().max().item()
        err = (first.float() - self.reference).abs().max().item()
        return {"max_rel_err": err / scale, "deterministic": bool(torch.equal(first, self.out))}

    def check_after_write(self, config) -> float:
        """Error when the kernel reads an ``x`` that the kernel just before it wrote.

        What programmatic dependent launch must get right: a CUDA graph of "write -x into
        a buffer" then the kernel on that buffer. Reading x before the write had finished
        would give +reference instead of -reference.
        """
        from minivllm.model_executor.layers.triton_skinny_gemm import launch_skinny_gemm

        buf = self.x.clone()
        calls = [
            lambda: torch.neg(self.x, out=buf),
            lambda: launch_skinny_gemm(self.out, buf, self.weights[0], None, config),
        ]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for fn in calls:
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        buf.copy_(self.x)
        graph.replay()
        torch.cuda.synchronize()
        scale = self.reference.abs().max().item()
        return (self.out.float() + self.reference).abs().max().item() / scale

    def time_kernel(self, config) -> dict:
        """Check and time the kernel with ``config``; microseconds per call."""
        from minivllm.model_executor.layers.triton_skinny_gemm import launch_skinny_gemm

        def launch(w: torch.Tensor) -> None:
            launch_skinny_gemm(self.out, self.x, w, None, config, gated=self.gated)

        checked = self.check(launch)
        if config.pdl:
            checked["pdl_after_write_rel_err"] = self.check_after_write(config)
        us = _time_graph([lambda w=w: launch(w) for w in self._rotation()])
        return {"us": us, **checked}


def candidate_configs(m: int, n: int) -> list:
    """Every configuration the sweep tries for M = ``m`` on a layer with ``n`` outputs,
    tensor-core and CUDA-core tilings alternating (so a time budget cuts both alike)."""
    from minivllm.model_executor.layers.utils import GemvConfig

    if m > 16:
        return mid_configs(m, n)
    bases = [(cfg, True) for cfg in DOT_CONFIGS]
    if m <= 4:
        block_m = next_power_of_2(m)
        # Drop CUDA-core tiles whose product tile would not fit in 128 registers a thread.
        fma = [c for c in FMA_CONFIGS if block_m * c[0] * c[1] <= 128 * 32 * c[2]]
        bases = [b for pair in itertools.zip_longest(bases, [(c, False) for c in fma])
                 for b in pair if b is not None]  # fmt: skip
    out = [GemvConfig(bn, bk, s, w, st, use_dot=dot)
           for ((bn, bk, w, st), dot), s in itertools.product(bases, split_counts(n))]  # fmt: skip
    for ((bn, bk, w, st), dot), s, pdl in itertools.product(
        PREFETCH_SHORTLIST, split_counts(n), (False, True)
    ):
        if ((bn, bk, w, st), dot) in bases:
            out.append(GemvConfig(bn, bk, s, w, st, use_dot=dot, prefetch=True, pdl=pdl))
    return out


def mid_configs(m: int, n: int) -> list:
    """The candidates above 16 rows: :data:`MID_CONFIGS` with each row block of
    :data:`MID_ROWS` that does not exceed the batch, and each split of the shape."""
    from minivllm.model_executor.layers.utils import GemvConfig

    rows = [r for r in MID_ROWS if r <= next_power_of_2(m)]
    return [GemvConfig(bn, bk, s, w, st, block_m=r)
            for (bn, bk, w, st), r, s in itertools.product(MID_CONFIGS, rows, split_counts(n))
            if s <= 4]  # fmt: skip


def _variants(args: argparse.Namespace) -> list[tuple[int, dict, bool]]:
    """The distinct compiled variants the sweep launches: (a representative M, config,
    gated)."""
    seen: dict[tuple, tuple[int, dict, bool]] = {}
    for m in args.batches:
        for name, n, _ in SHAPES:
            for cfg, gated in itertools.product(candidate_configs(m, n), (False, True)):
                if gated and name not in args.gated:
                    continue
                key = (cfg.rows_per_program(m), gated, *cfg.__dict__.values())
                seen.setdefault(key, (m, dict(cfg.__dict__), gated))
    return list(seen.values())


def run(args: argparse.Namespace) -> dict:
    """Time torch and the kernel on every shape; with ``args.sweep`` every candidate."""
    from minivllm.model_executor.layers.utils import default_config

    start = time.monotonic()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    copy_bw = measure_copy_bandwidth()
    result = {
        **environment(),
        "copy_bandwidth_bytes_per_s": copy_bw,
        "dtype": str(DTYPE),
        "timing": "CUDA graph of back-to-back calls on rotating weight copies "
        f"(>= {L2_FLUSH_BYTES >> 20} MiB, so L2 is cold), median of 10 replays",
        "rows": [],
    }
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    if args.sweep and args.compile_workers > 0:
        result["compile_s"] = compile_in_parallel(_variants(args), args.compile_workers, DTYPE)
    shapes = [(*s, False) for s in SHAPES if s[0] in args.layers]
    shapes += [(*s, True) for s in SHAPES if s[0] in args.gated]
    for m in args.batches:
        for name, n, k, gated in shapes:
            shape = Shape(name, n, k, m, gated)
            torch_us = shape.time_torch()
            row = {
                "layer": f"{name}_gated" if gated else name,
                "gated": gated,
                "n": n,
                "k": k,
                "m": m,
                "bytes": shape.bytes,
                "torch": shape.row(torch_us, copy_bw),
            }
            cfg = default_config(m, n, k)
            try:
                timed = shape.time_kernel(cfg)
            except Exception as exc:  # noqa: BLE001 - keep the torch figure and the sweep
                row["kernel"] = {"config": cfg.__dict__, "error": repr(exc)[:300]}
                print(f"M{m} {row['layer']}: default config failed: {exc!r}"[:300], flush=True)
            else:
                row["kernel"] = {"config": cfg.__dict__, **timed, **shape.row(timed["us"], copy_bw)}
                row["speedup"] = torch_us / timed["us"]
                print(
                    f"M{m} {row['layer']:15s} torch {torch_us:7.2f} us "
                    f"({row['torch']['gb_per_s']:5.0f} GB/s)  kernel {timed['us']:7.2f} us "
                    f"({row['kernel']['gb_per_s']:5.0f} GB/s) x{row['speedup']:.2f} "
                    f"err {timed['max_rel_err']:.1e}",
                    flush=True,
                )
            if args.sweep and name != "lm_head":
                row["sweep"] = _sweep(shape, copy_bw, start + args.budget_s)
                swept = [r for r in row["sweep"] if "us" in r]
                if swept:
                    row["best"] = min(swept, key=lambda r: r["us"])
            result["rows"].append(row)
            # Written after every row: a run stopped by a time limit keeps what it measured.
            result["elapsed_s"] = time.monotonic() - start
            output.write_text(json.dumps(result, indent=2) + "\n")
            del shape
            torch.cuda.empty_cache()
    return result


def _sweep(shape: Shape, copy_bw: float, deadline: float) -> list[dict]:
    """Every candidate on ``shape``, until ``deadline`` (time.monotonic)."""
    rows = []
    for cfg in candidate_configs(shape.m, shape.n):
        if time.monotonic() > deadline:
            rows.append({"config": cfg.__dict__, "skipped": "time budget"})
            continue
        try:
            timed = shape.time_kernel(cfg)
        except Exception as exc:  # noqa: BLE001 - e.g. out of registers or shared memory
            rows.append({"config": cfg.__dict__, "error": repr(exc)[:200]})
            continue
        rows.append({"config": cfg.__dict__, **timed, **shape.row(timed["us"], copy_bw)})
    timed_rows = [r for r in rows if "us" in r]
    if timed_rows:
        best = min(timed_rows, key=lambda r: r["us"])
        print(
            f"   best {best['config']} {best['us']:.2f} us ({best['gb_per_s']:.0f} GB/s), "
            f"{len(timed_rows)}/{len(rows)} timed",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m minivllm.benchmarks.kernel_gemv``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results/kernel_gemv.json")
    parser.add_argument("--sweep", action="store_true", help="time every candidate config")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument(
        "--layers", nargs="+", default=[s[0] for s in SHAPES], choices=[s[0] for s in SHAPES]
    )
    parser.add_argument(
        "--gated", nargs="*", default=[], choices=["down_proj"],
        help="also time these layers on [gate | up] with SiLU-and-mul fused (torch: the "
        "activation kernel, then cuBLAS)",
    )  # fmt: skip
    parser.add_argument(
        "--compile-workers",
        type=int,
        default=12,
        help="processes that compile the sweep's variants first (0: compile as met)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=140.0,
        help="stop sweeping after this many seconds (the rest is skipped)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: needs a CUDA GPU (it times CUDA graphs)\n")
    run(args)


if __name__ == "__main__":
    main()
