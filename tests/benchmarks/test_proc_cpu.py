"""A process tree's CPU seconds from /proc: its own, its descendants', and a pass's share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minivllm.benchmarks.proc_cpu import cpu_delta, process_tree_cpu

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

# A parent that starts a child which burns CPU, then both wait to be killed.
_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time\\nt = time.time()\\nwhile time.time() - t < 1.0: pass\\ntime.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_descendants_count_apart_from_the_process() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        before = process_tree_cpu(parent.pid)
        time.sleep(1.5)  # the child burns about a second of CPU, the parent sleeps
        after = process_tree_cpu(parent.pid)
        delta = cpu_delta(before, after, 1.5)
        assert delta["engine_core_cpu_s"] > 0.5  # the child, below the parent
        assert delta["front_end_cpu_s"] < 0.2  # the parent itself, asleep
        assert delta["front_end_busy_share"] == pytest.approx(delta["front_end_cpu_s"] / 1.5)
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_a_reading_of_a_gone_process_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_tree_cpu(proc.pid) is None
    assert cpu_delta(None, {"process_s": 1.0, "descendants_s": 0.0}, 1.0) is None
    own = process_tree_cpu(os.getpid())
    assert own is not None and own["process_s"] > 0
