"""``minivllm bench tp``: tensor parallelism, TP=1 against TP=N in one run.

The default model is a random-weight checkpoint of Qwen3-8B's shape (36 layers, hidden
4096, 32 query and 8 KV heads of 128, intermediate 12288, Qwen3's vocabulary): drawn on
the GPU, saved as safetensors once (16 GB, reused by later runs) and loaded through the
engine's ordinary loader. One engine at a time, TP=N first (its workers are fresh
processes; after an in-process TP=1 engine this process would still hold GPU 0 memory
that rank 0's memory profile would count against its KV budget), then TP=1:

1. a short warm-up on the workload's first requests;
2. bench throughput's workload, greedy with EOS ignored, timed: output tokens/s (with
   ``--compare-sync``, once more with async scheduling off on the same TP=N engine);
3. the equivalence run: the workload's first ``--equiv-requests`` prompts, greedy, with
   the top-2 logprobs of every token.

With ``--compare-all-reduce`` a second TP=N engine runs steps 1 and 2 with the
symmetric-memory all-reduce off (``MINIVLLM_SYMM_MEM=0``: every all-reduce through NCCL),
between the first TP=N engine and TP=1, so both all-reduces are timed in one run.

In bf16 TP=1 and TP=N are not bit-identical: a row-parallel layer sums N partial
products with an all-reduce instead of one GEMM's internal accumulation, so the rounding
differs. Greedy decoding amplifies that only where the top two logits are nearly tied;
for every sequence that diverges, the equivalence run records the top-2 logprobs of
both runs at the first divergent position (their gap is the logit gap: both logprobs
share one normalizer), so the margin shows whether the divergence is a near-tie or a
real error. The timed runs' sequences are compared too (tokens only).

With ``--rank-standin`` a last TP=1 engine times a random model of one rank's shape of
TP=N (``tensor_parallel_standin``): the ceiling of TP=N's speed-up from per-rank work
alone. It needs one GPU only; where fewer than N are visible TP=N is skipped.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import (
    QWEN3_0_6B_SHAPE,
    compare_greedy,
    default_output,
    environment,
    first_divergence,
    make_random_checkpoint,
    timed,
    write_json,
)
from minivllm.benchmarks.tensor_parallel_standin import (
    add_rank_standin_args,
    check_standin_checkpoint,
    model_shape,
    rank_shape,
    standin_figures,
    standin_path,
    standin_workload,
    tpn_skip_reason,
)
from minivllm.benchmarks.throughput import (
    add_engine_bench_args,
    build_llm,
    compare_sync,
    engine_figures,
)
from minivllm.benchmarks.workloads import Workload, throughput_workload
from minivllm.distributed.symm_mem import SYMM_MEM_ENV

# Qwen3-8B's shape (its config.json), random weights: the 0.6B shape of the other
# benchmarks, wider and deeper, with an untied LM head.
QWEN3_8B_SHAPE: dict[str, Any] = {
    **QWEN3_0_6B_SHAPE,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "tie_word_embeddings": False,
}
DEFAULT_CHECKPOINT = "/tmp/minivllm-bench/qwen3-8b-random"

# Environment variables that decide how NCCL talks, recorded with the results.
_NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def add_tp_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench tp``."""
    add_engine_bench_args(parser, default_output("tensor_parallel.json"))
    parser.set_defaults(tensor_parallel_size=2)
    parser.add_argument(
        "--num-requests",
        type=int,
        default=256,
        help="requests of the throughput workload (the published one: 256)",
    )
    parser.add_argument("--input-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument("--output-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=32,
        help="warm up on the workload's first N requests (16 tokens each)",
    )
    parser.add_argument(
        "--equiv-requests",
        type=int,
        default=64,
        help="greedy equivalence run with top-2 logprobs on the first N prompts",
    )
    parser.add_argument("--equiv-max-tokens", type=int, default=128)
    parser.add_argument(
        "--compare-sync",
        action="store_true",
        help="time TP=N once more with async scheduling off (same engine)",
    )
    parser.add_argument(
        "--compare-all-reduce",
        action="store_true",
        help=f"time TP=N once more with {SYMM_MEM_ENV}=0 (NCCL all-reduce; a second engine)",
    )
    add_rank_standin_args(parser)
    parser.add_argument(
        "--plot", default=None, help="PNG of the results (default: the JSON's path with .png)"
    )


