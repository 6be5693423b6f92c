"""``minivllm bench latency``: one request at a time; time to first token and time per
output token (the decode step latency a single user sees)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import cuda_sync, environment, write_json
from minivllm.benchmarks.throughput import add_engine_bench_args, build_llm, checkpoint_path


def add_latency_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench latency``."""
    add_engine_bench_args(parser, "bench-results/latency.json")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile-dir", default=None,
                        help="also write a torch profiler trace of 8 decode steps here")


def _one_request(llm, prompt: list[int], output_len: int) -> tuple[float, float]:
    """Drive the engine step by step: return (time to first token, time per next token)."""
    from minivllm import SamplingParams

    engine = llm.llm_engine
    engine.reset_prefix_cache()  # a repeat must not hit the last run
    engine.add_request({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
    cuda_sync()
    start = time.perf_counter()
    # The whole prompt fits one step, but with async scheduling that step returns as soon
    # as it is queued on the device: the first token arrives with a later step's outputs.
    while not any(out.outputs[0].token_ids for out in engine.step()):
        pass
    first = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    end = time.perf_counter()
    return first - start, (end - first) / max(1, output_len - 1)


def run_latency_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write the JSON result."""
    llm = build_llm(args, checkpoint_path(args), max_num_seqs=min(args.max_num_seqs, 8))
    prompt = [(7 * i) % 10000 for i in range(args.input_len)]
    _one_request(llm, prompt, 16)  # warm-up
    runs = [_one_request(llm, prompt, args.output_len) for _ in range(args.repeats)]
    ttft = sorted(r[0] for r in runs)[len(runs) // 2]
    tpot = sorted(r[1] for r in runs)[len(runs) // 2]
    result = {**environment(), "input_len": args.input_len, "output_len": args.output_len,
              "repeats": args.repeats, "median_ttft_ms": ttft * 1e3,
              "median_tpot_ms": tpot * 1e3, "runs_ms": [[a * 1e3, b * 1e3] for a, b in runs],
              "cuda_graphs": not args.enforce_eager}
    print(f"batch 1: time to first token {ttft * 1e3:.2f} ms, "
          f"time per output token {tpot * 1e3:.3f} ms", flush=True)
    if args.profile_dir:
        result["profile"] = _profile_decode(llm, prompt, Path(args.profile_dir))
    write_json(Path(args.output), result)
    return result


def _profile_decode(llm, prompt: list[int], out_dir: Path) -> dict[str, Any]:
    """Profile 8 batch-1 decode steps (after the prefill step)."""
    from minivllm import SamplingParams
    from minivllm.benchmarks.profiling import profile_steps

    engine = llm.llm_engine
    engine.add_request({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    engine.step()  # prefill
    summary = profile_steps(engine, 8, out_dir, "decode_batch1")
    while engine.has_unfinished_requests():
        engine.step()
    return summary
