"""``minivllm bench sampler``: the sampler alone at the throughput workload's shape, the
general path against the one-pass Gumbel kernel, side by side in one process.

Three sides sample the same ``[rows, vocab]`` logits (Qwen3's 151,936 tokens, 256 rows
by default): ``greedy`` (the all-greedy fast path, one ``max``: the floor), ``general``
(temperature through the float32 pipeline and the exponential race,
``Sampler(use_gumbel_kernel=False)``) and ``gumbel`` (the one-pass kernel). Each side is
timed as a loop of calls between two device synchronizations, in alternating rounds so a
drift of the clocks shows as spread, not as a ratio. The metadata is built once, outside
the timing (it is the same host work for both paths).

``host`` (``sampler_host.py``) records the host's share: the metadata built and reused,
and the sampler's own host time with per-row keys and with one batch key.

``--sweep`` also times the kernel alone (device time, L2 flushed, triton's ``do_bench``)
under several tilings, and checks they all return the same tokens.

The run also checks the kernel on the device it measured: greedy rows equal ``argmax``
exactly, and a chi-square test of many draws of one small row against
``softmax(x / T)``, with the same test at a wrong temperature as its control.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import (
    default_output,
    environment,
    measure_copy_bandwidth,
    write_json,
)
from minivllm.benchmarks.sampler_host import make_requests, sampler_host_costs
from minivllm.request import Request
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.utils.math_utils import cdiv, next_power_of_2

# A small row with well separated probabilities, for the on-device chi-square check.
CHECK_LOGITS = (2.0, 1.6, 1.1, 0.9, 0.3, -0.2, -0.9, -1.5)
CHECK_TEMPERATURE, WRONG_TEMPERATURE = 0.7, 0.8
# --sweep: (4-column groups per block, blocks per program, warps).
SWEEP = ((512, 4, 8), (512, 2, 8), (512, 8, 8), (256, 4, 4), (256, 8, 4), (1024, 2, 8),
         (1024, 4, 16), (512, 4, 4))  # fmt: skip


def add_sampler_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench sampler`` on ``parser``."""
    parser.add_argument("--output", default=default_output("sampler.json"))
    parser.add_argument("--num-rows", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--iters", type=int, default=100, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    parser.add_argument("--check-draws", type=int, default=65536,
                        help="draws of the on-device chi-square check")  # fmt: skip
    parser.add_argument("--sweep", action="store_true",
                        help="also time the kernel alone under several tilings")  # fmt: skip
    parser.add_argument("--host-calls", type=int, default=200,
                        help="calls per host-time figure (sampler_host.py); 0: skip")  # fmt: skip


def _metadata(n: int, temperature: float, device: torch.device, vocab: int):
    return SamplingMetadata.from_requests(make_requests(n, temperature), device, {}, vocab)


def _time_side(sampler: Sampler, logits: torch.Tensor, md, iters: int) -> float:
    """Microseconds per call of ``sampler`` (host and device), over ``iters`` calls."""
    if logits.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        sampler(logits, md)
    if logits.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def sweep_tilings(logits: torch.Tensor, temperature: float) -> dict[str, Any]:
    """The kernel alone under each ``SWEEP`` tiling: microseconds per call (device time
    on a GPU) and whether every tiling returned the default's tokens."""
    import triton
    import triton.testing

    from minivllm.sample.gumbel import GumbelLaunchConfig, gumbel_launch_config, gumbel_sample

    rows, vocab = logits.shape
    device = logits.device
    temps = torch.full((rows,), temperature, device=device)
    keys = torch.arange(rows, dtype=torch.int64, device=device) * 7919 + 1
    positions = torch.full((rows,), 100, dtype=torch.int64, device=device)
    default = gumbel_launch_config(vocab, interpreted=device.type != "cuda")
    reference = gumbel_sample(logits, temps, keys, positions, default)[0]
    results, same = [], True
    # A small vocabulary (the CPU smoke test) caps the blocks at its own width.
    widest = max(1, next_power_of_2(vocab) // 4)
    capped = ((min(g, widest), b, w) for g, b, w in SWEEP)
    tilings = dict.fromkeys((g, min(b, cdiv(vocab, 4 * g)), w) for g, b, w in capped)
    for groups, blocks, warps in tilings:
        split = 4 * groups * blocks
        cfg = GumbelLaunchConfig(groups, split, cdiv(vocab, split), 1, warps)
        fn = functools.partial(gumbel_sample, logits, temps, keys, positions, cfg)
        start = time.perf_counter()
        same &= bool(torch.equal(fn()[0], reference))
        us = (time.perf_counter() - start) * 1e6  # the interpreter: one call is enough
        if logits.is_cuda:
            us = float(triton.testing.do_bench(fn, return_mode="median")) * 1e3
        results.append({"groups": groups, "blocks_per_program": blocks, "num_warps": warps,
                        "default": cfg == default, "us_per_call": us})  # fmt: skip
    return {"tilings": results, "same_tokens_every_tiling": same}


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value (every expected count here is large)."""
    expected = probs.double() * counts.sum()
    stat = ((counts.double() - expected) ** 2 / expected).sum()
    dof = torch.tensor((probs.numel() - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2.0))


def device_checks(device: torch.device, vocab: int, draws: int, gen: torch.Generator):
    """Greedy rows exact, and the draws' distribution, measured with the kernel."""
    sampler = Sampler(gen, use_gumbel_kernel=True)
    logits = (torch.randn(64, vocab, device=device, generator=gen) * 3).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9) for i in range(64)]
    requests = [Request(str(i), [1], p) for i, p in enumerate(params)]
    md = SamplingMetadata.from_requests(requests, device, {}, vocab)
    tokens = sampler(logits, md).sampled_token_ids
    greedy_equal = bool(torch.equal(tokens[1::2], logits.argmax(-1)[1::2]))
    row = torch.tensor(CHECK_LOGITS, device=device)
    target = (row.double() / CHECK_TEMPERATURE).softmax(-1).cpu()
    pvalues = {}
    for name, t in (("right", CHECK_TEMPERATURE), ("wrong", WRONG_TEMPERATURE)):
        md = _metadata(draws, t, device, row.numel())
        drawn = sampler(row.expand(draws, -1), md).sampled_token_ids
        counts = torch.bincount(drawn, minlength=row.numel()).cpu()
        pvalues[name] = _chi_square_pvalue(counts, target)
    return {"greedy_rows_equal_argmax": greedy_equal, "chi_square_draws": draws,
            "chi_square_pvalue": pvalues["right"], "chi_square_temperature": CHECK_TEMPERATURE,
            "chi_square_pvalue_wrong_temperature": pvalues["wrong"],
            "wrong_temperature": WRONG_TEMPERATURE}  # fmt: skip


