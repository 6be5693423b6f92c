"""``minivllm bench host``: the engine's own per-step cost, with the model taken out.

On a GPU a decode step of a small model takes a few milliseconds, and the CPU work
around it (scheduling, building the flat batch, sampling, appending tokens, stop checks)
is not overlapped with it in minivllm. This benchmark measures that CPU work alone: the
model's forward pass and logits are replaced by stubs that return ready-made tensors,
so every remaining microsecond is engine bookkeeping. It runs anywhere, CPU included,
with the in-process runner (tensor_parallel_size 1).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import environment, write_json


def add_host_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench host``."""
    parser.add_argument("--output", default="docs/benchmarks/host.json")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)


def _stub_model(llm: Any, vocab: int) -> None:
    """Replace forward and logits with constant-time stubs (greedy picks token 3)."""
    runner = llm.llm_engine.model_runner
    hidden = runner.model_config.hf_config.hidden_size

    def forward(inputs: Any) -> torch.Tensor:
        return torch.zeros(inputs.input_ids.shape[0], hidden)

    def compute_logits(h: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(h.shape[0], vocab)
        logits[:, 3] = 1.0
        return logits

    runner._forward = forward
    runner.model.compute_logits = compute_logits


def measure_batch(llm: Any, batch: int, prompt_len: int, steps: int) -> dict[str, Any]:
    """Milliseconds per decode step for ``batch`` running requests, split by phase."""
    from minivllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        engine.add_request({"prompt_token_ids": [(i + j) % 500 + 5 for j in range(prompt_len)]},
                           params)
    while engine.stats.num_generation_tokens < batch:  # finish every prefill first
        engine.step()
    phases = {"schedule": 0.0, "execute": 0.0, "update": 0.0}
    sched, runner = engine.scheduler, engine.model_executor
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        result = runner.execute_model(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, result.sampled_token_ids)
        t3 = time.perf_counter()
        phases["schedule"] += t1 - t0
        phases["execute"] += t2 - t1
        phases["update"] += t3 - t2
    total = time.perf_counter() - start
    engine.abort_request([r for r in list(sched.requests)])
    return {"batch": batch, "steps": steps, "ms_per_step": 1e3 * total / steps,
            **{f"{k}_ms": 1e3 * v / steps for k, v in phases.items()}}


def run_host_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every batch size and write the JSON result."""
    from minivllm import LLM
    from minivllm.demo import demo_model_path

    max_len = args.prompt_len + args.steps + 8
    llm = LLM(str(demo_model_path()), device="cpu", dtype="float32",
              max_model_len=max_len, max_num_seqs=max(args.batch_sizes),
              max_num_batched_tokens=max(8192, args.prompt_len * 8))
    _stub_model(llm, llm.llm_engine.vllm_config.model_config.hf_config.vocab_size)
    rows = [measure_batch(llm, b, args.prompt_len, args.steps) for b in args.batch_sizes]
    for r in rows:
        print(f"batch {r['batch']:4d}: {r['ms_per_step']:.3f} ms/step (schedule "
              f"{r['schedule_ms']:.3f}, runner {r['execute_ms']:.3f}, update "
              f"{r['update_ms']:.3f})", flush=True)
    result = {**environment(), "note": "model forward and logits stubbed out", "rows": rows}
    write_json(Path(args.output), result)
    return result
