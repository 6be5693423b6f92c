"""``python -m minivllm.benchmarks.all_reduce``: one all-reduce, NCCL against the
symmetric-memory one-shot and two-shot kernels, by message size, on the GPUs of one node.

Upstream counterpart: ``benchmarks/kernels/benchmark_device_communicators.py`` (every
communicator timed inside CUDA graphs). Messages are ``[tokens, hidden]`` activations,
as a row-parallel layer reduces them. Each measurement captures ``--reps`` all-reduces of
one static tensor in a CUDA graph (the engine replays its all-reduces from graphs too,
so the launch cost is the graph's, not Python's) and replays it ``--iters`` times
between two CUDA events. Before timing, each kernel's sum of random data is compared
with NCCL's bit for bit. NVLink multicast stays off (``TORCH_SYMM_MEM_DISABLE_MULTICAST``,
``NCCL_NVLS_ENABLE``); rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minivllm.benchmarks.common import default_output, environment, write_json
from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from minivllm.distributed.symm_mem import SymmMemCommunicator
from minivllm.distributed.utils import get_distributed_init_method, get_open_port

MODES = ("nccl", "one_shot", "two_shot")
_MULTICAST_OFF = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}


def add_args(parser: argparse.ArgumentParser) -> None:
    """Register the benchmark's options."""
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024, 2048]
    )
    parser.add_argument("--reps", type=int, default=20, help="all-reduces per CUDA graph")
    parser.add_argument("--iters", type=int, default=20, help="timed replays per size")
    parser.add_argument("--output", default=default_output("all_reduce.json"))


def _reduce(mode: str, comm: SymmMemCommunicator, x: torch.Tensor) -> None:
    if mode == "nccl":
        dist.all_reduce(x)
    else:
        comm.force_algorithm = mode
        comm.all_reduce(x)


def _equal_to_nccl(mode: str, comm: SymmMemCommunicator, shape: tuple[int, int]) -> bool:
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    ref = x.clone()
    dist.all_reduce(ref)
    _reduce(mode, comm, x)
    return bool(torch.equal(x, ref))


def _time_us(mode: str, comm: SymmMemCommunicator, x: torch.Tensor, reps: int, iters: int) -> float:
    """Microseconds per all-reduce of ``x``, replayed from a graph of ``reps`` of them."""
    _reduce(mode, comm, x)  # warm-up outside the graph (NCCL sets up its channels)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            _reduce(mode, comm, x)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (iters * reps)


def _row(comm: SymmMemCommunicator, tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    shape = (tokens, args.hidden_size)
    x = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")  # zeros stay finite
    row: dict[str, Any] = {"tokens": tokens, "bytes": x.numel() * x.element_size()}
    for mode in MODES:
        if mode != "nccl" and not comm.should_use_symm_mem(x):
            row[f"{mode}_us"] = None
            continue
        if mode != "nccl":
            row[f"{mode}_equal_to_nccl"] = _equal_to_nccl(mode, comm, shape)
        row[f"{mode}_us"] = _time_us(mode, comm, x, args.reps, args.iters)
    return row


def _rank(rank: int, args: argparse.Namespace, init: str) -> None:
    torch.cuda.set_device(rank)
    torch.manual_seed(rank)
    init_distributed_environment(args.world_size, rank, init, "nccl")
    try:
        largest = max(args.tokens) * args.hidden_size * 2
        comm = SymmMemCommunicator(None, torch.device("cuda", rank), max_size=largest)
        if comm.disabled:
            raise RuntimeError(f"symmetric memory is unavailable: {comm.reason}")
        rows = [_row(comm, t, args) for t in args.tokens]
        if rank == 0:
            _report(args, rows)
    finally:
        destroy_distributed_environment()


def _report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    result = {
        **environment(),
        "env": {k: os.environ.get(k) for k in _MULTICAST_OFF},
        "world_size": args.world_size,
        "hidden_size": args.hidden_size,
        "dtype": "bfloat16",
        "reps_per_graph": args.reps,
        "timed_replays": args.iters,
        "rows": rows,
    }
    write_json(Path(args.output), result)
    print(f"{'tokens':>7} {'bytes':>9} " + " ".join(f"{m + ' us':>12}" for m in MODES))
    for r in rows:
        cells = [f"{r[m + '_us']:12.1f}" if r[m + "_us"] else f"{'-':>12}" for m in MODES]
        equal = all(r.get(f"{m}_equal_to_nccl", True) for m in MODES[1:])
        print(f"{r['tokens']:>7} {r['bytes']:>9} " + " ".join(cells) + ("" if equal else " !="))


def run(args: argparse.Namespace) -> None:
    """Spawn one process per GPU and run the sweep; rank 0 writes ``args.output``."""
    if args.world_size < 2:
        raise ValueError(f"--world-size must be at least 2, got {args.world_size}")
    if torch.cuda.device_count() < args.world_size:
        raise ValueError(
            f"--world-size {args.world_size} needs as many GPUs; "
            f"{torch.cuda.device_count()} visible"
        )
    for key, value in _MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    init = get_distributed_init_method("127.0.0.1", get_open_port())
    mp.start_processes(_rank, args=(args, init), nprocs=args.world_size, start_method="spawn")


def main() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
