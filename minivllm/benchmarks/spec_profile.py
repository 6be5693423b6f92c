"""What a speculative step costs on a GPU, against a plain one, measured by the profiler.

Run as ``python -m minivllm.benchmarks.spec_profile --model TARGET --draft-model DRAFT``
(no ``minivllm bench`` subcommand: like ``spec_host``, a profiler for the speculative
path, not a figure of merit). Batch 1, greedy, async scheduling on. Three settings in
one process, side by side:

* ``off``: no speculation;
* ``draft``: the draft model, its whole proposal replayed as one CUDA graph in a step
  where every request verifies ``k`` drafts (``spec_decode/draft_graph.py``);
* ``draft_eager_proposal``: the same with ``MINIVLLM_DRAFT_PROPOSAL_GRAPHS=0``: each of the
  draft's passes replays its own graph, the work around them runs op by op.

For each: the time per output token and the drafts' acceptance over the prompts (as
``bench spec`` measures them), then ``torch.profiler`` over ``--profile-steps`` decode
steps of one request, reduced to per-step figures: wall time, GPU time (kernels and
copies), and what the host issued: kernel launches, CUDA-graph launches, asynchronous
copies, and the tensor operations that dispatched them. The profiler slows the host, so
its wall time is above the unprofiled one; the counts are exact.

The prompts are held-out continuations of a ``demo.train`` data file (``--prompt-file``,
as ``bench spec --prompt-file``), or ``bench spec``'s repetitive prompts without one.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import environment, free_device_memory, write_json
from minivllm.benchmarks.spec_decode_measure import measure_batch1
from minivllm.benchmarks.workloads import heldout_prompts, repetitive_prompts
from minivllm.spec_decode.draft_graph import PROPOSAL_GRAPHS_ENV

# Host calls that start work on the GPU, as the CUDA runtime and driver name them.
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
GRAPH_LAUNCHES = ("cudaGraphLaunch",)
COPIES = ("cudaMemcpyAsync",)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minivllm.benchmarks.spec_profile")
    p.add_argument("--model", required=True, help="the target")
    p.add_argument("--draft-model", required=True)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    p.add_argument("--prompt-file", default=None, help="demo.train data file (held-out)")
    p.add_argument("--prompt-val-every", type=int, default=50)
    p.add_argument("--prompt-tokens", type=int, default=100)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--profile-steps", type=int, default=30)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--output", default="bench-results/spec_profile.json")
    return p


def _check_args(args: argparse.Namespace) -> None:
    for name in ("k", "num_prompts", "output_len", "profile_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.prompt_file is not None and not Path(args.prompt_file).is_file():
        raise FileNotFoundError(f"--prompt-file {args.prompt_file!r} is not a file")
    if args.output_len <= args.profile_steps + 20:
        raise ValueError(
            "--output-len must exceed --profile-steps + 20 (profiled steps are decode steps)"
        )


def _prompts(llm: Any, args: argparse.Namespace) -> tuple[list[list[int]], dict[str, Any]]:
    tokenizer = llm.llm_engine.tokenizer
    if args.prompt_file is None:
        vocab = llm.llm_engine.vllm_config.model_config.hf_config.vocab_size
        return repetitive_prompts(tokenizer, args.num_prompts, vocab), {"kind": "repetitive"}
    held = heldout_prompts(
        tokenizer, args.prompt_file, args.num_prompts, args.prompt_val_every, args.prompt_tokens
    )
    prompts = held.pop("prompts")
    return prompts, {"kind": "heldout_continuation", **held}


def profile_steps(llm: Any, prompt: list[int], steps: int, output_len: int) -> dict[str, float]:
    """Per-step figures of ``steps`` decode steps of one greedy request, profiled."""
    from torch.profiler import ProfilerActivity, profile

    from minivllm import SamplingParams

    engine = llm.llm_engine
    engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    engine.add_request({"prompt_token_ids": prompt}, params)
    for _ in range(10):  # past the prefill and the first verifications
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        engine.step()
    return _per_step(prof.events(), steps)


def _per_step(events: Any, steps: int) -> dict[str, float]:
    """Reduce the profiler's events to per-step means."""
    counts = {"kernel_launches": 0, "graph_launches": 0, "copies": 0, "tensor_ops": 0}
    gpu_us, start, end = 0.0, float("inf"), 0.0
    for e in events:
        if e.device_type.name == "CUDA":  # a kernel or a copy on the GPU
            gpu_us += e.time_range.elapsed_us()
            continue
        start, end = min(start, e.time_range.start), max(end, e.time_range.end)
        if e.name in KERNEL_LAUNCHES:
            counts["kernel_launches"] += 1
        elif e.name in GRAPH_LAUNCHES:
            counts["graph_launches"] += 1
        elif e.name in COPIES:
            counts["copies"] += 1
        elif e.name.startswith("aten::") and e.cpu_parent is None:
            counts["tensor_ops"] += 1  # top level: what the Python code called
    out = {name: n / steps for name, n in counts.items()}
    out["wall_us"] = (end - start) / steps
    out["gpu_us"] = gpu_us / steps
    return out


