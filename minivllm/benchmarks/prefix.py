"""``minivllm bench prefix``: requests sharing a 4096-token prefix with short outputs,
prefix caching on vs off, in one run."""

from __future__ import annotations

import argparse
import gc
import statistics
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import default_output, environment, write_json
from minivllm.benchmarks.throughput import (
    add_engine_bench_args,
    build_llm,
    checkpoint_path,
    generate_workload,
)
from minivllm.benchmarks.workloads import shared_prefix_workload


def add_prefix_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench prefix``."""
    add_engine_bench_args(parser, default_output("prefix.json"))
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=4096)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs per setting; the median is reported")


def run_prefix_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the shared-prefix workload with and without prefix caching."""
    import torch

    path = checkpoint_path(args)
    workload = shared_prefix_workload(args.num_requests, args.prefix_len, args.suffix_len,
                                      args.output_len)
    max_len = max(args.max_model_len, args.prefix_len + args.suffix_len + args.output_len)
    result: dict[str, Any] = {**environment(), "num_requests": args.num_requests,
                              "prefix_len": args.prefix_len, "suffix_len": args.suffix_len,
                              "output_len": args.output_len}
    for caching in (True, False):
        llm = build_llm(args, path, max_model_len=max_len, enable_prefix_caching=caching)
        # Warm-up on the workload itself (each run starts from a cold prefix cache): Triton
        # compiles a kernel variant the first time it meets a new specialization, and a
        # smaller warm-up left some of those compilations inside the timed run.
        generate_workload(llm, workload)
        # The cached run takes ~0.2 s on an H200, so one run is noisy: report the median.
        runs = []
        before = llm.llm_engine.stats  # cumulative counters: the timed runs' share is the delta
        for _ in range(args.repeats):
            runs.append(generate_workload(llm, workload))
        seconds = statistics.median(runs)
        after = llm.llm_engine.stats
        queries = after.prefix_cache_queries - before.prefix_cache_queries
        hits = after.prefix_cache_hits - before.prefix_cache_hits
        hit_rate = hits / queries if queries else 0.0
        key = "caching_on" if caching else "caching_off"
        result[key] = {"seconds": seconds, "runs_seconds": runs,
                       "prefix_cache_hit_rate": hit_rate,
                       "requests_per_s": args.num_requests / seconds}
        print(f"prefix caching {'on ' if caching else 'off'}: {seconds:.3f} s (median of "
              f"{len(runs)}), hit rate {hit_rate:.1%}", flush=True)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result["speedup"] = result["caching_off"]["seconds"] / result["caching_on"]["seconds"]
    print(f"prefix caching speedup: {result['speedup']:.1f}x", flush=True)
    write_json(Path(args.output), result)
    return result
