"""Where the host time of a speculative step goes: per-phase microseconds per step.

Run as ``python -m minivllm.benchmarks.spec_host`` (no ``minivllm bench`` subcommand: it
is a profiler for the speculative path, not a figure of merit). It steps the engine
through greedy batch-1 requests, on the demo model with the demo draft by default,
once per setting (speculation off with async scheduling on and off, n-gram, the draft
model) and times the engine's phases by wrapping the methods that make them up:

* ``schedule``: ``Scheduler.schedule``;
* ``prepare_inputs``: the flat batch, its host-to-device copies and, with drafts, the
  ``SpecDecodeMetadata``;
* ``forward``: the target's forward pass and its logits (model compute; on a GPU a
  CUDA-graph replay), reported apart from the host work around it;
* ``sample`` / ``verify``: the sampler, or the rejection sampler with its sampling
  metadata and the host copy of the accepted counts;
* ``draft_*``: the draft model's proposal (its plan, its host-to-device copies, its
  forward passes (model compute, as above) and the rest: gathers, argmaxes, the stack
  and the drafts' host copy);
* ``get_output``: waiting for the step's tokens and turning them into Python ints;
* ``update``: ``Scheduler.update_from_output``;
* ``ngram``: the n-gram proposer;
* ``core_other`` / ``frontend``: the rest of ``EngineCore.step``, and of
  ``LLMEngine.step`` around it (output processing).

Only steps after each request's first token count (decode or verification steps), as
``bench spec``'s time per output token. On the CPU a model's forward pass is eager
PyTorch; the host phases are what the same code costs on any machine, minus the CUDA
launch and synchronization costs a GPU adds to each operation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minivllm.benchmarks.common import (
    cuda_sync,
    environment,
    free_device_memory,
    make_random_checkpoint,
    write_json,
)
from minivllm.benchmarks.workloads import repetitive_prompts
from minivllm.demo import DEMO_DRAFT_DIR as DEMO_DRAFT  # noqa: E402
from minivllm.demo import DEMO_MODEL_DIR as DEMO_MODEL  # noqa: E402

# The n-gram settings' target: a tiny random-weight Qwen3 (its greedy output soon loops,
# so n-gram drafts are proposed and accepted most steps, as on the Qwen3-0.6B shape with
# random weights on the GPU), with next to no compute.
TINY_QWEN3_SHAPE: dict[str, Any] = dict(
    vocab_size=4096,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=1,
)

# Reported phases; the model's compute is reported apart from the host's work.
HOST_PHASES = (
    "schedule",
    "prepare_inputs",
    "sample",
    "verify",
    "draft_plan",
    "draft_copies",
    "draft_other",
    "get_output",
    "update",
    "ngram",
    "core_other",
    "frontend",
)
COMPUTE_PHASES = ("forward", "draft_forward")

# The main thread's CPU time: on a shared machine other processes' load does not count
# (wall time when --clock wall, e.g. on a GPU, where waiting for the device matters).
_clock = time.thread_time


def _wrap(obj: Any, name: str, totals: dict[str, float], key: str, stack: list[str]) -> None:
    """Time ``obj.name`` into ``totals[key]``, exclusive of any wrapped call inside it."""
    inner = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stack.append(key)
        t0 = _clock()
        try:
            return inner(*args, **kwargs)
        finally:
            dt = _clock() - t0
            stack.pop()
            totals[key] += dt
            if stack:  # the caller's phase excludes this one
                totals[stack[-1]] -= dt

    setattr(obj, name, wrapper)


def instrument(llm: Any) -> tuple[dict[str, float], list[str]]:
    """Wrap the engine's phases of ``llm`` (tensor_parallel_size 1); returns the totals
    in seconds, keyed by phase, which every later step adds to, and the stack of phases
    running now."""
    import minivllm.spec_decode.draft_model as draft_module
    import minivllm.worker.model_runner as runner_module

    totals: dict[str, float] = defaultdict(float)
    stack: list[str] = []
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    runner = core.model_executor.model_runner
    _wrap(engine, "step", totals, "frontend", stack)
    _wrap(core, "step", totals, "core_other", stack)
    _wrap(core.scheduler, "schedule", totals, "schedule", stack)
    _wrap(core.scheduler, "update_from_output", totals, "update", stack)
    _wrap(runner, "_prepare_inputs", totals, "prepare_inputs", stack)
    _wrap(runner, "_forward", totals, "forward", stack)
    _wrap(runner.model, "compute_logits", totals, "forward", stack)
    _wrap(runner, "sampler", totals, "sample", stack)
    _wrap(runner, "_verify_drafts", totals, "verify", stack)
    if core.spec_decode is not None and core.spec_decode.ngram is not None:
        _wrap(core.spec_decode.ngram, "propose_one", totals, "ngram", stack)
    drafter = runner.drafter
    if drafter is not None:
        _wrap(runner, "_propose_draft_tokens", totals, "draft_other", stack)
        _wrap(drafter, "_plan", totals, "draft_plan", stack)
        _wrap(drafter, "_run", totals, "draft_forward", stack)
        _wrap(drafter.model, "compute_logits", totals, "draft_forward", stack)
        # The module-level helper as draft_model.py sees it (its own import).
        for helper in ("copy_to_device", "copy_arrays_to_device"):  # before/after d502336
            if hasattr(draft_module, helper):
                _wrap(draft_module, helper, totals, "draft_copies", stack)
    original_get = runner_module.AsyncOutput.get_output

    def get_output(handle: Any) -> Any:
        stack.append("get_output")
        t0 = _clock()
        try:
            return original_get(handle)
        finally:
            dt = _clock() - t0
            stack.pop()
            totals["get_output"] += dt
            if stack:
                totals[stack[-1]] -= dt

    runner_module.AsyncOutput.get_output = get_output  # type: ignore[method-assign]
    return totals, stack


class _OpCounter(TorchDispatchMode):
    """Counts the tensor operations (views excluded) each phase dispatches: on a GPU
    every one is a kernel launch, or a copy, that the host pays for."""

    def __init__(self, stack: list[str], counts: dict[str, float]) -> None:
        super().__init__()
        self.stack = stack
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ not in _VIEW_OPS:
            self.counts[self.stack[-1] if self.stack else "outside"] += 1
        return func(*args, **(kwargs or {}))


_VIEW_OPS = frozenset(
    [
        "view",
        "_unsafe_view",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "expand",
        "as_strided",
        "t",
        "transpose",
        "alias",
        "detach",
        "permute",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "_reshape_alias",
        "lift_fresh",
        "reshape",
        "view_as",
        "unfold",
        "diagonal",
        "narrow",
    ]
)


def _run_request(llm: Any, prompt: list[int], output_len: int, totals: dict[str, float]) -> int:
    """One greedy request; ``totals`` counts only the steps after its first token.
    Returns those steps."""
    from minivllm import SamplingParams

    engine = llm.llm_engine
    engine.reset_prefix_cache()
    engine.add_request(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True),
    )
    outputs: list = []
    while engine.has_unfinished_requests() and not any(o.outputs[0].token_ids for o in outputs):
        outputs = engine.step() or outputs
    cuda_sync()
    totals.clear()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    cuda_sync()
    return steps


def profile_setting(
    model: str, spec: dict[str, Any] | None, async_scheduling: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """Microseconds per step of each phase (median over the timed requests)."""
    from minivllm import LLM

    llm = LLM(
        model=model,
        speculative_config=spec,
        async_scheduling=async_scheduling,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        seed=0,
    )
    try:
        totals, stack = instrument(llm)
        tokenizer = llm.llm_engine.tokenizer
        vocab = llm.llm_engine.vllm_config.model_config.hf_config.vocab_size
        prompts = repetitive_prompts(tokenizer, args.num_prompts, vocab)
        _run_request(llm, prompts[0], args.output_len, totals)  # warm-up
        per_request: list[dict[str, float]] = []
        tokens_per_step = []
        for _ in range(args.repeats):
            for prompt in prompts:
                steps = _run_request(llm, prompt, args.output_len, totals)
                per_request.append({k: v / steps * 1e6 for k, v in totals.items()})
                tokens_per_step.append((args.output_len - 1) / steps)
        counts: dict[str, float] = defaultdict(float)
        with _OpCounter(stack, counts):
            steps = _run_request(llm, prompts[0], args.output_len, counts)
        ops = {k: round(counts.get(k, 0.0) / steps, 1) for k in (*HOST_PHASES, *COMPUTE_PHASES)}
    finally:
        llm.shutdown()
        del llm
        free_device_memory()  # else the next setting's pool finds the GPU full
    phases = {
        k: round(statistics.median(r.get(k, 0.0) for r in per_request), 1)
        for k in (*HOST_PHASES, *COMPUTE_PHASES)
    }
    host = round(sum(phases[k] for k in HOST_PHASES), 1)
    compute = round(sum(phases[k] for k in COMPUTE_PHASES), 1)
    return {
        "us_per_step": phases,
        "host_us_per_step": host,
        "compute_us_per_step": compute,
        "ops_per_step": ops,
        "host_ops_per_step": round(sum(ops[k] for k in HOST_PHASES), 1),
        "tokens_per_step": round(statistics.median(tokens_per_step), 3),
        "host_us_per_token": round(host / statistics.median(tokens_per_step), 1),
        # With --clock wall: the time per output token (TPOT) of these steps.
        "us_per_token": round((host + compute) / statistics.median(tokens_per_step), 1),
    }


Setting = tuple[str, str, dict[str, Any] | None, bool]


def settings(args: argparse.Namespace, tiny: str) -> list[Setting]:
    """(name, model, speculative_config, async_scheduling) of every profiled setting:
    off and n-gram on the tiny model, off and the draft model on ``--model``."""
    out: list[Setting] = [
        ("tiny_off_async", tiny, None, True),
        ("tiny_off_sync", tiny, None, False),
    ]
    for k in args.ks:
        spec = {"method": "ngram", "num_speculative_tokens": k}
        out.append((f"tiny_ngram_k{k}", tiny, spec, False))
    if args.draft_model:
        out += [("off_async", args.model, None, True), ("off_sync", args.model, None, False)]
        for k in args.ks:
            spec = {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": k}
            out.append((f"draft_k{k}", args.model, spec, False))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Profile every setting and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default=str(DEMO_MODEL))
    parser.add_argument("--draft-model", default=str(DEMO_DRAFT), help="'' for none")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--output", default="bench-results/spec_host.json")
    args = parser.parse_args(argv)
    global _clock
    _clock = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "environment": environment(),
        "tiny_model_shape": TINY_QWEN3_SHAPE,
        "draft_model": args.draft_model or None,
        "workload": {
            "num_prompts": args.num_prompts,
            "repeats": args.repeats,
            "output_len": args.output_len,
            "batch_size": 1,
        },
        "clock": "main thread CPU time" if args.clock == "thread" else "wall time",
        "settings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tiny = str(make_random_checkpoint(Path(tmp) / "tiny_qwen3", TINY_QWEN3_SHAPE))
        for name, model, spec, async_scheduling in settings(args, tiny):
            entry = profile_setting(model, spec, async_scheduling, args)
            entry["model"] = "tiny random Qwen3" if model == tiny else model
            result["settings"][name] = entry
            _print(name, entry)
            write_json(Path(args.output), result)  # after each: a cut-off run keeps some
    return result


def _print(name: str, entry: dict[str, Any]) -> None:
    phases = " ".join(f"{k}={v:.0f}" for k, v in entry["us_per_step"].items() if v)
    ops = " ".join(f"{k}={v:.0f}" for k, v in entry["ops_per_step"].items() if v)
    print(
        f"{name}: host {entry['host_us_per_step']:.0f} us/step, "
        f"{entry['host_us_per_token']:.0f} us/token at {entry['tokens_per_step']:.2f} "
        f"tokens/step, {entry['host_ops_per_step']:.0f} tensor ops/step; compute "
        f"{entry['compute_us_per_step']:.0f} us/step | {phases} | ops: {ops}",
        flush=True,
    )


if __name__ == "__main__":
    main()
