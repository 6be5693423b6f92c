"""``minivllm bench throughput``: offline throughput on the community workload, against
the roofline and, with ``--peer hf``, against Hugging Face transformers in the same run.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import (
    environment,
    make_random_checkpoint,
    measure_copy_bandwidth,
    timed,
    write_json,
)
from minivllm.benchmarks.roofline import Roofline, decode_roofline
from minivllm.benchmarks.workloads import Workload, throughput_workload

DEFAULT_CHECKPOINT = "/tmp/minivllm-bench/qwen3-0.6b-random"


def add_engine_bench_args(parser: argparse.ArgumentParser, output: str) -> None:
    """Options shared by the engine benchmarks."""
    parser.add_argument("--model", default=None,
                        help=f"checkpoint folder (default: a random-weight Qwen3-0.6B shape "
                             f"saved at {DEFAULT_CHECKPOINT})")
    parser.add_argument("--output", default=output, help="JSON result file")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--async-scheduling", choices=["auto", "on", "off"], default="auto",
                        help="keep one step in flight (auto: on unless speculating)")


def add_throughput_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench throughput``."""
    add_engine_bench_args(parser, "bench-results/throughput.json")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--peer", choices=["none", "hf"], default="none",
                        help="also run Hugging Face transformers on the same requests")
    parser.add_argument("--peer-num-requests", type=int, default=None,
                        help="run the peers (and minivllm again) on the first N requests only")
    parser.add_argument("--input-len-range", type=int, nargs=2, default=[100, 1024],
                        help="prompt lengths (the published workload: 100 1024)")
    parser.add_argument("--output-len-range", type=int, nargs=2, default=[100, 1024],
                        help="output lengths (the published workload: 100 1024)")
    parser.add_argument("--profile-dir", default=None,
                        help="also profile 8 full-batch decode steps of the workload here")
    parser.add_argument("--compare-sync", action="store_true",
                        help="run the workload again with async scheduling off, same engine")
    parser.add_argument("--profile-temperature", type=float, default=0.0,
                        help="sampling temperature of the profiled decode steps")
    parser.add_argument("--compare-sampler", action="store_true",
                        help="run the temperature workload again with the sampler's one-pass "
                             "kernel off, then on again, same engine")
    parser.add_argument("--step-timeline", action="store_true",
                        help="one more temperature run with every step timed, then one under "
                             "the profiler: where the whole run's time goes (one GPU only)")
    parser.add_argument("--repeats", type=int, default=0,
                        help="time the temperature workload this many more times: the "
                             "spread of the wall clock, with the host's busy time per run")
    parser.add_argument("--decode-profile", type=int, nargs="+", default=[], metavar="B",
                        help="also profile decode steps of B requests each (every B given): "
                             "kernels and device time per step, by kernel class")
    parser.add_argument("--decode-profile-context", type=int, default=800,
                        help="prompt tokens of each profiled request")
    parser.add_argument("--cold", action="store_true",
                        help="as a new user meets it: fresh processes with an empty Triton "
                             "cache; start-up time cold and warm, first timed run vs second")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)


def checkpoint_path(args: argparse.Namespace) -> str:
    """The model folder a benchmark runs (creating the random checkpoint if needed)."""
    return args.model or str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))


def build_llm(args: argparse.Namespace, path: str, **overrides: Any):
    """An ``LLM`` configured from the shared benchmark options."""
    from minivllm import LLM

    kwargs = dict(
        dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
    )
    kwargs.update(overrides)
    return LLM(path, **kwargs)


# nano-vllm's benchmark samples at this temperature; greedy is our default.
SAMPLED_TEMPERATURE = 0.6


def generate_workload(llm, workload: Workload, temperature: float = 0.0) -> float:
    """Run every request with EOS ignored (greedy by default); return wall seconds."""
    from minivllm import SamplingParams

    # Each timed run starts from a cold prefix cache, so repeated prompts don't hit.
    llm.reset_prefix_cache()
    params = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True)
              for n in workload.output_lens]
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    outputs, seconds = timed(llm.generate, prompts, params, use_tqdm=False)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    if produced != workload.num_output_tokens:
        raise RuntimeError(f"generated {produced} tokens, expected {workload.num_output_tokens}")
    return seconds


