"""``minivllm bench throughput --cold``: the throughput workload as a new user first meets it.

A user's first run on a new machine starts from an empty Triton cache. Every kernel
variant the engine launches is compiled once, and a variant first met during a timed run
stalls it for a second or more (see ``worker/kernel_warmup.py``). So this benchmark runs
the workload the way nano-vllm's own benchmark does (one tiny warm-up ``generate``, then
the whole workload at temperature 0.6 through ``LLM.generate``), in a fresh process whose
``TRITON_CACHE_DIR`` is an empty folder, and reports:

* start-up time, from ``LLM(...)`` to ready, cold (empty cache) and warm (the same
  folder, now filled, in a second fresh process);
* the first timed run against a second one in the same process (equal when nothing
  compiles mid-run), and a greedy run;
* each as output tokens/s and as a share of the decode roofline, with the kernels Triton
  compiled during it (new entries in the cache folder: 0 when the start-up compiled
  everything), the caching allocator's trips to the driver (``cudaMalloc``, ``cudaFree``,
  retries after freeing its cache), the step loop's busy time and garbage-collector
  pauses, and the process's minor page faults (memory touched for the first time);
* where the first run lost time against the second, step by step
  (``benchmarks/step_compare.py``).

Upstream counterpart: ``vllm bench throughput`` (``vllm/benchmarks/throughput.py``), which
does not separate cold from warm; its start-up compiles (torch.compile, CUDA graphs) are
cached under ``~/.cache/vllm`` the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import cuda_sync, environment, measure_copy_bandwidth, write_json
from minivllm.benchmarks.throughput import (
    SAMPLED_TEMPERATURE,
    build_llm,
    checkpoint_path,
    generate_workload,
    workload_roofline,
)
from minivllm.benchmarks.workloads import throughput_workload

# The options a child process needs to rebuild the same engine and workload.
_FORWARDED = ("model", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
              "gpu_memory_utilization", "attention_backend", "dtype", "tensor_parallel_size",
              "async_scheduling", "num_requests")


def run_cold_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Parent: run a cold and a warm child, combine their JSON. Child: measure one process."""
    if args.cold_child:
        result = measure_one_process(args)
        write_json(Path(args.output), result)
        return result
    checkpoint_path(args)  # create the random checkpoint here, outside the timings
    with tempfile.TemporaryDirectory(prefix="minivllm-triton-cache-") as cache:
        cold = _run_child(args, cache)
        warm = _run_child(args, cache)
    first, second = cold["first_run"], cold["second_run"]
    result = {**environment(), "workload": cold["workload"], "roofline": cold["roofline"],
              "cold": cold, "warm": warm,
              "first_over_second": first["output_tokens_per_s"] / second["output_tokens_per_s"]}
    print(f"cold start {cold['startup_s']:.1f} s, warm start {warm['startup_s']:.1f} s; "
          f"first timed run {first['output_tokens_per_s']:.0f} tok/s, second "
          f"{second['output_tokens_per_s']:.0f} tok/s ({result['first_over_second']:.1%})",
          flush=True)
    steps = cold.get("first_vs_second_steps")
    if steps is not None:
        print(f"the first run's steps took {more_or_less(steps['excess_s'])} than the "
              f"second's: {more_or_less(steps['prefill_excess_s'])} in prefill steps, "
              f"{more_or_less(steps['decode_excess_s'])} in decode steps; "
              f"{more_or_less(steps['launch_excess_s'])} launching, "
              f"{more_or_less(steps['wait_excess_s'])} waiting", flush=True)
    write_json(Path(args.output), result)
    return result


def more_or_less(seconds: float) -> str:
    """A difference in seconds as milliseconds "more" or "less" (never "-4 ms more")."""
    ms = round(1e3 * seconds)
    return f"{abs(ms)} ms {'less' if ms < 0 else 'more'}"


