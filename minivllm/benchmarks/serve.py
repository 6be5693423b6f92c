"""``minivllm bench serve``: latency and throughput of a running server, over HTTP.

Upstream counterpart: ``vllm/benchmarks/serve.py`` (``vllm bench serve``) with its
request function for the completions API (``vllm/benchmarks/lib/endpoint_request_func.py``).

Each request is a streamed ``POST /v1/completions`` whose ``prompt`` is a list of token
ids (the throughput workload's random prompts, or fixed lengths) with ``ignore_eos`` set,
so every request produces exactly ``max_tokens`` tokens. Requests start at Poisson
arrival times (``--request-rate``; ``inf`` sends them all at once), at most
``--max-concurrency`` at a time. The client times each request as a user would see it:

* TTFT: from sending the request to the first streamed chunk that carries a choice;
* ITL: the gaps between one such chunk and the next;
* TPOT: ``(e2e - ttft) / (output_tokens - 1)``, the mean decode pace of one request;
* E2E: from sending to the last chunk.

The HTTP side lives in ``serve_client.py`` (several client processes, so the client
keeps up with a saturated server). ``--request-rates 1,4,16,inf`` runs one pass per rate
and draws TTFT and ITL against the rate (``serve_plot.py``); ``--launch-server`` starts
``minivllm serve`` for the run and ``--compare-offline`` also times the same requests
through offline ``LLM.generate`` (``serve_compare.py``). A launched server's CPU seconds
over each timed pass, the front end's and the engine core's, go into the run's
``server_cpu`` (``proc_cpu.py``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from minivllm.benchmarks.common import default_output
from minivllm.benchmarks.proc_cpu import cpu_delta
from minivllm.benchmarks.serve_client import LiveViewer, RequestResult, Target, run_requests
from minivllm.benchmarks.workloads import Workload, throughput_workload

CpuProbe = Callable[[], "dict[str, float] | None"]
"""A reading of a server's CPU seconds so far (``LaunchedServer.cpu_times``)."""


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench serve``."""
    from minivllm.benchmarks.throughput import add_engine_bench_args

    parser.add_argument("--base-url", default=None,
                        help="server URL, e.g. http://127.0.0.1:8000 (default: from --host/--port)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", default="/v1/completions")
    parser.add_argument("--served-model-name", default=None,
                        help="the request's model field (default: the server's first model)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=None,
                        help="fixed prompt length (default: the throughput workload's lengths)")
    parser.add_argument("--output-len", type=int, default=None,
                        help="fixed output length (default: the throughput workload's lengths)")
    parser.add_argument("--input-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument("--output-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="fold the workload's token ids (up to 10000) below this size, for "
                             "models with a smaller vocabulary")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="requests per second, Poisson arrivals (inf: all at once)")
    parser.add_argument("--request-rates", default=None,
                        help="comma-separated rates to sweep, e.g. 1,4,16,inf (one JSON + PNG)")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--num-warmups", type=int, default=0,
                        help="untimed requests (other prompts, same lengths) sent first")
    parser.add_argument("--seed", type=int, default=0, help="workload and arrival-time seed")
    parser.add_argument("--client-processes", default="auto",
                        help="client processes sharing the requests (auto: a quarter of the "
                             "cores, at most 4)")
    parser.add_argument("--launch-server", action="store_true",
                        help="start `minivllm serve` with the engine options on a free port")
    parser.add_argument("--compare-offline", action="store_true",
                        help="also run the same requests through offline LLM.generate "
                             "(implies --launch-server)")
    parser.add_argument("--server-timeout", type=float, default=600.0,
                        help="seconds to wait for a launched server to become healthy")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="the launched server's --stream-interval: a stream's chunk "
                             "every N tokens after its first (ITL is then per chunk)")
    parser.add_argument("--live-viewer", action="store_true",
                        help="keep one viewer on /v1/live/stream during the run (the live "
                             "page's cost to the engine; docs/live_view.md)")
    add_engine_bench_args(parser, default_output("serve.json"))


def build_workload(args: argparse.Namespace, num: int, seed: int) -> Workload:
    """The requests: the throughput workload's lengths, or ``--input-len/--output-len``."""
    in_range = (args.input_len,) * 2 if args.input_len else tuple(args.input_len_range)
    out_range = (args.output_len,) * 2 if args.output_len else tuple(args.output_len_range)
    workload = throughput_workload(num, seed, in_range, out_range)
    if args.vocab_size:
        workload.prompts = [[t % args.vocab_size for t in p] for p in workload.prompts]
    return workload


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before anything starts, naming the flag."""
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}")
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be 0 or more, got {args.num_warmups}")
    if args.stream_interval < 1:
        raise ValueError(f"--stream-interval must be at least 1, got {args.stream_interval}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if args.client_processes != "auto" and (not args.client_processes.isdigit()
                                            or int(args.client_processes) < 1):
        raise ValueError(f"--client-processes must be 'auto' or a positive integer, got "
                         f"{args.client_processes!r}")
    for flag in ("input_len", "output_len", "vocab_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")


def parse_rates(args: argparse.Namespace) -> list[float]:
    """The request rates to run, in order (``inf`` accepted)."""
    if args.request_rates is None:
        if not args.request_rate > 0:
            raise ValueError(f"--request-rate must be positive (or inf), got {args.request_rate}")
        return [args.request_rate]
    try:
        rates = [float(r) for r in args.request_rates.split(",") if r.strip()]
    except ValueError as exc:
        raise ValueError(f"--request-rates: {exc}; expected e.g. 1,4,16,inf") from exc
    if not rates or not all(r > 0 for r in rates):  # also refuses nan
        raise ValueError("--request-rates: give one or more positive rates, e.g. 1,4,16,inf")
    return rates


def _stats_ms(name: str, values: list[float]) -> dict[str, float]:
    arr = np.asarray(values or [0.0]) * 1e3
    return {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
            f"p99_{name}_ms": float(np.percentile(arr, 99))}


def summarize(results: list[RequestResult], seconds: float, rate: float,
              max_concurrency: int | None) -> dict[str, Any]:
    """One run's figures, named as ``vllm bench serve`` names them."""
    ok = [r for r in results if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    run: dict[str, Any] = {
        "request_rate": "inf" if math.isinf(rate) else rate,
        "max_concurrency": max_concurrency, "num_prompts": len(results),
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": seconds,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "expected_output_tokens": sum(r.expected_output_len for r in results),
        "request_throughput": len(ok) / seconds,
        "output_throughput": out_tokens / seconds,
        "total_token_throughput": (in_tokens + out_tokens) / seconds,
    }
    run |= _stats_ms("ttft", [r.ttft for r in ok])
    run |= _stats_ms("tpot", [(r.latency - r.ttft) / (r.output_tokens - 1)
                              for r in ok if r.output_tokens > 1])
    run |= _stats_ms("itl", [gap for r in ok for gap in r.itl])
    run |= _stats_ms("e2el", [r.latency for r in ok])
    run["errors"] = sorted({r.error for r in results if not r.success})[:5]
    return run


def make_target(args: argparse.Namespace, base_url: str) -> Target:
    """The server, endpoint and model name (asked of the server unless given)."""
    headers = {}
    if os.environ.get("OPENAI_API_KEY"):  # as vllm bench serve: the key comes from the env
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    model = args.served_model_name
    if model is None:
        response = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
        response.raise_for_status()
        model = response.json()["data"][0]["id"]
    return Target(base_url, args.endpoint, model, headers)


def client_processes(args: argparse.Namespace) -> int:
    """``--client-processes``, where ``auto`` leaves most cores to the server."""
    if args.client_processes != "auto":
        return int(args.client_processes)
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def run_rates(args: argparse.Namespace, target: Target, workload: Workload,
              rates: list[float], cpu_probe: CpuProbe | None = None) -> list[dict[str, Any]]:
    """Warm up, then one timed pass per rate; with ``cpu_probe`` (a launched server), each
    pass records the server's CPU seconds (``server_cpu``, see ``proc_cpu.cpu_delta``)."""
    procs = client_processes(args)
    if args.num_warmups:
        # Other prompts (another seed): the timed pass must not hit the prefix cache.
        warm = build_workload(args, args.num_warmups, args.seed + 1)
        run_requests(target, warm, math.inf, args.max_concurrency, args.seed, procs)
    runs = []
    for rate in rates:
        before = cpu_probe() if cpu_probe else None
        results, seconds = run_requests(target, workload, rate, args.max_concurrency,
                                        args.seed, procs)
        run = summarize(results, seconds, rate, args.max_concurrency)
        run["client_processes"] = procs
        if cpu_probe and (cpu := cpu_delta(before, cpu_probe(), seconds)) is not None:
            run["server_cpu"] = cpu
        runs.append(run)
        print(format_run(run), flush=True)
    return runs


def run_rates_watched(args: argparse.Namespace, target: Target, workload: Workload,
                      rates: list[float], result: dict[str, Any],
                      cpu_probe: CpuProbe | None = None) -> list[dict[str, Any]]:
    """``run_rates``, with one live viewer attached throughout if ``--live-viewer``."""
    if not args.live_viewer:
        return run_rates(args, target, workload, rates, cpu_probe)
    with LiveViewer(target) as viewer:
        runs = run_rates(args, target, workload, rates, cpu_probe)
    result["live_viewer"] = viewer.summary()
    return runs


def format_run(run: dict[str, Any]) -> str:
    """A short summary of one run, printed as it ends."""
    return (f"rate {run['request_rate']}: {run['completed']}/{run['num_prompts']} ok in "
            f"{run['duration_s']:.1f} s, {run['request_throughput']:.2f} req/s, "
            f"{run['output_throughput']:.0f} output tok/s; TTFT median "
            f"{run['median_ttft_ms']:.1f} ms p99 {run['p99_ttft_ms']:.1f} ms; ITL median "
            f"{run['median_itl_ms']:.2f} ms p99 {run['p99_itl_ms']:.2f} ms; TPOT median "
            f"{run['median_tpot_ms']:.2f} ms" + _format_cpu(run.get("server_cpu")))


def _format_cpu(cpu: dict[str, float] | None) -> str:
    if cpu is None:
        return ""
    return (f"; server CPU: front end {cpu['front_end_cpu_s']:.1f} s "
            f"({cpu['front_end_busy_share']:.0%} of the pass), engine core "
            f"{cpu['engine_core_cpu_s']:.1f} s")


def run_serve_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (launching the server if asked) and write the JSON result."""
    from minivllm.benchmarks import serve_compare
    from minivllm.benchmarks.common import environment, write_json

    check_args(args)
    rates = parse_rates(args)
    workload = build_workload(args, args.num_prompts, args.seed)
    result: dict[str, Any] = {**environment(), "workload": {
        "num_prompts": len(workload.prompts), "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens, "seed": args.seed,
        "input_len": args.input_len or list(args.input_len_range),
        "output_len": args.output_len or list(args.output_len_range)},
        "num_warmups": args.num_warmups}
    output = Path(args.output)
    if args.compare_offline:
        result["offline"] = serve_compare.run_offline(args, workload, output)
    if args.launch_server or args.compare_offline:
        with serve_compare.LaunchedServer(args, output) as server:
            result["server"] = {"launched": True, "command": server.command_line}
            target = make_target(args, server.base_url)
            result["model"] = target.model
            result["runs"] = run_rates_watched(args, target, workload, rates, result,
                                               server.cpu_times)
    else:
        base_url = args.base_url or f"http://{args.host}:{args.port}"
        result["server"] = {"launched": False, "base_url": base_url}
        target = make_target(args, base_url)
        result["model"] = target.model
        result["runs"] = run_rates_watched(args, target, workload, rates, result)
    if "offline" in result:
        result["comparison"] = serve_compare.compare(result["offline"], result["runs"])
    write_json(output, result)
    if len(rates) > 1:
        from minivllm.benchmarks.serve_plot import plot_serve_sweep

        try:
            plot_serve_sweep(result, output.with_suffix(".png"))
        except ImportError:  # matplotlib comes with the [test] extra, not the base package
            print("matplotlib is not installed: no plot (pip install matplotlib)", flush=True)
    return result