def make_qwen3_8b_checkpoint(path: Path, shape: dict[str, Any] = QWEN3_8B_SHAPE) -> Path:
    """The random-weight Qwen3-8B-shaped checkpoint (or ``shape``'s) at ``path``, made once.

    ``make_random_checkpoint`` draws the weights on the GPU (seconds; a CPU would take
    minutes for 8 billion) and saves them with ``save_pretrained``; a marker written
    last tells a complete checkpoint from one interrupted while saving.
    """
    done = path / ".minivllm-complete"
    if done.is_file():
        return path
    make_random_checkpoint(path, shape)
    done.write_text("saved\n")
    return path


def _greedy_run(llm, workload: Workload, logprobs: int | None = None) -> tuple[list, float]:
    """Every request greedy with EOS ignored, from a cold prefix cache: (completions,
    wall seconds). The timing method is ``bench throughput``'s."""
    from minivllm import SamplingParams

    llm.reset_prefix_cache()
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=logprobs)
        for n in workload.output_lens
    ]
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    outputs, seconds = timed(llm.generate, prompts, params, use_tqdm=False)
    completions = [o.outputs[0] for o in outputs]
    produced = sum(len(c.token_ids) for c in completions)
    if produced != workload.num_output_tokens:
        raise RuntimeError(f"generated {produced} tokens, expected {workload.num_output_tokens}")
    return completions, seconds


def run_engine(
    args: argparse.Namespace, path: str, tp: int, workload: Workload, equiv: Workload | None
) -> tuple[dict[str, Any], list, list]:
    """One engine at ``tp`` ranks: its figures, the timed run's completions and the
    equivalence run's (which carry logprobs; empty when ``equiv`` is None)."""
    llm, startup = timed(build_llm, args, path, tensor_parallel_size=tp)
    equiv_out: list = []
    try:
        warm = workload.head(args.warmup_requests)
        _greedy_run(llm, Workload(warm.prompts, [16] * len(warm.prompts)))
        completions, seconds = _greedy_run(llm, workload)
        core = llm.llm_engine.engine_core.engine_core
        figures: dict[str, Any] = {
            "tensor_parallel_size": tp,
            "startup_s": startup,
            "seconds": seconds,
            "async_scheduling": core.async_scheduling,
            "output_tokens_per_s": workload.num_output_tokens / seconds,
            "total_tokens_per_s": (workload.num_output_tokens + workload.num_prompt_tokens)
            / seconds,
            **engine_figures(llm),
        }
        print(
            f"TP={tp}: {figures['output_tokens_per_s']:.0f} output tok/s in {seconds:.1f} s "
            f"(start-up {startup:.1f} s)",
            flush=True,
        )
        # The extra runs belong to the main engines only (not --compare-all-reduce's).
        if args.compare_sync and tp > 1 and core.async_scheduling and equiv is not None:
            figures["sync"] = compare_sync(llm, workload, seconds)
        if equiv is not None:
            equiv_out, _ = _greedy_run(llm, equiv, logprobs=2)
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return figures, completions, equiv_out


def run_nccl_engine(
    args: argparse.Namespace, path: str, tp: int, workload: Workload
) -> tuple[dict[str, Any], list]:
    """TP=``tp`` with every all-reduce through NCCL: the workers read
    ``MINIVLLM_SYMM_MEM`` when they start, so it is set for this engine's lifetime."""
    before = os.environ.get(SYMM_MEM_ENV)
    os.environ[SYMM_MEM_ENV] = "0"
    try:
        figures, completions, _ = run_engine(args, path, tp, workload, None)
    finally:
        if before is None:
            del os.environ[SYMM_MEM_ENV]
        else:
            os.environ[SYMM_MEM_ENV] = before
    figures["symm_mem_allowed"] = False
    return figures, completions


