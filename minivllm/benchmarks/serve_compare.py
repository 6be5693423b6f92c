"""``minivllm bench serve --launch-server / --compare-offline``: start the server for the
run, and time the very same requests through offline ``LLM.generate``.

The offline run happens first, in a fresh Python process, so the two engines never hold
the GPU's memory at the same time and each starts cold in the same way. Both use the same
engine options (the ``bench`` defaults shared with ``bench throughput``), the same
warm-up requests and the same timed requests, so the ratio of their output tokens per
second is what serving costs: HTTP, JSON, server-sent events and the engine-core process
boundary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from minivllm.benchmarks.proc_cpu import process_tree_cpu
from minivllm.benchmarks.workloads import Workload


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``EngineArgs`` fields from the shared bench options (as ``throughput.build_llm``)."""
    return dict(
        dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
        stream_interval=args.stream_interval,
    )


def engine_flags(kwargs: dict[str, Any]) -> list[str]:
    """The ``minivllm serve`` flags that set ``kwargs`` (None means the engine's default)."""
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LaunchedServer:
    """``minivllm serve`` in its own process group, for the duration of a ``with`` block.

    Its output goes to ``<output stem>_server.log`` beside the result. On exit (or a
    failure to start) it gets SIGINT, a clean shutdown; SIGKILL to the whole group if
    that takes over 30 s, so no engine-core process outlives the benchmark.
    """

    def __init__(self, args: argparse.Namespace, output: Path) -> None:
        from minivllm.benchmarks.throughput import checkpoint_path

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "minivllm.cli", "serve", checkpoint_path(args),
                        "--host", "127.0.0.1", "--port", str(self.port),
                        *engine_flags(engine_kwargs(args))]
        self.command_line = " ".join(["minivllm", *self.command[3:]])
        self.timeout = args.server_timeout
        output.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = output.with_name(output.stem + "_server.log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LaunchedServer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"minivllm serve exited with {self.proc.returncode} before "
                                   f"becoming healthy:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.5)
        raise TimeoutError(f"minivllm serve not healthy after {self.timeout:.0f} s "
                           f"(--server-timeout):\n{self.log_tail()}")

    def cpu_times(self) -> dict[str, float] | None:
        """The server's CPU seconds so far: its own process (the front end) and the
        processes below it (the engine core); None without ``/proc`` or once it exited."""
        return None if self.proc is None else process_tree_cpu(self.proc.pid)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Shut the server down; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        # The group: the engine-core process too, should it have outlived the server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_offline(args: argparse.Namespace, workload: Workload, output: Path) -> dict[str, Any]:
    """Time ``workload`` through offline ``LLM.generate`` in a fresh process."""
    from minivllm.benchmarks.serve import build_workload
    from minivllm.benchmarks.throughput import checkpoint_path

    warm = build_workload(args, args.num_warmups, args.seed + 1)
    spec = {"model": checkpoint_path(args), "engine": engine_kwargs(args),
            "prompts": workload.prompts, "output_lens": workload.output_lens,
            "warmup_prompts": warm.prompts, "warmup_output_lens": warm.output_lens}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "minivllm.benchmarks.serve_compare", str(spec_path),
               str(result_path)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        log = proc.stdout.decode(errors="replace")
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_name(output.stem + "_offline.log").write_text(log)
        if proc.returncode != 0:
            tail = "\n".join(log.splitlines()[-30:])
            raise RuntimeError(f"the offline run failed ({proc.returncode}):\n{tail}")
        result = json.loads(result_path.read_text())
    print(f"offline LLM.generate: {result['output_tokens_per_s']:.0f} output tok/s in "
          f"{result['seconds']:.1f} s", flush=True)
    return result


def compare(offline: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Served over offline output tokens/s, at the saturating rate (``inf``) if it ran."""
    run = next((r for r in runs if r["request_rate"] == "inf"), runs[0])
    ratio = run["output_throughput"] / offline["output_tokens_per_s"]
    print(f"served / offline output tokens/s at rate {run['request_rate']}: {ratio:.1%}",
          flush=True)
    return {"request_rate": run["request_rate"], "served_output_throughput":
            run["output_throughput"], "offline_output_throughput":
            offline["output_tokens_per_s"], "served_over_offline": ratio}


def _generate(llm: Any, workload: Workload) -> float:
    """Run every request greedily with EOS ignored, as the server is asked to; return
    wall seconds (GPU work included)."""
    from minivllm import SamplingParams
    from minivllm.benchmarks.common import timed

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in workload.output_lens]
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    outputs, seconds = timed(llm.generate, prompts, params, use_tqdm=False)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    if produced != workload.num_output_tokens:
        raise RuntimeError(f"generated {produced} tokens, expected {workload.num_output_tokens}")
    return seconds


def _offline_main(spec_path: str, result_path: str) -> None:
    """The offline process: warm up, then one timed ``generate`` of the workload.

    The warm-up prompts differ from the timed ones (as the server's do), so the prefix
    cache gives the timed pass nothing on either side.
    """
    from minivllm import LLM

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(spec["model"], **spec["engine"])
    warm = Workload(spec["warmup_prompts"], spec["warmup_output_lens"])
    if warm.prompts:
        _generate(llm, warm)
    workload = Workload(spec["prompts"], spec["output_lens"])
    seconds = _generate(llm, workload)
    llm.shutdown()
    Path(result_path).write_text(json.dumps({
        "seconds": seconds, "num_requests": len(workload.prompts),
        "output_tokens_per_s": workload.num_output_tokens / seconds,
        "total_tokens_per_s":
            (workload.num_output_tokens + workload.num_prompt_tokens) / seconds}))


if __name__ == "__main__":
    _offline_main(sys.argv[1], sys.argv[2])
