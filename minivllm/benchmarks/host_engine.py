"""``minivllm bench host --engine``: a decode step's host work with the real model, phase
by phase, beside the GPU's own time for the same step.

``bench host`` without ``--engine`` stubs the model out and runs on a CPU: it shows the
engine's bookkeeping alone. A GPU run pays more on the host: building and copying the
flat batch, replaying the CUDA graph, queueing the LM head and the sampler's kernels,
copying the tokens back. With async scheduling the host's whole step (schedule, queue
the step, wait for the one before, update, outputs) must stay shorter than the GPU's
step, or the GPU waits. This mode measures both sides per batch size: ``B`` requests
decode together (``--prompt-len`` prompt tokens, EOS ignored, temperature
``--temperature``), and ``--steps`` steps run with a timer on each phase and CUDA events
around each step's queued work. Where the host's busy time comes close to the GPU's
step, the host sets the pace; the GPU time then includes the waits that causes (the
events cannot tell a kernel from an idle gap between two).

White-box by design: it reaches the engine core, scheduler and model runner of an
in-process, single-rank engine (as ``bench throughput --step-timeline`` does).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import environment, make_random_checkpoint, write_json
from minivllm.benchmarks.host import accumulate_time
from minivllm.benchmarks.step_timeline import patch_attribute

# Timed phases: (label, where, method). "where" names an object found by _targets.
PHASES = (
    ("schedule", "scheduler", "schedule"),
    ("execute", "runner", "execute_model_async"),
    ("execute.prepare_inputs", "runner", "_prepare_inputs"),
    ("execute.forward", "runner", "_forward"),
    ("execute.compute_logits", "model", "compute_logits"),
    ("execute.sampler", "runner", "sampler"),
    ("process_step", "core", "_process_step"),
    ("process_step.wait", "async_output", "get_output"),
    ("process_step.update", "scheduler", "update_from_output"),
    ("outputs", "output_processor", "process_outputs"),
)
# Steps run before the timed ones: the batch settles into pure decode steps.
SETTLE_STEPS = 5


def _targets(llm: Any) -> dict[str, Any]:
    """The objects whose methods are timed (an in-process, single-rank engine)."""
    from minivllm.worker.async_utils import AsyncOutput

    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    runner = core.model_executor.model_runner
    return {
        "scheduler": core.scheduler,
        "runner": runner,
        "model": runner.model,
        "core": core,
        "async_output": AsyncOutput,  # a new handle every step: time the class's method
        "output_processor": engine.output_processor,
    }


class PhaseTimers:
    """Add up the host seconds of every phase while the ``with`` block runs, and record
    CUDA events around each step's queued work (``gpu_ms``: that work's device time)."""

    def __init__(self, llm: Any) -> None:
        self.targets = _targets(llm)
        self.use_events = self.targets["runner"].device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self.events: list[tuple[Any, Any]] = []
        self._restore: list[Callable[[], None]] = []

    def _with_events(self, inner: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            result = inner(*args, **kwargs)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((start, end))
            return result

        return wrapper

    def __enter__(self) -> PhaseTimers:
        for label, where, name in PHASES:
            obj = self.targets[where]
            wrapped = accumulate_time(getattr(obj, name), self.seconds, label)
            if label == "execute" and self.use_events:
                wrapped = self._with_events(wrapped)
            self._restore.append(patch_attribute(obj, name, wrapped))
        return self

    def __exit__(self, *exc: object) -> None:
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def gpu_ms(self) -> list[float]:
        """Each timed step's device milliseconds (empty without CUDA)."""
        if not self.events:
            return []
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in self.events]


def measure_engine_batch(
    llm: Any, batch: int, prompt_len: int, steps: int, temperature: float
) -> dict[str, Any]:
    """Per-step host milliseconds of each phase, wall time and GPU time, for ``batch``
    requests decoding together."""
    from minivllm import SamplingParams
    from minivllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    scheduler = _targets(llm)["scheduler"]
    params = SamplingParams(temperature=temperature, max_tokens=steps + 2 * SETTLE_STEPS + 4,
                            ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip
    for i in range(batch):
        prompt = [(i * 31 + j) % 5000 + 5 for j in range(prompt_len)]
        engine.add_request({"prompt_token_ids": prompt}, params)
    while any(r.num_output_tokens == 0 for r in scheduler.requests.values()):
        engine.step()  # the prefills
    for _ in range(SETTLE_STEPS):
        engine.step()
    with PhaseTimers(llm) as timers:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = time.perf_counter() - start
    gpu = sorted(timers.gpu_ms())
    engine.abort_request(list(scheduler.requests))
    while engine.has_unfinished_requests():
        engine.step()
    phases = {label: 1e3 * timers.seconds[label] / steps for label, _, _ in PHASES}
    host = phases["schedule"] + phases["execute"] + phases["process_step"] + phases["outputs"]
    return {
        "batch": batch,
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "gpu_ms_median": gpu[len(gpu) // 2] if gpu else None,
        "gpu_ms_mean": sum(gpu) / len(gpu) if gpu else None,
        # The host's own work per step: the phases above less the wait for the device.
        "host_busy_ms_per_step": host - phases["process_step.wait"],
        "phases_ms_per_step": phases,
    }


def run_engine_host_bench(args: argparse.Namespace) -> dict[str, Any]:
    """``bench host --engine``: every batch size, on the default device."""
    from minivllm import LLM
    from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT

    model = args.model or str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    max_len = args.prompt_len + args.steps + 2 * SETTLE_STEPS + 16
    llm = LLM(model, device=device, dtype="bfloat16" if device == "cuda" else "float32",
              max_model_len=max_len, max_num_seqs=max(args.batch_sizes))  # fmt: skip
    rows = [
        measure_engine_batch(llm, b, args.prompt_len, args.steps, args.temperature)
        for b in args.batch_sizes
    ]
    for r in rows:
        print(_summary_line(r), flush=True)
    result = {
        **environment(),
        "mode": "engine",
        "model": model,
        "device": device,
        "prompt_len": args.prompt_len,
        "temperature": args.temperature,
        "rows": rows,
    }
    write_json(Path(args.output), result)
    return result


def _summary_line(row: dict[str, Any]) -> str:
    p, gpu = row["phases_ms_per_step"], row["gpu_ms_median"]
    outputs = p["process_step"] - p["process_step.update"] - p["process_step.wait"]
    return (
        f"batch {row['batch']:4d}: wall {row['wall_ms_per_step']:.3f} ms/step, GPU "
        f"{'-' if gpu is None else f'{gpu:.3f}'}, host busy {row['host_busy_ms_per_step']:.3f} "
        f"(schedule {p['schedule']:.3f}, queue {p['execute']:.3f} [prepare "
        f"{p['execute.prepare_inputs']:.3f}, graph {p['execute.forward']:.3f}, LM head "
        f"{p['execute.compute_logits']:.3f}, sampler {p['execute.sampler']:.3f}], update "
        f"{p['process_step.update']:.3f}, outputs {outputs + p['outputs']:.3f})"
    )
