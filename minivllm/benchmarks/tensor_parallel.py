"""Tensor parallelism on a GPU: do TP=1 and TP=N produce the same greedy tokens?

Run: ``python -m minivllm.benchmarks.tensor_parallel --tensor-parallel-size 2``.

In bf16 the two are not bit-identical: a row-parallel layer sums N partial products
with an all-reduce instead of one GEMM's internal accumulation, so the rounding
differs. Greedy decoding amplifies that only where the top two logits are nearly tied;
for every prompt whose tokens diverge, this script records the top-2 logprobs of both
runs at the first divergent position, so the margin shows whether the divergence is a
near-tie (expected) or a real error.
"""

from __future__ import annotations

import argparse
import gc
import random
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.common import (
    default_output,
    environment,
    make_random_checkpoint,
    write_json,
)
from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT


def _generate(path: str, tp: int, prompts: list[list[int]], args: argparse.Namespace) -> list:
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            logprobs=2)
    with LLM(path, tensor_parallel_size=tp, dtype=args.dtype, max_model_len=args.max_model_len,
             gpu_memory_utilization=args.gpu_memory_utilization,
             enforce_eager=args.enforce_eager) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    gc.collect()
    torch.cuda.empty_cache()
    return [o.outputs[0] for o in outs]


def _top2(position: dict) -> list[tuple[int, float]]:
    ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:2]
    return [(tok, lp.logprob) for tok, lp in ranked]


def compare(ref: list, other: list) -> dict[str, Any]:
    """Count identical sequences and explain each first divergence by its top-2 margin."""
    divergences = []
    for i, (a, b) in enumerate(zip(ref, other)):
        k = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if k is None:
            continue
        top_a, top_b = _top2(a.logprobs[k]), _top2(b.logprobs[k])
        divergences.append({
            "prompt": i, "position": k,
            "tp1_top2": top_a, "tpn_top2": top_b,
            "tp1_margin": top_a[0][1] - top_a[1][1], "tpn_margin": top_b[0][1] - top_b[1][1],
        })
    return {"num_prompts": len(ref), "num_identical": len(ref) - len(divergences),
            "divergences": divergences}


def main() -> None:
    """Parse options, run both engines, print and save the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--max-token-id", type=int, default=10000, help="prompt ids in [0, N]")
    parser.add_argument("--output", default=default_output("tensor_parallel_equivalence.json"))
    args = parser.parse_args()
    path = args.model or str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))
    rng = random.Random(0)
    prompts = [[rng.randint(0, args.max_token_id) for _ in range(rng.randint(16, 512))]
               for _ in range(args.num_prompts)]
    # TP=N first: its workers are fresh processes, while after an in-process TP=1 run
    # this process would still hold GPU 0 memory (its CUDA context and cached blocks)
    # that rank 0's memory profile would count against its KV budget.
    other = _generate(path, args.tensor_parallel_size, prompts, args)
    ref = _generate(path, 1, prompts, args)
    result = {**environment(), "tensor_parallel_size": args.tensor_parallel_size,
              "max_tokens": args.max_tokens, "enforce_eager": args.enforce_eager,
              **compare(ref, other)}
    print(f"identical greedy sequences: {result['num_identical']}/{result['num_prompts']}")
    for d in result["divergences"]:
        print(f"prompt {d['prompt']} diverges at token {d['position']}: tp1 top-2 "
              f"{d['tp1_top2']} (margin {d['tp1_margin']:.4f}), tp{args.tensor_parallel_size} "
              f"top-2 {d['tpn_top2']} (margin {d['tpn_margin']:.4f})")
    write_json(Path(args.output), result)


if __name__ == "__main__":
    main()
