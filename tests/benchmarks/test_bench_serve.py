"""``minivllm bench serve`` end to end on the CPU, against real ``minivllm serve`` processes.

Not timings: the result files' fields and counts, that every request produced exactly the
tokens it asked for, that the server's own counters saw the same tokens, and that a
launched server is gone afterwards.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minivllm.benchmarks.serve_client import Target, arrival_times, run_requests
from minivllm.benchmarks.serve_compare import engine_flags, free_port
from minivllm.benchmarks.workloads import Workload, throughput_workload
from minivllm.cli import build_parser, main
from minivllm.demo import demo_model_path
from tests.tiny_models import make_tiny_model

SERVER_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
               "--num-kv-blocks", "256", "--uvicorn-log-level", "warning"]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """``minivllm serve`` on the demo model in its own process group, stopped (the whole
    group) however the tests end."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [sys.executable, "-m", "minivllm.cli", "serve", str(demo_model_path()),
           "--port", str(port), *SERVER_ARGS]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"server exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no /health:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counter(samples, name: str, **labels) -> float:
    return sum(v for (n, labs), v in samples.items()
               if n == name and set(labels.items()) <= set(labs))


def test_arrival_times_are_a_seeded_poisson_process() -> None:
    assert arrival_times(5, math.inf, 0) == [0.0] * 5
    times = arrival_times(4000, 4.0, seed=3)
    assert times == arrival_times(4000, 4.0, seed=3) and times[0] == 0.0
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) > 0
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.05)  # mean gap 1 / rate
    assert arrival_times(10, 4.0, seed=4) != arrival_times(10, 4.0, seed=3)


def test_engine_flags_parse_back_with_the_serve_command() -> None:
    kwargs = {"dtype": "float32", "max_num_seqs": 8, "enforce_eager": False,
              "async_scheduling": None, "gpu_memory_utilization": 0.5, "stream_interval": 4}
    flags = engine_flags(kwargs)
    assert flags == ["--dtype", "float32", "--max-num-seqs", "8", "--no-enforce-eager",
                     "--gpu-memory-utilization", "0.5", "--stream-interval", "4"]
    ns = build_parser().parse_args(["serve", "some-model", *flags])
    assert (ns.dtype, ns.max_num_seqs, ns.enforce_eager, ns.async_scheduling,
            ns.gpu_memory_utilization, ns.stream_interval) == ("float32", 8, False, None, 0.5, 4)


@pytest.mark.parametrize("flags, named", [
    (["--request-rates", "1,fast"], "--request-rates"),
    (["--request-rates", "4,0"], "--request-rates"),
    (["--request-rate", "nan"], "--request-rate"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--max-concurrency", "0"], "--max-concurrency"),
    (["--client-processes", "two"], "--client-processes"),
    (["--input-len", "0"], "--input-len"),
    (["--stream-interval", "0"], "--stream-interval"),
])
def test_bad_options_name_the_flag(flags, named, tmp_path, capsys) -> None:
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", *flags, "--output", str(out)]) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()  # refused before anything ran


def test_sweep_against_a_running_server(demo_server, tmp_path) -> None:
    before = scrape(demo_server)
    out = tmp_path / "serve.json"
    main(["bench", "serve", "--base-url", demo_server, "--num-prompts", "6",
          "--input-len-range", "8", "40", "--output-len-range", "4", "16",
          "--vocab-size", "4096", "--request-rates", "20,inf", "--num-warmups", "2",
          "--client-processes", "2", "--output", str(out)])
    result = json.loads(out.read_text())
    workload = throughput_workload(6, 0, (8, 40), (4, 16))
    warmup = throughput_workload(2, 1, (8, 40), (4, 16))
    assert "bench serve" in result["command"]
    assert {"torch", "transformers", "python", "gpu"} <= set(result)
    assert result["model"] == httpx.get(demo_server + "/v1/models").json()["data"][0]["id"]
    assert result["workload"]["output_tokens"] == workload.num_output_tokens
    assert [r["request_rate"] for r in result["runs"]] == [20.0, "inf"]
    for run in result["runs"]:
        assert (run["completed"], run["failed"], run["errors"]) == (6, 0, [])
        assert run["client_processes"] == 2
        # ignore_eos: every request produced exactly the tokens it asked for.
        assert run["total_output_tokens"] == run["expected_output_tokens"]
        assert run["total_output_tokens"] == workload.num_output_tokens
        assert run["total_input_tokens"] == workload.num_prompt_tokens
        for metric in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "p99"):
                assert run[f"{stat}_{metric}_ms"] > 0, (stat, metric)
    assert out.with_suffix(".png").stat().st_size > 0
    # The server counted the same tokens and requests as the client received.
    after = scrape(demo_server)
    sent = 2 * workload.num_output_tokens + warmup.num_output_tokens
    assert (counter(after, "vllm:generation_tokens_total")
            - counter(before, "vllm:generation_tokens_total")) == sent
    assert (counter(after, "vllm:request_success_total", finished_reason="length")
            - counter(before, "vllm:request_success_total", finished_reason="length")) == 14


