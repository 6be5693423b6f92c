"""A torch profiler trace of what one rank ran, between ``LLM.start_profile`` and
``LLM.stop_profile``.

Upstream counterpart: ``TorchProfilerWrapper`` in ``vllm/profiler/wrapper.py``, which
``Worker.profile`` starts and stops (``vllm/v1/worker/gpu_worker.py``), reached from
``LLM.start_profile`` through the engine core and a ``collective_rpc``.

Why each rank profiles itself: with tensor parallelism the model runs in the worker
processes, and a profiler only sees the process it runs in (the CUDA activity too), so a
profiler around ``LLM.generate`` in the driver shows the step being sent and the answer
awaited, not the kernels. Here every rank starts its own ``torch.profiler`` on the same
call and, on stop, writes ``rank<r>_trace.json`` (a Chrome trace: chrome://tracing or
https://ui.perfetto.dev) and ``rank<r>_table.txt`` (the operators and kernels that took
longest) into the directory the caller named. Upstream takes the directory from its
profiler config at start-up; minivllm takes it per call.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Rows of the table written beside each trace.
TABLE_ROWS = 40


class TorchProfilerWrapper:
    """Start and stop ``torch.profiler`` for one rank.

    Args:
        rank: This rank's index, in the file names.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._profiler: torch.profiler.profile | None = None
        self._trace_dir: Path | None = None

    @property
    def running(self) -> bool:
        """Whether a profile is being recorded."""
        return self._profiler is not None

    def start(self, trace_dir: str) -> None:
        """Start recording (CPU, and CUDA where there is a GPU) for ``trace_dir``.

        Raises:
            RuntimeError: A profile is already being recorded.
            OSError: ``trace_dir`` cannot be created (checked before recording starts).
        """
        if self._profiler is not None:
            raise RuntimeError("a profile is already running: stop_profile() it first")
        path = Path(trace_dir)
        path.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities)
        profiler.start()
        self._profiler, self._trace_dir = profiler, path

    def stop(self) -> str:
        """Stop recording; write this rank's trace and table; return the trace's path.

        Raises:
            RuntimeError: No profile is being recorded.
        """
        profiler, path = self._profiler, self._trace_dir
        if profiler is None or path is None:
            raise RuntimeError("no profile is running: call start_profile() first")
        self._profiler = self._trace_dir = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the kernels queued so far belong to the profile
        profiler.stop()
        trace = path / f"rank{self.rank}_trace.json"
        profiler.export_chrome_trace(str(trace))
        sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=TABLE_ROWS)
        (path / f"rank{self.rank}_table.txt").write_text(table)
        return str(trace)
