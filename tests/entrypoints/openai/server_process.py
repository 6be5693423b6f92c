"""Start and stop a real ``minivllm serve`` process for tests (no test lives here).

Upstream counterpart: ``tests/utils.py`` (``RemoteOpenAIServer``). The server runs in
its own session (process group), so stopping it takes the engine-core process with it
even when the test failed or timed out.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from minivllm.demo import demo_model_path

# The engine arguments the server and the offline LLM of a test share, so their greedy
# outputs can be compared token for token.
ENGINE_ARGS = {
    "device": "cpu",
    "dtype": "float32",
    "num_kv_blocks": 256,
    "max_model_len": 256,
    "seed": 0,
}
# The shared server's flags (conftest.py's ``shared_server``): a key, so the
# authentication tests can share it too, and a short model name.
API_KEY = "sk-minivllm-test"
SERVED_MODEL_NAME = "demo"
SHARED_SERVER_ARGS = ["--api-key", API_KEY, "--served-model-name", SERVED_MODEL_NAME]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc: no psutil needed)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            # The field after the ")" that closes the command name: state, then ppid.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# Loaded here, not in the child: between fork and exec only the call itself is safe.
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM it when the test process dies, even
    killed outright (no fixture teardown then), so no server outlives its test run."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class RemoteOpenAIServer:
    """``minivllm serve`` on the demo model at a free port on 127.0.0.1.

    Args:
        extra_args: More command-line flags (``--api-key``...).
        timeout_s: How long to wait for ``/health`` to answer 200.
    """

    def __init__(self, extra_args: list[str] = (), timeout_s: float = 120.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "minivllm.cli", "serve", str(demo_model_path())]
        for name, value in ENGINE_ARGS.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        args += ["--port", str(self.port), "--uvicorn-log-level", "warning", *extra_args]
        # Closed in __exit__ (the server's whole life).
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="minivllm-serve-", suffix=".log"
        )
        env = dict(os.environ, OMP_NUM_THREADS="1", TRITON_INTERPRET="1")
        self.proc = subprocess.Popen(
            args,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=_die_with_parent,
        )
        try:
            self._wait_for_health(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_for_health(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.logs()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the server did not become healthy in {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        """Everything the server printed so far."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def engine_core_pid(self) -> int:
        """The engine-core process: the server's child that is not multiprocessing's
        resource tracker."""
        for pid in child_pids(self.proc.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"resource_tracker" not in cmdline:
                return pid
        raise RuntimeError(f"no engine-core child of {self.proc.pid}:\n{self.logs()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int | None:
        """Signal the server, wait for it, then kill whatever is left of its group."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.log.close()
