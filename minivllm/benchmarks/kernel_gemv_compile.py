"""Compile the small-M GEMM sweep's kernel variants in parallel, before any is timed
(GPU only; used by ``kernel_gemv.py --sweep``).

A sweep launches a few hundred distinct variants of the skinny GEMM kernel (tile shape,
split-K count, warps, stages, row block, gated or not), and Triton compiles each the first
time it is launched, on one CPU core. Compiled one after the other inside the timing loop,
compilation is most of the sweep's time. So the sweep first launches every variant once on
small inputs in several spawned processes: they fill Triton's on-disk cache, from which the
timing process then loads each variant in milliseconds.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import time

import torch

# One job: (a representative M, the GemvConfig's fields, gated).
Job = tuple[int, dict, bool]


def compile_variants(jobs: list[Job], dtype: torch.dtype) -> int:
    """Compile each job's variant by launching it on small ``dtype`` inputs that Triton
    specialises like the real shapes (every size a multiple of 16). Runs in a worker
    process; returns how many launched (a configuration that fails is left for the sweep,
    which records the error when it meets it)."""
    from minivllm.model_executor.layers.triton_skinny_gemm import launch_skinny_gemm
    from minivllm.model_executor.layers.utils import GemvConfig

    x = torch.randn(8, 512, dtype=dtype, device="cuda")
    w = torch.randn(64, 256, dtype=dtype, device="cuda")
    out = torch.empty(8, 64, dtype=dtype, device="cuda")
    done = 0
    for m, config, gated in jobs:
        m = min(m, 8)  # M is not specialised on: a few rows compile the same variant
        try:
            launch_skinny_gemm(out[:m], x[:m] if gated else x[:m, :256], w, None,
                               GemvConfig(**config), gated=gated)  # fmt: skip
            done += 1
        except Exception:  # noqa: BLE001 - the sweep records the error when it meets it
            pass
    torch.cuda.synchronize()
    return done


def compile_in_parallel(jobs: list[Job], workers: int, dtype: torch.dtype) -> float:
    """Compile ``jobs`` in ``workers`` spawned processes (CUDA cannot be forked); returns
    the seconds taken."""
    start = time.monotonic()
    chunks = [c for c in (jobs[i::workers] for i in range(workers)) if c]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        # A module-level function (in a partial): the spawned workers import it by name.
        done = sum(pool.map(functools.partial(compile_variants, dtype=dtype), chunks))
    print(f"compiled {done}/{len(jobs)} variants in {time.monotonic() - start:.1f} s", flush=True)
    return time.monotonic() - start
