"""The ``minivllm`` command: ``generate``, ``bench``, ``trace``.

Upstream counterpart: ``vllm/entrypoints/cli/`` (``vllm serve``, ``vllm bench``).
Engine arguments are generated from ``EngineArgs``'s fields, so the command and the
Python API always accept the same names.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from minivllm.engine.arg_utils import EngineArgs
from minivllm.sampling_params import SamplingParams

# Benchmarks whose default workload needs a GPU: refused on a CPU without --allow-cpu.
GPU_BENCHES = ("throughput", "latency", "prefix", "spec", "tp", "sampler")


def sampling_flag(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` for the ``SamplingParams`` field ``name``.

    The text is parsed with ``parse``, then ``SamplingParams`` itself checks the value,
    so the command refuses exactly what the Python API and the server refuse (NaN, inf,
    out of range), with argparse's exit status 2 and a message naming the flag, before
    any model is loaded.
    """

    def check(text: str) -> Any:
        value = parse(text)  # a ValueError here: argparse's "invalid float value: 'x'"
        try:
            SamplingParams(**{name: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    check.__name__ = parse.__name__
    return check


def _cmd_generate(ns: argparse.Namespace) -> int:
    from minivllm.llm import LLM

    # Before the model loads: a combination of flags SamplingParams refuses fails now.
    params = SamplingParams(
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        max_tokens=ns.max_tokens,
        seed=ns.seed_sampling,
        ignore_eos=ns.ignore_eos,
    )
    model = ns.model
    if model is None:
        from minivllm.demo import demo_model_path

        model = str(demo_model_path())
        print(
            f"[minivllm] no --model given: using the built-in demo model at {model} "
            "(a 5.5M-parameter Llama trained on the King James Bible; pass --model for "
            "a real checkpoint)"
        )
    ns.model = model
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(ns)))
    prompts = ns.prompts or ["In the beginning", "And God said"]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for out in outputs:
        shown = out.prompt if out.prompt is not None else out.prompt_token_ids
        print(f"\n--- prompt: {shown!r}\n{out.outputs[0].text!r}")
        print(
            f"    ({len(out.outputs[0].token_ids)} tokens, "
            f"finish_reason={out.outputs[0].finish_reason})"
        )
    print("\n" + format_engine_summary(llm.llm_engine))
    return 0


def _cmd_serve(ns: argparse.Namespace) -> int:
    from minivllm.entrypoints.openai.api_server import run_server

    if ns.model_tag is not None and ns.model is not None and ns.model_tag != ns.model:
        raise ValueError(f"two models given: {ns.model_tag!r} and --model {ns.model!r}")
    ns.model = ns.model_tag or ns.model
    if ns.model is None:
        from minivllm.demo import demo_model_path

        ns.model = str(demo_model_path())
        print(f"[minivllm] no model given: serving the built-in demo model at {ns.model}")
    return run_server(ns)