def compare(ref: list, other: list) -> dict[str, Any]:
    """``compare_greedy`` of TP=1's completions (``ref``) and TP=N's (``other``)."""
    return compare_greedy(ref, other, ("tp1", "tpn"))


def compare_tokens(ref: list, other: list) -> dict[str, Any]:
    """How many of the timed runs' greedy sequences are identical, and where the others
    first differ (tokens only: the timed runs carry no logprobs)."""
    positions = [first_divergence(a.token_ids, b.token_ids) for a, b in zip(ref, other)]
    diverged = [k for k in positions if k is not None]
    return {
        "num_sequences": len(ref),
        "num_identical": len(ref) - len(diverged),
        "first_divergence_positions": diverged,
    }


def _versions() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nccl_env": {k: os.environ.get(k) for k in _NCCL_ENV},
        SYMM_MEM_ENV: os.environ.get(SYMM_MEM_ENV),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        version = torch.cuda.nccl.version()  # a tuple in recent torch, an int before
        info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
    return info


def _run_tpn(
    args: argparse.Namespace,
    path: str,
    workload: Workload,
    equiv: Workload,
    result: dict[str, Any],
    out: Path,
) -> tuple[dict[str, Any], list, list]:
    """The TP=N engine (and ``--compare-all-reduce``'s second one), recorded in ``result``
    and written at once, so a run stopped during TP=1 still leaves TP=N's figures."""
    tp = args.tensor_parallel_size
    tpn, tpn_out, tpn_equiv = run_engine(args, path, tp, workload, equiv)
    tpn["symm_mem_allowed"] = os.environ.get(SYMM_MEM_ENV) != "0"
    write_json(out, {**result, "incomplete": "TP=1 did not finish", "tpn": tpn})
    if args.compare_all_reduce:
        nccl, nccl_out = run_nccl_engine(args, path, tp, workload)
        result.update(
            tpn_nccl=nccl,
            symm_mem_over_nccl=tpn["output_tokens_per_s"] / nccl["output_tokens_per_s"],
            nccl_vs_symm_mem_greedy=compare_tokens(nccl_out, tpn_out),
        )
        print(f"TP={tp} symmetric memory / NCCL: {result['symm_mem_over_nccl']:.3f}x", flush=True)
        write_json(out, {**result, "incomplete": "TP=1 did not finish", "tpn": tpn})
    return tpn, tpn_out, tpn_equiv


def run_rank_standin(
    args: argparse.Namespace, shape: dict[str, Any], workload: Workload, tp1: dict[str, Any]
) -> dict[str, Any]:
    """``--rank-standin``: build (once) and time the model of one rank's shape at TP=1,
    same workload and engine options; its figures and ``tp1_over_standin``.

    Upstream's ``vllm bench`` has no such run: a measuring device of this project (see
    ``tensor_parallel_standin``)."""
    tp = args.tensor_parallel_size
    path = standin_path(args, shape)
    made, checkpoint_s = timed(make_qwen3_8b_checkpoint, path, shape)
    check_standin_checkpoint(made, shape)
    standin_load, wrapped = standin_workload(workload, shape["vocab_size"])
    print(f"rank stand-in of TP={tp} at TP=1 ({made}):", flush=True)
    figures, _, _ = run_engine(args, str(made), 1, standin_load, None)
    standin = {
        **standin_figures(figures, shape, tp, tp1),
        "checkpoint": str(made),
        "checkpoint_s": checkpoint_s,
        "token_ids_wrapped": wrapped,
    }
    print(
        f"one rank of TP={tp} alone at TP=1: {standin['output_tokens_per_s']:.0f} output "
        f"tok/s; TP={tp} ceiling from per-rank work: {standin['tp1_over_standin']:.2f}x TP=1",
        flush=True,
    )
    return standin