def run_sampler_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write the JSON result."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    rows, vocab = args.num_rows, args.vocab_size
    logits = (torch.randn(rows, vocab, device=device, generator=gen) * 3).to(dtype)
    sampled_md = _metadata(rows, args.temperature, device, vocab)
    sides = {
        "greedy": (Sampler(gen), _metadata(rows, 0.0, device, vocab)),
        "general": (Sampler(gen, use_gumbel_kernel=False), sampled_md),
        "gumbel": (Sampler(gen, use_gumbel_kernel=True), sampled_md),
    }
    for sampler, md in sides.values():  # compile and warm the allocator
        _time_side(sampler, logits, md, 2)
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (sampler, md) in sides.items():
            runs[name].append(_time_side(sampler, logits, md, args.iters))
    us = {name: statistics.median(v) for name, v in runs.items()}
    bandwidth = measure_copy_bandwidth()
    read_us = logits.numel() * logits.element_size() / bandwidth * 1e6
    result: dict[str, Any] = {
        **environment(),
        "shape": {"rows": rows, "vocab_size": vocab, "dtype": args.dtype},
        "temperature": args.temperature,
        "iters": args.iters,
        "us_per_call": us,
        "runs_us_per_call": runs,
        "general_over_gumbel": us["general"] / us["gumbel"],
        "copy_bandwidth_bytes_per_s": bandwidth,
        "logits_read_us_at_copy_bandwidth": read_us,
    }
    print(f"sampler at [{rows}, {vocab}] {args.dtype}, T={args.temperature}: greedy "
          f"{us['greedy']:.0f} us, general {us['general']:.0f} us, one-pass kernel "
          f"{us['gumbel']:.0f} us per call (x{result['general_over_gumbel']:.2f}); one read "
          f"of the logits at copy bandwidth: {read_us:.0f} us", flush=True)  # fmt: skip
    if args.host_calls > 0:
        host = result["host"] = sampler_host_costs(logits, args.temperature, gen, args.host_calls)
        print(f"host us per step: metadata built {host['metadata_build_us']:.0f} (greedy "
              f"{host['metadata_build_greedy_us']:.0f}), reused {host['metadata_reused_us']:.0f}; "
              f"sampler with per-row keys {host['sample_row_keys_us']:.0f}, with a batch key "
              f"{host['sample_batch_key_us']:.0f}", flush=True)  # fmt: skip
    write_json(Path(args.output), result)  # the timings survive a cut in the checks
    result["checks"] = device_checks(device, vocab, args.check_draws, gen)
    if args.sweep:
        result["sweep"] = sweep_tilings(logits, args.temperature)
        for t in result["sweep"]["tilings"]:
            print(f"  tiling groups={t['groups']} blocks={t['blocks_per_program']} "
                  f"warps={t['num_warps']}{' (default)' if t['default'] else ''}: "
                  f"{t['us_per_call']:.1f} us", flush=True)  # fmt: skip
        print(f"  same tokens under every tiling: {result['sweep']['same_tokens_every_tiling']}")
    print(f"checks: {result['checks']}", flush=True)
    write_json(Path(args.output), result)
    return result