def _weights_and_kv_spec(runner) -> tuple[int, Any]:
    """Bytes of the model's weights and the KV cache geometry, read on the model runner."""
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    return weights, runner.kv_spec


def workload_roofline(llm, workload: Workload, copy_bandwidth: float) -> Roofline:
    """The decode roofline of ``workload`` for ``llm``'s model (one rank: the model must
    be in this process)."""
    weights, spec = llm.collective_rpc(_weights_and_kv_spec)[0]
    kv_bytes_per_token = spec.page_size_bytes * spec.num_layers // spec.block_size
    return decode_roofline(workload, weights, kv_bytes_per_token, copy_bandwidth)


def engine_figures(llm) -> dict[str, Any]:
    """The engine's own counters after a run."""
    s = llm.llm_engine.stats
    # Per rank when tensor-parallel; the benchmark reads the core it drives in-process.
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    spec = executor.kv_spec
    # The CUDA graphs' pool (None: eager, or the runner is in worker processes).
    graphs = getattr(getattr(executor, "model_runner", None), "cuda_graph_runner", None)
    return {"steps": s.num_steps, "preemptions": s.num_preemptions,
            "num_kv_blocks": s.num_kv_blocks, "peak_blocks_in_use": s.peak_blocks_in_use,
            "kv_cache_gib": s.num_kv_blocks * spec.block_bytes_all_layers / 2**30,
            "cuda_graph_gib": None if graphs is None else graphs.memory_bytes / 2**30}