def test_a_refused_request_is_a_failure_with_its_reason(demo_server) -> None:
    model = httpx.get(demo_server + "/v1/models").json()["data"][0]["id"]
    target = Target(demo_server, "/v1/completions", model)
    workload = Workload([[5] * 10, [5] * 300], [4, 4])  # 300 tokens > max_model_len 256
    results, _ = run_requests(target, workload, math.inf, None, 0)
    assert results[0].success and results[0].output_tokens == 4
    assert not results[1].success and results[1].error.startswith("HTTP 400")


def test_max_concurrency_one_runs_the_requests_one_after_another(demo_server) -> None:
    model = httpx.get(demo_server + "/v1/models").json()["data"][0]["id"]
    target = Target(demo_server, "/v1/completions", model)
    workload = Workload([[7] * 12, [8] * 12, [9] * 12], [6, 6, 6])
    results, _ = run_requests(target, workload, math.inf, 1, 0)
    assert [r.output_tokens for r in results] == [6, 6, 6]
    spans = sorted((r.start_time, r.start_time + r.latency) for r in results)
    assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:]))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    # No tokenizer, like the GPU benchmark's random checkpoint: chunks carry token ids only.
    return str(make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"), vocab_size=10240))


def _processes_with(arg: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if arg in (entry / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return pids


def test_compare_offline_launches_and_stops_its_server(qwen3_dir, tmp_path) -> None:
    out = tmp_path / "serve.json"
    main(["bench", "serve", "--compare-offline", "--model", qwen3_dir, "--num-prompts", "4",
          "--input-len-range", "4", "12", "--output-len-range", "2", "6", "--num-warmups", "2",
          "--client-processes", "1", "--dtype", "float32", "--max-model-len", "128",
          "--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--output", str(out)])
    result = json.loads(out.read_text())
    workload = throughput_workload(4, 0, (4, 12), (2, 6))
    assert result["offline"]["num_requests"] == 4
    assert result["offline"]["output_tokens_per_s"] > 0
    (run,) = result["runs"]
    assert (run["request_rate"], run["completed"], run["failed"]) == ("inf", 4, 0)
    assert run["total_output_tokens"] == workload.num_output_tokens
    comparison = result["comparison"]
    assert comparison["offline_output_throughput"] == result["offline"]["output_tokens_per_s"]
    assert comparison["served_over_offline"] == pytest.approx(
        run["output_throughput"] / result["offline"]["output_tokens_per_s"])
    command = result["server"]["command"].split()
    assert command[:2] == ["minivllm", "serve"] and "--max-num-seqs" in command
    if Path("/proc").is_dir():  # the launched server's CPU over the timed pass
        cpu = run["server_cpu"]
        # /proc counts CPU in clock ticks (10 ms), and this pass lasts a few tens of ms, so
        # either part may read 0 here; test_proc_cpu.py proves non-zero readings on a tree
        # that burns a second of CPU. Here: both parts read, from the server we launched.
        assert cpu["front_end_cpu_s"] >= 0 and cpu["engine_core_cpu_s"] >= 0
        assert cpu["front_end_busy_share"] == pytest.approx(
            cpu["front_end_cpu_s"] / run["duration_s"])
    assert (tmp_path / "serve_server.log").is_file()
    assert (tmp_path / "serve_offline.log").is_file()
    port = command[command.index("--port") + 1]
    assert _processes_with(port.encode()) == []  # the server and its engine core are gone