def run_tp_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run TP=N and TP=1 on the same workload (and the rank stand-in with
    ``--rank-standin``); write the JSON (and the plot, when TP=N ran)."""
    tp = args.tensor_parallel_size
    if tp < 2:
        raise ValueError(
            f"--tensor-parallel-size must be at least 2 to compare with TP=1, got {tp}"
        )
    # Both checked before the (large) checkpoint is made: a refusal costs nothing.
    skip_tpn = tpn_skip_reason(args, tp)
    shape = rank_shape(model_shape(args, QWEN3_8B_SHAPE), tp) if args.rank_standin else None
    if args.model:
        path, checkpoint_s = args.model, 0.0
    else:
        made, checkpoint_s = timed(make_qwen3_8b_checkpoint, Path(DEFAULT_CHECKPOINT))
        path = str(made)
        print(f"checkpoint ready at {path} in {checkpoint_s:.0f} s", flush=True)
    workload = throughput_workload(
        args.num_requests, 0, tuple(args.input_len_range), tuple(args.output_len_range)
    )
    equiv_prompts = workload.prompts[: args.equiv_requests]
    equiv = Workload(equiv_prompts, [args.equiv_max_tokens] * len(equiv_prompts))
    result: dict[str, Any] = {
        **environment(),
        **_versions(),
        "model": path if args.model else f"random-weight Qwen3-8B shape ({path})",
        "checkpoint_s": checkpoint_s,
        "dtype": args.dtype,
        "enforce_eager": args.enforce_eager,
        "workload": {
            "num_requests": len(workload.prompts),
            "published_num_requests": 256,
            "prompt_tokens": workload.num_prompt_tokens,
            "output_tokens": workload.num_output_tokens,
            "warmup_requests": args.warmup_requests,
        },
    }
    out = Path(args.output)
    if skip_tpn is None:
        tpn, tpn_out, tpn_equiv = _run_tpn(args, path, workload, equiv, result, out)
    else:
        result["tpn_skipped"] = skip_tpn
        print(skip_tpn, flush=True)
    # Without TP=N the equivalence run would have nothing to be compared with.
    tp1, tp1_out, tp1_equiv = run_engine(args, path, 1, workload, equiv if not skip_tpn else None)
    result["tp1"] = tp1
    if skip_tpn is None:
        result.update(
            tpn=tpn,
            tpn_over_tp1=tpn["output_tokens_per_s"] / tp1["output_tokens_per_s"],
            target_tpn_over_tp1=1.6,
            workload_greedy=compare_tokens(tp1_out, tpn_out),
            equivalence={"max_tokens": args.equiv_max_tokens, **compare(tp1_equiv, tpn_equiv)},
        )
        eq = result["equivalence"]
        print(
            f"TP={tp} / TP=1: {result['tpn_over_tp1']:.2f}x; identical greedy sequences: "
            f"workload {result['workload_greedy']['num_identical']}/{len(tp1_out)}, "
            f"equivalence run {eq['num_identical']}/{eq['num_prompts']} (largest TP=1 top-2 "
            f"gap at a first divergence: {eq['max_tp1_margin']})",
            flush=True,
        )
    if shape is not None:
        write_json(out, {**result, "incomplete": "the rank stand-in did not finish"})
        result["rank_standin"] = run_rank_standin(args, shape, workload, tp1)
    write_json(out, result)
    if skip_tpn is None:
        from minivllm.benchmarks.tensor_parallel_plot import plot_tp_results

        plot_tp_results(result, Path(args.plot) if args.plot else out.with_suffix(".png"))
    return result


def main() -> None:
    """``python -m minivllm.benchmarks.tensor_parallel``: the same as ``minivllm bench tp``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tp_args(parser)
    run_tp_bench(parser.parse_args())


if __name__ == "__main__":
    main()