def run_setting(args: argparse.Namespace, spec: dict[str, Any] | None, graphs: bool) -> dict:
    """One engine: the batch-1 figures over the prompts, then the profiled steps."""
    from minivllm import LLM

    os.environ[PROPOSAL_GRAPHS_ENV] = "1" if graphs else "0"
    llm = LLM(
        model=args.model,
        speculative_config=spec,
        async_scheduling=True,
        max_model_len=args.max_model_len,
        max_num_seqs=8,
        seed=0,
    )
    try:
        prompts, workload = _prompts(llm, args)
        batch1 = measure_batch1(llm, prompts, args.output_len)["entry"]
        batch1["profile"] = profile_steps(llm, prompts[0], args.profile_steps, args.output_len)
        batch1["step_ms"] = batch1["tpot_ms"] * batch1["tokens_per_step"]
    finally:
        llm.shutdown()
        del llm
        free_device_memory()
    return {"batch1": batch1, "workload": workload}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_arg_parser().parse_args(argv)
    _check_args(args)
    if not torch.cuda.is_available():
        raise SystemExit("spec_profile profiles a GPU: no CUDA device here")
    spec = {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": args.k}
    result: dict[str, Any] = {**environment(), "model": args.model, "draft_model": args.draft_model}
    result.update(k=args.k, output_len=args.output_len, profile_steps=args.profile_steps)
    result["settings"] = {}
    previous = os.environ.get(PROPOSAL_GRAPHS_ENV)
    try:
        for name, s, graphs in (
            ("off", None, True),
            ("draft", spec, True),
            ("draft_eager_proposal", spec, False),
        ):
            entry = run_setting(args, s, graphs)
            result["workload"] = entry.pop("workload")
            result["settings"][name] = entry["batch1"]
            _print(name, entry["batch1"])
            write_json(Path(args.output), result)  # after each: a cut-off run keeps some
    finally:
        if previous is None:
            os.environ.pop(PROPOSAL_GRAPHS_ENV, None)
        else:
            os.environ[PROPOSAL_GRAPHS_ENV] = previous
    off = result["settings"]["off"]["tpot_ms"]
    for entry in result["settings"].values():
        entry["speedup_tpot"] = off / entry["tpot_ms"]
    write_json(Path(args.output), result)
    return result


def _print(name: str, e: dict[str, Any]) -> None:
    p = e["profile"]
    print(
        f"{name}: {e['tpot_ms']:.3f} ms/token, {e['tokens_per_step']:.2f} tokens/step, "
        f"{e['step_ms']:.2f} ms/step | profiled: wall {p['wall_us']:.0f} us/step, GPU "
        f"{p['gpu_us']:.0f} us/step, {p['kernel_launches']:.0f} kernel launches, "
        f"{p['graph_launches']:.0f} graph launches, {p['copies']:.0f} copies, "
        f"{p['tensor_ops']:.0f} tensor ops per step",
        flush=True,
    )


if __name__ == "__main__":
    main()
