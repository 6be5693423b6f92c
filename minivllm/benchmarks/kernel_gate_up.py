"""The fused gate/up + SiLU-and-mul kernel against cuBLAS followed by the activation
kernel, on Qwen3-0.6B's ``gate_up_proj`` (or another model's, ``--d`` and ``--k``) at
decode batch sizes, and the tile sweep behind ``GATE_UP_SILU_TABLE`` (GPU only).

``python -m minivllm.benchmarks.kernel_gate_up --output OUT.json [--sweep]`` times, for
each batch size M of ``--batches``:

* ``apart``: ``F.linear`` (cuBLAS) then ``silu_and_mul`` (the Triton kernel), as the MLP
  runs without the fusion: two launches;
* ``cublas``: ``F.linear`` alone, the part of ``apart`` the fusion has to match;
* ``fused``: the kernel with the layers' configuration (``gate_up_silu_config``);
* with ``--sweep``, every tiling of :func:`candidate_configs`, and the best.

Timing as in ``kernel_gemv.py``: a CUDA graph of back-to-back calls, each on another copy
of the weight (enough copies to exceed L2 several times), so every call streams its weight
from HBM as in a model step and the gap between launches is that of graph replay. Each
configuration's output is checked against a float32 reference. Before timing, a sweep
compiles every variant in ``--compile-workers`` spawned processes (the kernel does not
specialise on M, so each tiling compiles once for all batches).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minivllm.benchmarks.common import environment, measure_copy_bandwidth
from minivllm.benchmarks.kernel_gemv import L2_FLUSH_BYTES, _time_graph
from minivllm.utils.math_utils import next_power_of_2

DTYPE = torch.bfloat16
D, K = 3072, 1024  # Qwen3-0.6B: gate_up_proj is [2 x 3072, 1024] (--d, --k: another model)
BATCHES = (3, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256)
SMEM_LIMIT = 200 << 10  # bytes a tiling's pipelined loads may take (the H200 has 227 KiB)


def candidate_configs(m: int) -> list:
    """Tilings worth timing at ``m`` rows: row blocks up to ``m``'s next power of two, 16 to 64
    output columns (x2 weight rows: gate and up), 64 to 256 inputs per step, four
    warp/stage pairs; those whose pipelined tiles would not fit in shared memory left out."""
    from minivllm.model_executor.layers.utils import GemvConfig

    configs = []
    for bm, bn, bk, (warps, stages) in itertools.product(
        (16, 32, 64, 128), (16, 32, 64), (64, 128, 256), ((2, 4), (4, 3), (4, 4), (8, 3))
    ):
        smem = stages * (bm + 2 * bn) * bk * DTYPE.itemsize
        if bm > max(16, next_power_of_2(m)) or smem > SMEM_LIMIT:
            continue
        configs.append(GemvConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps,
                                  num_stages=stages))  # fmt: skip
    return configs


def _compile(configs: list[dict]) -> int:
    """Launch each tiling once on small inputs shaped like the real ones (every size a
    multiple of 16, which is all Triton specialises on): fills Triton's cache. Runs in a
    spawned worker."""
    from minivllm.model_executor.layers.triton_gate_up_silu import launch_gate_up_silu
    from minivllm.model_executor.layers.utils import GemvConfig

    x = torch.randn(16, K, dtype=DTYPE, device="cuda")
    w = torch.randn(2 * 256, K, dtype=DTYPE, device="cuda")
    out = torch.empty(16, 256, dtype=DTYPE, device="cuda")
    done = 0
    for config in configs:
        try:
            launch_gate_up_silu(out, x, w, GemvConfig(**config))
            done += 1
        except Exception:  # noqa: BLE001 - the sweep records the error when it meets it
            pass
    torch.cuda.synchronize()
    return done


def compile_in_parallel(configs: list, workers: int) -> float:
    """Compile ``configs`` in ``workers`` spawned processes; returns the seconds taken."""
    start = time.monotonic()
    jobs = [dict(c.__dict__) for c in configs]
    chunks = [c for c in (jobs[i::workers] for i in range(workers)) if c]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(chunks), mp_context=ctx) as pool:
        done = sum(pool.map(_compile, chunks))
    print(f"compiled {done}/{len(jobs)} variants in {time.monotonic() - start:.1f} s", flush=True)
    return time.monotonic() - start


class GateUp:
    """Inputs for one batch size: ``x``, rotating weight copies, the output, the reference."""

    def __init__(self, m: int, d: int = D, k: int = K) -> None:
        gen = torch.Generator(device="cuda").manual_seed(m)
        self.m = m
        w = torch.randn(2 * d, k, dtype=DTYPE, device="cuda", generator=gen) * k**-0.5
        copies = max(2, -(-L2_FLUSH_BYTES // (w.numel() * DTYPE.itemsize)))
        self.weights = [w] + [w.clone() for _ in range(copies - 1)]
        self.x = torch.randn(m, k, dtype=DTYPE, device="cuda", generator=gen)
        self.out = torch.empty(m, d, dtype=DTYPE, device="cuda")
        gate_up = F.linear(self.x.float(), w.float())
        self.reference = F.silu(gate_up[:, :d]) * gate_up[:, d:]
        self.calls = max(20, copies)

    def _rotation(self) -> list[torch.Tensor]:
        return [self.weights[i % len(self.weights)] for i in range(self.calls)]

    def time_apart(self) -> tuple[float, float]:
        """Microseconds per call of cuBLAS + the activation kernel, and of cuBLAS alone."""
        from minivllm.model_executor.layers.triton_activation import silu_and_mul

        rotation = self._rotation()
        apart = _time_graph([lambda w=w: silu_and_mul(F.linear(self.x, w)) for w in rotation])
        return apart, _time_graph([lambda w=w: F.linear(self.x, w) for w in rotation])

    def time_fused(self, config) -> dict:
        """Check and time the fused kernel with ``config``."""
        from minivllm.model_executor.layers.triton_gate_up_silu import launch_gate_up_silu

        def launch(w: torch.Tensor) -> None:
            launch_gate_up_silu(self.out, self.x, w, config)

        launch(self.weights[0])
        err = (self.out.float() - self.reference).abs().max().item()
        rel = err / self.reference.abs().max().item()
        return {"us": _time_graph([lambda w=w: launch(w) for w in self._rotation()]),
                "max_rel_err": rel}  # fmt: skip


def _sweep(shape: GateUp, deadline: float) -> list[dict]:
    rows = []
    for config in candidate_configs(shape.m):
        if time.monotonic() > deadline:
            rows.append({"config": config.__dict__, "skipped": "time budget"})
            continue
        try:
            rows.append({"config": config.__dict__, **shape.time_fused(config)})
        except Exception as exc:  # noqa: BLE001 - e.g. out of registers or shared memory
            rows.append({"config": config.__dict__, "error": repr(exc)[:200]})
    return rows


def run(args: argparse.Namespace) -> dict:
    """Time the two-launch layer and the fused kernel at every batch; with ``args.sweep``
    every candidate tiling. Writes ``args.output`` after each batch."""
    from minivllm.model_executor.layers.utils import gate_up_silu_config

    start = time.monotonic()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    result = {
        **environment(),
        "copy_bandwidth_bytes_per_s": measure_copy_bandwidth(),
        "shape": {"d": args.d, "k": args.k, "dtype": str(DTYPE)},
        "timing": "CUDA graph of back-to-back calls on rotating weight copies "
        f"(>= {L2_FLUSH_BYTES >> 20} MiB, so L2 is cold), median of 10 replays",
        "rows": [],
    }
    if args.sweep and args.compile_workers > 0:
        configs = {c for m in args.batches for c in candidate_configs(m)}
        result["compile_s"] = compile_in_parallel(sorted(configs, key=str), args.compile_workers)
    for m in args.batches:
        shape = GateUp(m, args.d, args.k)
        apart, cublas = shape.time_apart()
        config = gate_up_silu_config(m, args.d, args.k)
        row = {"m": m, "apart_us": apart, "cublas_us": cublas,
               "fused": {"config": config.__dict__, **shape.time_fused(config)}}  # fmt: skip
        if args.sweep:
            row["sweep"] = _sweep(shape, start + args.budget_s)
            timed = [r for r in row["sweep"] if "us" in r]
            if timed:
                row["best"] = min(timed, key=lambda r: r["us"])
        best = row.get("best", row["fused"])
        fused = row["fused"]["us"]
        print(f"M{m:4d} apart {apart:6.2f} us (cuBLAS {cublas:6.2f})  fused {fused:6.2f}"
              f"  best {best['us']:6.2f} {best['config']}", flush=True)  # fmt: skip
        result["rows"].append(row)
        result["elapsed_s"] = time.monotonic() - start
        output.write_text(json.dumps(result, indent=2) + "\n")
        del shape
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m minivllm.benchmarks.kernel_gate_up``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results/kernel_gate_up.json")
    parser.add_argument("--sweep", action="store_true", help="time every candidate tiling")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--d", type=int, default=D, help="outputs (the intermediate size)")
    parser.add_argument("--k", type=int, default=K, help="inputs (the hidden size)")
    parser.add_argument("--compile-workers", type=int, default=12,
                        help="processes that compile the sweep's variants first")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="stop sweeping after this many seconds")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: needs a CUDA GPU (it times CUDA graphs)\n")
    run(args)


if __name__ == "__main__":
    main()