def _run_child(args: argparse.Namespace, cache: str) -> dict[str, Any]:
    """One fresh process with ``TRITON_CACHE_DIR=cache``; returns its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        argv = [sys.executable, "-m", "minivllm.cli", "bench", "throughput", "--cold-child",
                "--output", str(out), "--input-len-range", *map(str, args.input_len_range),
                "--output-len-range", *map(str, args.output_len_range)]
        for name in _FORWARDED:
            value = getattr(args, name)
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        if args.enforce_eager:
            argv.append("--enforce-eager")
        if getattr(args, "allow_cpu", False):
            argv.append("--allow-cpu")
        subprocess.run(argv, env={**os.environ, "TRITON_CACHE_DIR": cache}, check=True)
        return json.loads(out.read_text())


def measure_one_process(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine (timed), warm up on one tiny request, then time the workload
    twice sampled and once greedy."""
    from minivllm import SamplingParams
    from minivllm.benchmarks.step_compare import StepLog, compare_steps
    from minivllm.benchmarks.throughput_repeats import (
        GcPauses,
        minor_page_faults,
        page_faults_since,
    )

    workload = throughput_workload(args.num_requests, 0, tuple(args.input_len_range),
                                   tuple(args.output_len_range))
    path = checkpoint_path(args)
    cuda_sync()
    start = time.perf_counter()
    llm = build_llm(args, path)
    cuda_sync()
    result: dict[str, Any] = {"startup_s": time.perf_counter() - start, "workload": {
        "num_requests": len(workload.prompts), "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens}}
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8),
                 use_tqdm=False)
    roof = None
    if args.tensor_parallel_size == 1:  # with TP the model is in the workers
        roof = workload_roofline(llm, workload, measure_copy_bandwidth())
    result["roofline"] = None if roof is None else vars(roof)
    runs = (("first_run", SAMPLED_TEMPERATURE), ("second_run", SAMPLED_TEMPERATURE),
            ("greedy_run", 0.0))
    logs = {}
    one_rank = args.tensor_parallel_size == 1  # the instruments wrap the in-process core
    for name, temperature in runs:
        before, allocator, faults = triton_cache_entries(), allocator_counts(), minor_page_faults()
        with contextlib.ExitStack() as stack:
            if one_rank:
                pauses = stack.enter_context(GcPauses())
                logs[name] = stack.enter_context(StepLog(llm))
            seconds = generate_workload(llm, workload, temperature)
        after = triton_cache_entries()
        rate = workload.num_output_tokens / seconds
        result[name] = {"temperature": temperature, "seconds": seconds,
                        "output_tokens_per_s": rate,
                        "kernels_compiled": None if before is None else len(after - before),
                        "compiled": [] if before is None else compiled_kernels(after - before),
                        "allocator": allocator_delta(allocator, allocator_counts()),
                        "minor_page_faults": page_faults_since(faults)}
        if one_rank:
            result[name].update(host_busy_s=logs[name].busy_s, gc_s=pauses.seconds)
        if roof is not None:
            result[name]["fraction_of_roofline"] = rate / roof.max_output_tokens_per_s
        print(f"{name}: {rate:.0f} output tok/s (temperature {temperature}), "
              f"{result[name]['kernels_compiled']} kernels compiled "
              f"{result[name]['compiled']}, allocator {result[name]['allocator']}", flush=True)
    if logs:
        result["first_vs_second_steps"] = compare_steps(logs["first_run"], logs["second_run"])
    llm.shutdown()
    return result


# The caching allocator's counters that show it going to the driver during a run: each
# cudaMalloc and cudaFree (a cudaFree waits for the whole device), and each allocation
# that failed and was retried after freeing every cached block.
_ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def allocator_counts() -> dict[str, int] | None:
    """The CUDA caching allocator's driver calls and retries so far; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in _ALLOCATOR_COUNTERS}


def allocator_delta(
    before: dict[str, int] | None, after: dict[str, int] | None
) -> dict[str, int] | None:
    """``after - before`` per counter (None when either is None)."""
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in before}


def triton_cache_entries() -> set[str] | None:
    """The entries of ``TRITON_CACHE_DIR`` (one per compiled kernel variant); None when
    the variable is unset (Triton then uses its default folder, shared with others)."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    if not folder or not os.path.isdir(folder):
        return None
    return set(os.listdir(folder))


def compiled_kernels(entries: set[str]) -> list[str]:
    """The kernel names behind new ``TRITON_CACHE_DIR`` entries: each entry is a folder
    holding ``<kernel>.json`` (its metadata) beside the binaries; the group files Triton
    writes (``__grp__*``) are not kernels."""
    folder = os.environ["TRITON_CACHE_DIR"]
    names = []
    for entry in sorted(entries):
        path = os.path.join(folder, entry)
        if os.path.isdir(path):
            names += [f[: -len(".json")] for f in sorted(os.listdir(path))
                      if f.endswith(".json") and not f.startswith("__grp__")]  # fmt: skip
    return names