def format_engine_summary(engine) -> str:
    """The engine summary line block printed after ``generate``."""
    s = engine.stats
    summary = (
        "engine summary:\n"
        f"  steps                 {s.num_steps}\n"
        f"  prompt tokens         {s.num_prompt_tokens}\n"
        f"  output tokens         {s.num_generation_tokens}\n"
        f"  prefix-cache hit rate {s.prefix_cache_hit_rate:.1%}\n"
        f"  peak KV blocks in use {s.peak_blocks_in_use} / {s.num_kv_blocks}\n"
        f"  preemptions           {s.num_preemptions}"
    )
    spec = s.spec_decoding_stats
    if spec is not None and spec.num_drafts:
        rates = ", ".join(f"{r:.2f}" for r in spec.acceptance_rate_per_pos)
        summary += (
            f"\n  draft tokens          {spec.num_accepted_tokens} accepted / "
            f"{spec.num_draft_tokens} proposed ({spec.acceptance_rate:.1%})\n"
            f"  acceptance by position {rates}\n"
            f"  mean acceptance length {spec.mean_acceptance_length:.2f}"
        )
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``minivllm`` command."""
    parser = argparse.ArgumentParser(prog="minivllm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions for prompts")
    gen.add_argument("prompts", nargs="*", help="prompt texts")
    gen.add_argument("--max-tokens", type=sampling_flag("max_tokens", int), default=32)
    gen.add_argument("--temperature", type=sampling_flag("temperature", float), default=0.0)
    gen.add_argument("--top-p", type=sampling_flag("top_p", float), default=1.0)
    gen.add_argument("--top-k", type=sampling_flag("top_k", int), default=0)
    gen.add_argument(
        "--seed-sampling",
        type=sampling_flag("seed", int),
        default=None,
        help="per-request sampling seed",
    )
    gen.add_argument("--ignore-eos", action="store_true")
    EngineArgs.add_cli_args(gen)
    gen.set_defaults(func=_cmd_generate)
    from minivllm.entrypoints.openai.cli_args import make_arg_parser

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (docs/api_server.md)")
    make_arg_parser(serve)
    EngineArgs.add_cli_args(serve)
    serve.set_defaults(func=_cmd_serve)
    bench = sub.add_parser("bench", help="benchmarks (results as JSON)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    _add_bench_commands(bench_sub)
    from minivllm.tracing import cli as trace_cli

    tr = sub.add_parser("trace", help="run prompts under the engine tracer and save its pictures")
    trace_cli.add_trace_args(tr)
    EngineArgs.add_cli_args(tr)
    trace_cli.set_trace_engine_defaults(tr)
    tr.set_defaults(func=trace_cli.run_trace)
    return parser


def _add_bench_commands(bench_sub: argparse._SubParsersAction) -> None:
    from minivllm.benchmarks import (
        host,
        kernel,
        latency,
        prefix,
        sampler,
        serve,
        soak,
        spec_decode,
        spec_decode_args,
        tensor_parallel,
        throughput,
    )

    commands = [
        ("kernel", "paged-attention kernels vs SDPA and copy bandwidth",
         kernel.add_kernel_bench_args, kernel.run_kernel_bench),
        ("throughput", "offline throughput vs the roofline and Hugging Face",
         throughput.add_throughput_args, throughput.run_throughput_bench),
        ("latency", "batch-1 time to first token and per output token",
         latency.add_latency_args, latency.run_latency_bench),
        ("prefix", "shared-prefix workload, prefix caching on vs off",
         prefix.add_prefix_args, prefix.run_prefix_bench),
        ("host", "the engine's own per-step CPU cost, model stubbed out (runs on a CPU)",
         host.add_host_args, host.run_host_bench),
        ("serve", "a running server over HTTP: TTFT, ITL, throughput at request rates",
         serve.add_serve_args, serve.run_serve_bench),
        ("spec", "speculative decoding off vs n-gram / draft model: batch-1 TPOT, throughput",
         spec_decode_args.add_spec_args, spec_decode.run_spec_bench),
        ("tp", "tensor parallelism: TP=1 vs TP=N on a Qwen3-8B shape, throughput and equality",
         tensor_parallel.add_tp_args, tensor_parallel.run_tp_bench),
        ("sampler", "the sampler alone at temperature: general path vs the one-pass kernel",
         sampler.add_sampler_args, sampler.run_sampler_bench),
    ]
    for name, help_text, add_args, run in commands:
        p = bench_sub.add_parser(name, help=help_text)
        add_args(p)
        if name in GPU_BENCHES:
            p.add_argument(
                "--allow-cpu",
                action="store_true",
                help="run without a CUDA GPU (refused otherwise: the default workload would "
                "take hours on a CPU); give it a small workload",
            )
        p.set_defaults(func=lambda ns, run=run, name=name: _run_bench(ns, name, run))
    # The soak test's exit status says whether its checks passed.
    soak_parser = bench_sub.add_parser("soak", help="random requests and aborts: no leak, no drift")
    soak.add_soak_args(soak_parser)
    soak_parser.set_defaults(func=soak.run_soak_bench)


def _run_bench(ns: argparse.Namespace, name: str, run: Callable[[Any], Any]) -> int:
    """Run one benchmark; a GPU one is refused first where there is no GPU."""
    if name in GPU_BENCHES:
        from minivllm.benchmarks.common import require_gpu

        require_gpu(ns, name)
    run(ns)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minivllm`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(args)
    if ns.command == "bench":
        from minivllm.benchmarks.common import set_cli_args

        set_cli_args(args)
    try:
        return int(ns.func(ns) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"minivllm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
