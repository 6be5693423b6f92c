"""``minivllm bench host``: the engine's own per-step cost, with the model taken out.

On a GPU a decode step of a small model takes a few milliseconds, and so does the CPU
work around it (scheduling, building the flat batch, queueing the sampler, appending
tokens, stop checks). Async scheduling hides that work behind the GPU's only while it
is shorter than the GPU's step. This benchmark measures that CPU work alone: the model's
forward pass and logits are replaced by stubs that return ready-made tensors, so every
remaining microsecond is engine bookkeeping. It runs anywhere, CPU included, with the
in-process runner (tensor_parallel_size 1).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import environment, write_json


def add_host_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench host``."""
    parser.add_argument("--output", default="bench-results/host.json")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prepare-batch", type=int, default=256,
                        help="requests per step of the prepare_inputs measurement")
    parser.add_argument("--prepare-blocks", type=int, nargs="*", default=[16, 70, 128],
                        help="blocks per request of the prepare_inputs measurement (none: skip)")
    parser.add_argument("--engine", action="store_true",
                        help="time the real engine's decode steps on the default device (a "
                             "GPU), phase by phase, against each step's GPU time")
    parser.add_argument("--model", default=None,
                        help="with --engine: checkpoint folder (default: the throughput "
                             "benchmark's random-weight Qwen3-0.6B shape)")
    parser.add_argument("--temperature", type=float, default=0.6,
                        help="with --engine: sampling temperature of the decoding requests")


def _stub_model(llm: Any, vocab: int) -> None:
    """Replace forward and logits with stubs that slice ready-made tensors (greedy then
    picks token 3), so the model costs next to nothing."""
    llm.collective_rpc(_install_model_stubs, args=(vocab,))


def _install_model_stubs(runner: Any, vocab: int) -> None:
    """Run on the in-process model runner (through ``collective_rpc``)."""
    hidden = torch.zeros(runner.scheduler_config.max_num_batched_tokens,
                         runner.model_config.hf_config.hidden_size)
    logits = torch.zeros(runner.scheduler_config.max_num_seqs, vocab)
    logits[:, 3] = 1.0

    def forward(inputs: Any) -> torch.Tensor:
        return hidden[: inputs.input_ids.shape[0]]

    def compute_logits(h: torch.Tensor) -> torch.Tensor:
        return logits[: h.shape[0]]

    runner._forward = forward
    runner.model.compute_logits = compute_logits


def accumulate_time(inner: Callable, totals: dict[str, float], key: str) -> Callable:
    """``inner``, wrapped so that the seconds spent in it add up in ``totals[key]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


def time_calls(obj: Any, name: str, totals: dict[str, float], key: str) -> None:
    """Wrap ``obj.name`` (an instance attribute, which ``del`` removes again) so the
    seconds spent in it add up in ``totals[key]``."""
    setattr(obj, name, accumulate_time(getattr(obj, name), totals, key))


def measure_batch(llm: Any, batch: int, prompt_len: int, steps: int) -> dict[str, Any]:
    """Milliseconds per decode step (``LLMEngine.step``) for ``batch`` running requests.

    The phases: ``schedule``, ``execute`` (building the batch and queueing the stubbed
    model and the sampler), ``update`` (appending tokens, stop checks, freeing) and
    ``other`` (the engine's own output processing and bookkeeping).
    """
    from minivllm import SamplingParams
    from minivllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    # FINAL_ONLY, as LLM.generate sends: a stream (DELTA/CUMULATIVE) adds detokenizing
    # every request every step, which the server's front end does in its own process.
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i in range(batch):
        engine.add_request({"prompt_token_ids": [(i + j) % 500 + 5 for j in range(prompt_len)]},
                           params)
    while engine.stats.num_generation_tokens < batch:  # finish every prefill first
        engine.step()
    phases = {"schedule": 0.0, "execute": 0.0, "update": 0.0}
    core = engine.engine_core.engine_core  # white-box: the EngineCore the engine steps
    sched = core.scheduler
    time_calls(sched, "schedule", phases, "schedule")
    time_calls(core.model_executor, "execute_model_async", phases, "execute")
    time_calls(sched, "update_from_output", phases, "update")
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    for name in ("schedule", "update_from_output"):
        del sched.__dict__[name]
    del core.model_executor.__dict__["execute_model_async"]
    engine.abort_request(list(sched.requests))
    phases["other"] = total - sum(phases.values())
    return {"batch": batch, "steps": steps, "ms_per_step": 1e3 * total / steps,
            **{f"{k}_ms": 1e3 * v / steps for k, v in phases.items()}}


def run_host_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every batch size and write the JSON result."""
    from minivllm import LLM
    from minivllm.demo import demo_model_path

    for name in ("steps", "prepare_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.prepare_blocks):
        raise ValueError(f"--prepare-blocks must all be >= 1, got {args.prepare_blocks}")
    if any(b < 1 for b in args.batch_sizes):
        raise ValueError(f"--batch-sizes must all be >= 1, got {args.batch_sizes}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if args.engine:
        from minivllm.benchmarks.host_engine import run_engine_host_bench

        return run_engine_host_bench(args)

    max_len = args.prompt_len + args.steps + 8
    llm = LLM(str(demo_model_path()), device="cpu", dtype="float32",
              max_model_len=max_len, max_num_seqs=max(args.batch_sizes),
              max_num_batched_tokens=max(8192, args.prompt_len * 8))
    _stub_model(llm, llm.llm_engine.vllm_config.model_config.hf_config.vocab_size)
    rows = [measure_batch(llm, b, args.prompt_len, args.steps) for b in args.batch_sizes]
    for r in rows:
        print(f"batch {r['batch']:4d}: {r['ms_per_step']:.3f} ms/step (schedule "
              f"{r['schedule_ms']:.3f}, runner {r['execute_ms']:.3f}, update "
              f"{r['update_ms']:.3f}, other {r['other_ms']:.3f})", flush=True)
    from minivllm.benchmarks.host_prepare import measure_prepare_inputs

    prepare = [measure_prepare_inputs(args.prepare_batch, b, args.steps)
               for b in args.prepare_blocks]  # fmt: skip
    for r in prepare:
        print(f"prepare_inputs, {r['batch']} requests x {r['blocks_per_request']} blocks: "
              f"{r['persistent_median_us']:.0f} us with the kept block table, "
              f"{r['rebuilt_median_us']:.0f} us rebuilt (medians)", flush=True)
    result = {**environment(), "note": "model forward and logits stubbed out", "rows": rows,
              "prepare_inputs": prepare}
    write_json(Path(args.output), result)
    return result
