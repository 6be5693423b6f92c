"""``minivllm bench spec``'s command line: its options and their checks.

Kept apart from ``spec_decode.py`` (the run itself) as ``spec_decode_measure.py`` and
``spec_decode_plot.py`` are: every option of the benchmark and the rule it must satisfy
are on one page, and ``check_spec_args`` refuses bad values before any engine starts,
naming the option. Upstream's benchmarks keep ``add_cli_args`` beside their ``main``
(``vllm/benchmarks/latency.py``); this one has grown more options than a run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minivllm.benchmarks.common import default_output
from minivllm.benchmarks.throughput import add_engine_bench_args


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench spec``."""
    add_engine_bench_args(parser, default_output("spec_decode.json"))
    parser.add_argument(
        "--ks",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 5],
        help="num_speculative_tokens values to measure at batch 1",
    )
    parser.add_argument(
        "--num-prompts", type=int, default=4, help="batch-1 prompts, run one at a time"
    )
    parser.add_argument(
        "--prompt-file",
        default=None,
        help="batch-1 prompts cut from the validation passages of this demo.train --data "
        "file (text neither a target nor a draft trained on it saw) instead of the "
        "repetitive prompts; the model continues them",
    )
    parser.add_argument(
        "--prompt-val-every",
        type=int,
        default=None,
        help="the --val-every the models were trained with (default: demo.train's, 50)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="a --prompt-file prompt is the fewest consecutive passages that reach this "
        "many tokens (default 100)",
    )
    parser.add_argument(
        "--output-len",
        type=int,
        default=256,
        help="tokens generated per batch-1 prompt (EOS ignored)",
    )
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument(
        "--draft-model",
        default=None,
        help="also measure the draft-model proposer with this checkpoint",
    )
    parser.add_argument(
        "--draft-ks",
        type=int,
        nargs="+",
        default=None,
        help="k values for the draft model (default: --ks)",
    )
    parser.add_argument(
        "--throughput-k",
        type=int,
        default=None,
        help="n-gram k for the batch-256 run (default: the largest of --ks)",
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        default=256,
        help="requests of the throughput workload (0: skip that part)",
    )
    parser.add_argument("--input-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument("--output-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument(
        "--sweep-batch-sizes",
        type=int,
        nargs="*",
        default=[1, 4, 16, 64, 256],
        help="batch sizes of the off/on sweep (none: skip it); the largest must not "
        "exceed --num-requests",
    )
    parser.add_argument("--sweep-output-len", type=int, default=256)
    parser.add_argument("--sweep-prompt-len", type=int, default=128)
    parser.add_argument(
        "--disable-by-batch-size",
        type=int,
        default=None,
        help="speculative_config.disable_by_batch_size of the thresholded runs "
        "(default: the sweep's crossover)",
    )
    parser.add_argument(
        "--margin-prompts",
        type=int,
        default=2,
        help="batch-1 prompts rerun with top-2 logprobs to explain greedy differences (0: skip)",
    )
    parser.add_argument("--margin-output-len", type=int, default=64)
    parser.add_argument(
        "--repeat-off",
        action="store_true",
        help="run the sweep with speculation off once more after the other settings: "
        "how much the same setting drifts over one run",
    )
    parser.add_argument(
        "--no-throughput",
        action="store_true",
        help="skip the batch-256 throughput workload (the sweep still draws its prompts)",
    )
    parser.add_argument(
        "--no-plot",
        action="store_true",
        help="write the JSON only (the plot: python -m "
        "minivllm.benchmarks.spec_decode_plot FILE.json)",
    )


def check_spec_args(args: argparse.Namespace) -> None:
    """Refuse bad option values (the message names the option); fill in the held-out
    workload's defaults."""
    _check_prompt_file_args(args)
    for name in ("ks", "draft_ks"):
        values = getattr(args, name)
        if values is not None and (not values or min(values) < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be positive integers, got {values}")
    for name in ("num_prompts", "output_len", "sweep_output_len", "sweep_prompt_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.sweep_batch_sizes and min(args.sweep_batch_sizes) < 1:
        raise ValueError(f"--sweep-batch-sizes must be >= 1, got {args.sweep_batch_sizes}")
    if args.sweep_batch_sizes and max(args.sweep_batch_sizes) > args.num_requests:
        raise ValueError("--sweep-batch-sizes: the largest must not exceed --num-requests")
    if args.disable_by_batch_size is not None and args.disable_by_batch_size < 1:
        raise ValueError("--disable-by-batch-size must be >= 1")
    if not 0 <= args.margin_prompts <= args.num_prompts or args.margin_output_len < 1:
        raise ValueError("--margin-prompts must be in [0, --num-prompts]; --margin-output-len >= 1")
    if args.num_requests < 0:
        raise ValueError("--num-requests must be >= 0")
    if args.throughput_k is not None and args.throughput_k < 1:
        raise ValueError("--throughput-k must be >= 1")
    if args.draft_model is not None and not (Path(args.draft_model) / "config.json").is_file():
        raise FileNotFoundError(f"--draft-model {args.draft_model}: no config.json there")


def _check_prompt_file_args(args: argparse.Namespace) -> None:
    """Check the held-out workload's options and fill in their defaults."""
    if args.prompt_file is None:
        for name in ("prompt_val_every", "prompt_tokens"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} needs --prompt-file")
        return
    if not Path(args.prompt_file).is_file():
        raise FileNotFoundError(f"--prompt-file {args.prompt_file!r} is not a file")
    args.prompt_val_every = 50 if args.prompt_val_every is None else args.prompt_val_every
    args.prompt_tokens = 100 if args.prompt_tokens is None else args.prompt_tokens
    for name in ("prompt_val_every", "prompt_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