def device_memory(gpu_memory_utilization: float) -> dict[str, float] | None:
    """The current CUDA device's memory in GiB after the runs: in use by every process on
    it, the budget of ``gpu_memory_utilization`` (a fraction of the total) that the KV
    pool was sized to fill, reserved by this process's torch allocator, and the total;
    None without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return {"used_gib": (total - free) / 2**30, "total_gib": total / 2**30,
            "budget_gib": total * gpu_memory_utilization / 2**30,
            "torch_reserved_gib": torch.cuda.memory_reserved() / 2**30}


def run_throughput_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write the JSON result."""
    if args.repeats < 0:
        raise ValueError(f"--repeats must be >= 0, got {args.repeats}")
    if any(b < 1 for b in args.decode_profile) or args.decode_profile_context < 1:
        raise ValueError("--decode-profile sizes and --decode-profile-context must be >= 1, "
                         f"got {args.decode_profile} and {args.decode_profile_context}")
    if args.cold or args.cold_child:
        from minivllm.benchmarks.throughput_cold import run_cold_bench

        return run_cold_bench(args)
    path = checkpoint_path(args)
    workload = throughput_workload(args.num_requests, 0, tuple(args.input_len_range),
                                   tuple(args.output_len_range))
    result: dict[str, Any] = {**environment(), "workload": {
        "num_requests": len(workload.prompts), "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens}}
    result["copy_bandwidth_bytes_per_s"] = bw = measure_copy_bandwidth()
    llm, startup_s = timed(build_llm, args, path)
    # Warm-up on the workload itself: Triton compiles a kernel variant the first time it
    # sees a new specialization (e.g. a batch shape), and a smaller warm-up leaves some of
    # those compilations inside the timed run.
    generate_workload(llm, workload)
    seconds = generate_workload(llm, workload)
    mini = {"engine": "minivllm", "seconds": seconds,
            "output_tokens_per_s": workload.num_output_tokens / seconds,
            "total_tokens_per_s":
                (workload.num_output_tokens + workload.num_prompt_tokens) / seconds,
            "startup_s": startup_s, "device_memory": device_memory(args.gpu_memory_utilization),
            **engine_figures(llm)}
    result["minivllm"] = mini
    sampled = generate_workload(llm, workload, SAMPLED_TEMPERATURE)
    mini["sampled"] = {"temperature": SAMPLED_TEMPERATURE, "seconds": sampled,
                       "output_tokens_per_s": workload.num_output_tokens / sampled}
    if args.tensor_parallel_size > 1:  # the model is in the workers, out of reach
        print(f"minivllm tp={args.tensor_parallel_size}: "
              f"{mini['output_tokens_per_s']:.0f} output tok/s in {seconds:.1f} s", flush=True)
        if args.step_timeline or args.repeats:  # they wrap the model runner (in the workers)
            print("--step-timeline / --repeats skipped: they need the in-process model "
                  "runner (TP 1)")
        write_json(Path(args.output), result)
        llm.shutdown()
        return result
    roof = workload_roofline(llm, workload, bw)
    result["roofline"] = vars(roof)
    mini["fraction_of_roofline"] = mini["output_tokens_per_s"] / roof.max_output_tokens_per_s
    mini["sampled"]["fraction_of_roofline"] = (
        mini["sampled"]["output_tokens_per_s"] / roof.max_output_tokens_per_s)
    print(f"minivllm: {mini['output_tokens_per_s']:.0f} output tok/s in {seconds:.1f} s "
          f"({mini['fraction_of_roofline']:.0%} of the {roof.max_output_tokens_per_s:.0f} "
          f"tok/s roofline)", flush=True)
    memory = mini["device_memory"]
    graph_gib = mini["cuda_graph_gib"]
    print(f"start-up {mini['startup_s']:.1f} s"
          + ("" if memory is None else f"; device memory in use {memory['used_gib']:.2f} GiB "
                                       f"(budget {memory['budget_gib']:.2f})")
          + ("" if graph_gib is None else f", CUDA graphs {graph_gib:.2f} GiB"), flush=True)
    if args.compare_sampler:
        mini["sampled_general_path"] = compare_sampler(llm, workload, sampled)
        for run in mini["sampled_general_path"].values():
            if isinstance(run, dict):
                run["fraction_of_roofline"] = (
                    run["output_tokens_per_s"] / roof.max_output_tokens_per_s)
    # Written now and again at the end: a run stopped by a time limit during the
    # optional stages below still leaves its main figures.
    write_json(Path(args.output), result)
    if args.compare_sync and llm.llm_engine.engine_core.engine_core.async_scheduling:
        result["sync"] = compare_sync(llm, workload, seconds)
    if args.repeats:
        from minivllm.benchmarks.throughput_repeats import print_repeats, run_repeats

        result["repeats"] = run_repeats(llm, workload, args.repeats, roof.max_output_tokens_per_s)
        print_repeats(result["repeats"])
        write_json(Path(args.output), result)
    if args.decode_profile:
        from minivllm.benchmarks.decode_profile import run_decode_profiles

        result["decode_profile"] = run_decode_profiles(
            llm, args.decode_profile, args.decode_profile_context, SAMPLED_TEMPERATURE)
        write_json(Path(args.output), result)
    if args.step_timeline:
        from minivllm.benchmarks.step_timeline import run_step_timeline

        result["step_timeline"] = run_step_timeline(llm, workload, SAMPLED_TEMPERATURE, roof)
    if args.profile_dir:
        result["profile"] = profile_full_batch(llm, workload, Path(args.profile_dir),
                                               args.profile_temperature)
    if args.peer == "hf":
        sub = workload.head(args.peer_num_requests or len(workload.prompts))
        seconds = generate_workload(llm, sub)
        # The engine holds ~90% of the GPU in KV cache: release it before the peers load.
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        # Written after each peer too: transformers' static batching is slow, and a run
        # stopped by a time limit while it runs keeps the peers that finished.
        result["peers"] = run_peers(
            path, sub, seconds,
            on_peer=lambda peers: write_json(Path(args.output), {**result, "peers": peers}),
        )  # fmt: skip
    write_json(Path(args.output), result)
    return result


def compare_sync(llm, workload: Workload, async_seconds: float) -> dict[str, Any]:
    """Time the workload with every step run to completion before the next is scheduled.

    The same engine (same KV pool, same captured graphs) with its step loop switched, so
    the difference is the overlap alone.
    """
    core = llm.llm_engine.engine_core.engine_core  # the EngineCore owns the step loop
    core.async_scheduling = False
    try:
        seconds = generate_workload(llm, workload)
    finally:
        core.async_scheduling = True
    out = {"seconds": seconds, "output_tokens_per_s": workload.num_output_tokens / seconds,
           "async_speedup": seconds / async_seconds}
    print(f"synchronous steps: {out['output_tokens_per_s']:.0f} output tok/s in {seconds:.1f} s; "
          f"async scheduling is {out['async_speedup']:.2f}x", flush=True)
    return out


def _use_gumbel_kernel(runner, on: bool | None) -> None:
    runner.sampler.use_gumbel_kernel = on


def compare_sampler(llm, workload: Workload, kernel_seconds: float) -> dict[str, Any]:
    """Time the temperature workload with the sampler's one-pass kernel off (the general
    float32 path for every row), then on again: the same engine, so the difference is
    the sampler alone, and the second kernel run shows the drift between runs."""
    runs = {}
    for name, on in (("kernel_off", False), ("kernel_on_again", None)):
        llm.collective_rpc(_use_gumbel_kernel, args=(on,))
        seconds = generate_workload(llm, workload, SAMPLED_TEMPERATURE)
        runs[name] = {"seconds": seconds,
                      "output_tokens_per_s": workload.num_output_tokens / seconds}
    out = {**runs, "kernel_speedup": runs["kernel_off"]["seconds"] / kernel_seconds}
    print(f"temperature {SAMPLED_TEMPERATURE}: one-pass kernel "
          f"{workload.num_output_tokens / kernel_seconds:.0f} output tok/s, general path "
          f"{runs['kernel_off']['output_tokens_per_s']:.0f} (kernel x{out['kernel_speedup']:.3f}"
          f"), kernel again {runs['kernel_on_again']['output_tokens_per_s']:.0f}", flush=True)
    return out


def profile_full_batch(
    llm, workload: Workload, out_dir: Path, temperature: float = 0.0
) -> dict[str, Any]:
    """Profile 8 decode steps once every prefill is done and the batch is full.

    The first 40 steps run unprofiled (all prompts are prefilled by then, and no
    request is near its end), then ``profile_steps`` traces the next 8; the rest of the
    workload is aborted.
    """
    from minivllm import SamplingParams
    from minivllm.benchmarks.profiling import profile_steps

    engine = llm.llm_engine
    engine.reset_prefix_cache()
    for prompt, n in zip(workload.prompts, workload.output_lens):
        engine.add_request({"prompt_token_ids": prompt},
                           SamplingParams(temperature=temperature, max_tokens=n,
                                          ignore_eos=True))
    for _ in range(40):
        engine.step()
    summary = profile_steps(engine, 8, out_dir, "throughput_decode")
    summary["batch"] = engine.stats.num_running_reqs
    summary["temperature"] = temperature
    engine.abort_request(list(engine.output_processor.request_states))
    print(f"full-batch decode ({summary['batch']} requests): device busy "
          f"{summary['device_busy_ms_per_step']:.2f} ms per step, wall "
          f"{summary['wall_ms_per_step']:.2f} ms (profiled)", flush=True)
    (out_dir / "throughput_decode_trace.json").unlink(missing_ok=True)  # ~100 MB
    return {k: v for k, v in summary.items() if k != "top"} | {"top": summary["top"][:20]}


def run_peers(
    path: str,
    sub: Workload,
    minivllm_seconds: float,
    on_peer: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """transformers on the request set minivllm just ran in ``minivllm_seconds``;
    ``on_peer`` gets the figures so far before each peer runs and after the last."""
    from minivllm.benchmarks import hf_peer

    mini_rate = sub.num_output_tokens / minivllm_seconds
    peers: dict[str, Any] = {"num_requests": len(sub.prompts),
                             "output_tokens": sub.num_output_tokens,
                             "minivllm": {"seconds": minivllm_seconds,
                                          "output_tokens_per_s": mini_rate}}
    model = hf_peer.load_hf(path)
    for name, fn in (("hf_generate_batch", hf_peer.run_hf_continuous),
                     ("hf_generate", hf_peer.run_hf_generate)):
        if on_peer is not None:
            on_peer(peers)
        try:
            peers[name] = fn(model, sub)
            ratio = mini_rate / peers[name]["output_tokens_per_s"]
            peers[name]["minivllm_speedup"] = ratio
            print(f"{name}: {peers[name]['output_tokens_per_s']:.0f} tok/s; "
                  f"minivllm is {ratio:.1f}x", flush=True)
        except Exception as exc:  # a peer failing must not lose the other results
            peers[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name} failed: {exc}", flush=True)
    if on_peer is not None:
        on_peer(peers)
    return peers
