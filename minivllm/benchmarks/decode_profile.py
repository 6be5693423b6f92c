"""What one decode step's GPU time is made of, batch size by batch size:
``bench throughput --decode-profile B [B ...]``.

The whole-run step timeline (``--step-timeline``) says how long each step took; this says
which kernels fill a decode step at a given batch size. For each ``B`` the engine gets
``B`` requests of ``--decode-profile-context`` prompt tokens, runs their prefill and a few
decode steps unprofiled, then profiles ``DECODE_PROFILE_STEPS`` decode steps under
``torch.profiler`` (GPU activity only) and aborts the rest. Per step it reports the
kernels launched, the device time of all of them, and that time by kernel class
(``step_timeline_kernels.kernel_class``: attention, GEMM, norm, ...) and by kernel.

Read against the memory roofline, this shows what the roofline leaves out: a decode step
is also a few hundred kernels that each cost microseconds whatever the batch, and at the
batch sizes where attention moves few bytes, that fixed cost is most of the step.

Upstream counterpart: ``vllm bench latency --profile`` with the torch profiler
(``TorchProfilerWrapper`` in ``vllm/profiler/wrapper.py``) traces fixed batches too, and
leaves the trace to a viewer.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from minivllm.benchmarks.step_timeline_kernels import kernel_class, kernel_events, kernels_by_time
from minivllm.utils.math_utils import cdiv

# Decode steps profiled per batch size, and steps run before them once the prefill ends.
DECODE_PROFILE_STEPS = 16
SETTLE_STEPS = 4
TOP_KERNELS = 12


def profile_decode_batch(
    llm: Any, batch: int, context: int, temperature: float, seed: int = 0
) -> dict[str, Any]:
    """Profile ``DECODE_PROFILE_STEPS`` decode steps of ``batch`` requests whose prompts
    are ``context`` tokens; per-step kernel counts and device microseconds by class."""
    from torch.profiler import ProfilerActivity, profile

    from minivllm import SamplingParams

    engine = llm.llm_engine
    engine.reset_prefix_cache()
    rng = random.Random(seed + batch)
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    # Token ids as the throughput workload draws them, within a small model's vocabulary.
    top = min(10000, engine.vllm_config.model_config.hf_config.vocab_size - 1)
    prefill_steps = cdiv(batch * context, budget)
    params = SamplingParams(temperature=temperature, ignore_eos=True,
                            max_tokens=prefill_steps + SETTLE_STEPS + DECODE_PROFILE_STEPS + 8)
    for _ in range(batch):
        engine.add_request({"prompt_token_ids": [rng.randint(0, top) for _ in range(context)]},
                           params)  # fmt: skip
    for _ in range(prefill_steps + SETTLE_STEPS):
        engine.step()
    on_gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    sync()
    # Off the GPU there are no kernels to record (the CPU activity keeps torch content).
    with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(DECODE_PROFILE_STEPS):
            engine.step()
        sync()
    running = engine.stats.num_running_reqs
    engine.abort_request(list(engine.output_processor.request_states))
    result = summarize_steps(kernel_events(prof), DECODE_PROFILE_STEPS)
    return {"batch": batch, "running": running, "context": context, **result}


def summarize_steps(events: list, steps: int) -> dict[str, Any]:
    """Per-step figures of ``steps`` steps' kernels: count, device microseconds, those
    microseconds by class, and the costliest kernels (calls per step, microseconds per
    call and per step)."""
    classes: dict[str, float] = {}
    for e in events:
        cls = kernel_class(e.name)
        classes[cls] = classes.get(cls, 0.0) + e.duration_ns / 1e3 / steps
    top = kernels_by_time(events)[:TOP_KERNELS]
    return {
        "steps": steps,
        "kernels_per_step": len(events) / steps,
        "device_us_per_step": sum(e.duration_ns for e in events) / 1e3 / steps,
        "classes_us_per_step": dict(sorted(classes.items(), key=lambda kv: -kv[1])),
        "top_kernels": [
            {"name": name[:90], "calls_per_step": calls / steps, "us_per_call": ns / 1e3 / calls,
             "us_per_step": ns / 1e3 / steps}
            for name, calls, ns in top
        ],  # fmt: skip
    }


def run_decode_profiles(
    llm: Any, batches: list[int], context: int, temperature: float
) -> list[dict[str, Any]]:
    """:func:`profile_decode_batch` at every batch size, printed as it goes."""
    rows = []
    for batch in batches:
        row = profile_decode_batch(llm, batch, context, temperature)
        classes = ", ".join(f"{k} {v:.0f}" for k, v in row["classes_us_per_step"].items())
        print(f"decode B={batch}: {row['kernels_per_step']:.0f} kernels, "
              f"{row['device_us_per_step']:.0f} us of device time per step ({classes})",
              flush=True)  # fmt: skip
        rows.append(row)
    return rows
