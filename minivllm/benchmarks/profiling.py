"""See where a step's time goes: a torch profiler trace of a few engine steps.

Upstream counterpart: vLLM's ``LLM.start_profile`` / ``stop_profile`` with
``VLLM_TORCH_PROFILER_DIR`` (``vllm/profiler/``). Here one function wraps
``torch.profiler`` around a few ``LLMEngine.step()`` calls and writes two things: a
Chrome trace (open it in ``chrome://tracing`` or https://ui.perfetto.dev) and a table of
the operators and kernels that took the most time, as JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch


def profile_steps(engine: Any, num_steps: int, out_dir: Path, name: str) -> dict[str, Any]:
    """Profile the next ``num_steps`` steps of ``engine`` (requests must be queued).

    Returns the summary that is also written to ``out_dir/<name>_profile.json``.
    """
    from torch.profiler import ProfilerActivity, profile

    out_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    steps = 0
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(num_steps):
            if not engine.has_unfinished_requests():
                break
            engine.step()
            steps += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    prof.export_chrome_trace(str(out_dir / f"{name}_trace.json"))
    device_key = "device_time_total" if torch.cuda.is_available() else "cpu_time_total"
    rows = []
    busy_us = 0.0
    for evt in prof.key_averages():
        rows.append({
            "name": evt.key[:120],
            "calls": evt.count,
            "cpu_time_total_us": evt.cpu_time_total,
            "device_time_total_us": getattr(evt, device_key, 0.0),
        })
        # Kernels and copies carry self device time; the operators that launch them
        # only inherit it, so summing self time counts each kernel once.
        busy_us += getattr(evt, "self_device_time_total", 0.0)
    rows.sort(key=lambda r: r["device_time_total_us"], reverse=True)
    summary = {
        "num_steps": steps,
        # Wall time includes the profiler's own overhead on the host.
        "wall_ms_per_step": 1e3 * wall / max(steps, 1),
        "device_busy_ms_per_step": busy_us / 1e3 / max(steps, 1),
        "top": rows[:25],
    }
    (out_dir / f"{name}_profile.json").write_text(json.dumps(summary, indent=2))
    return summary
