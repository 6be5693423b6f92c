"""Launch configurations on the batches the throughput workload really runs (GPU only).

``python -m minivllm.benchmarks.kernel_sweep_workload OUT.json [--decode-only | --mixed-split]``
times the unified kernel's candidate configurations on the workload's batches, and records
for each batch what :func:`select_config` picks, so the rules in
``triton_launch_config.py`` and ``triton_decode_split.py`` can be checked against the
timings on other hardware.

* **Prefill tiles** on six batches: the workload's mixed steps (240 decodes beside prompt
  chunks of 100 to 1,024 tokens, 8,192 and 16,384 tokens in all), those prompt chunks
  alone, and the long prefills of ``bench kernel`` (1 x 8,192, 4 x 4,096, 4 x 512 new
  tokens over a 4,096-token prefix), each configuration reading the chunks' own keys both
  ways (``new_kv`` 2, this step's keys through TMA, and 0, the block table).
  ``kernel_sweep.py`` tuned the prefill tiles on one long prompt; the workload prefills
  prompts of a few hundred tokens, where a program's loop over keys is a few tiles long
  and the 128 x 128 tiles' shared memory leaves room for one program per SM.
* **Mixed batches cut in two** (``--mixed-split``): the mixed steps in one launch on
  prefill tiles, against their decodes on decode tiles and their chunks on prefill
  tiles, two launches (``DecodeSplit`` in ``forward_context.py``).
* **Decode segments** at the batch sizes the workload passes through as its requests
  finish (16 to 256 sequences, contexts of 800 to 2,000 tokens): key tiles, pipeline
  depth, split-KV segments and the two merges, longest context first (``seq_order``, what
  the engine launches), and the batch-order pick in batch order.

Upstream picks its tiles from the head size and dtype alone (``_get_tile_size`` in
``vllm/v1/attention/ops/triton_unified_attention.py``) and its split-KV segment count
in the metadata builder (``vllm/v1/attention/backends/triton_attn.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

import torch

from minivllm.attention.triton_launch_config import AttentionLaunchConfig, select_config
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.benchmarks.common import environment, measure_copy_bandwidth
from minivllm.benchmarks.kernel import _bench_graph
from minivllm.benchmarks.kernel_inputs import (
    BLOCK_SIZE,
    DTYPE,
    HEAD_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
    launcher_args,
)
from minivllm.utils.math_utils import cdiv

CONFIGS = (  # block_m, tile_n, warps, stages
    (128, 128, 8, 3),
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 32, 4, 3),
    (64, 128, 4, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 32, 4, 3),
)
NEW_KV_MODES = (2, 0)


def workload_batches(seed: int = 1) -> dict[str, list[tuple[int, int]]]:
    """``name -> [(cached context, new tokens), ...]`` for every batch of the sweep."""
    rng = random.Random(seed)

    def prompts(total: int) -> list[tuple[int, int]]:
        seqs = []
        while total > 0:
            n = min(total, rng.randint(100, 1024))
            seqs.append((0, n))
            total -= n
        return seqs

    decodes = [(rng.randint(300, 1200), 1) for _ in range(240)]
    return {
        "mixed_8192": decodes + prompts(8192 - len(decodes)),
        "mixed_16384": decodes + prompts(16384 - len(decodes)),
        "prompts_8192": prompts(8192),
        "long_1x8192": [(0, 8192)],
        "long_4x4096": [(0, 4096)] * 4,
        "chunked_4x4096_512": [(4096, 512)] * 4,
    }


def batch_inputs(seqs: list[tuple[int, int]], seed: int) -> dict:
    """Launch arguments for one step over ``seqs``: a paged cache with shuffled blocks,
    q/k/v as views of one projection output (the chunks' keys as written this step)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    blocks = [cdiv(c + n, BLOCK_SIZE) for c, n in seqs]
    perm = torch.randperm(sum(blocks), device="cuda", generator=gen).to(torch.int32)
    table = torch.zeros(len(seqs), max(blocks), dtype=torch.int32, device="cuda")
    for i, row in enumerate(torch.split(perm, blocks)):
        table[i, : len(row)] = row
    shape = (sum(blocks), BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    key_cache = torch.randn(shape, dtype=DTYPE, device="cuda", generator=gen)
    value_cache = torch.randn(shape, dtype=DTYPE, device="cuda", generator=gen)
    tokens = sum(n for _, n in seqs)
    width = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE
    qkv = torch.randn(tokens, width, dtype=DTYPE, device="cuda", generator=gen)
    kv = qkv[:, NUM_HEADS * HEAD_SIZE :].view(tokens, 2 * NUM_KV_HEADS, HEAD_SIZE)
    starts = [0, *itertools.accumulate(n for _, n in seqs)]
    return {
        "query": qkv[:, : NUM_HEADS * HEAD_SIZE].reshape(tokens, NUM_HEADS, HEAD_SIZE),
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": table,
        "seq_lens": torch.tensor([c + n for c, n in seqs], dtype=torch.int32, device="cuda"),
        "query_start_loc": torch.tensor(starts, dtype=torch.int32, device="cuda"),
        "key": kv[:, :NUM_KV_HEADS],
        "value": kv[:, NUM_KV_HEADS:],
    }


def prefill_flops(seqs: list[tuple[int, int]]) -> float:
    """FLOPs of causal attention over the batch (decodes included: one query each)."""
    visible = sum(n * c + n * (n + 1) / 2 for c, n in seqs)
    return 4.0 * NUM_HEADS * HEAD_SIZE * visible


def picked_config(seqs: list[tuple[int, int]], ordered: bool = False) -> AttentionLaunchConfig:
    """What ``select_config`` picks for ``seqs`` on this GPU (host facts only), for a launch
    in batch order or, with ``ordered``, longest context first (a decode batch)."""
    return select_config(
        num_tokens=sum(n for _, n in seqs),
        num_seqs=len(seqs),
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        max_query_len=max(n for _, n in seqs),
        max_seq_len=max(c + n for c, n in seqs),
        device=torch.device("cuda"),
        head_size=HEAD_SIZE,
        element_size=DTYPE.itemsize,
        ordered=ordered,
    )


def config_row(config: AttentionLaunchConfig, **fields: object) -> dict:
    """One timing row: the configuration nested and flat (the docs select rows by its
    fields), then ``fields``."""
    return {"config": config.__dict__, **config.__dict__, **fields}


def time_config(
    inputs: dict, config: AttentionLaunchConfig, seq_order: torch.Tensor | None = None
) -> float:
    """Device milliseconds of one launch (cold L2, launch overhead amortised)."""
    paged = {name: inputs[name] for name in ("key_cache", "value_cache", "block_table")}
    args = launcher_args(inputs["query"], paged, inputs["seq_lens"], inputs["query_start_loc"])
    return _bench_graph(
        lambda: launch_unified_attention(
            *args, config, key=inputs["key"], value=inputs["value"], seq_order=seq_order
        )
    )


def sweep_batch(name: str, seqs: list[tuple[int, int]], seed: int) -> dict:
    """Every configuration on one batch, and the one ``select_config`` picks."""
    inputs = batch_inputs(seqs, seed)
    flops = prefill_flops(seqs)
    auto = picked_config(seqs)
    rows = []
    for (block_m, tile, warps, stages), new_kv in itertools.product(CONFIGS, NEW_KV_MODES):
        config = AttentionLaunchConfig(block_m, tile, warps, stages, 1, new_kv=new_kv)
        try:
            ms = time_config(inputs, config)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
            rows.append(config_row(config, error=repr(exc)[:200]))
            continue
        rows.append(
            config_row(config, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, auto=config == auto)
        )
    best = min((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    picked = next((r for r in rows if r.get("auto")), None)
    print(
        f"{name}: best {best['config']} {best['ms'] * 1e3:.0f} us; select_config "
        f"{auto} {picked['ms'] * 1e3 if picked else float('nan'):.0f} us",
        flush=True,
    )
    return {
        "num_seqs": len(seqs),
        "num_tokens": inputs["query"].shape[0],
        "max_query_len": max(n for _, n in seqs),
        "max_seq_len": max(c + n for c, n in seqs),
        "flops": flops,
        "select_config": auto.__dict__,
        "select_config_ms": picked["ms"] if picked else None,
        "best_ms": best["ms"],
        "best_config": best["config"],
        "rows": rows,
    }


# 48 and 192-256 were added when the launch order came in: the rules for decode batches
# launched longest first were set from them (docs/benchmarks/perf5/kernel_sweep_decode*.json).
DECODE_BATCHES = (16, 32, 48, 64, 96, 128, 192, 256)
DECODE_CONFIGS = (  # tile_n, stages (4 warps, 16 rows: the decode family)
    (64, 2),
    (128, 3),
    (128, 2),
)
DECODE_SEGMENTS = ((1, False), (2, False), (2, True), (4, False), (4, True))


def sweep_decode_batch(batch: int, copy_bw: float, seed: int) -> dict:
    """Decode configurations and segment counts on ``batch`` sequences whose contexts are
    uniform in 800..2,000 tokens, longest first; what ``select_config`` picks for the
    engine's launch (``ordered``, timed longest first) and for a launch in batch order
    (timed in batch order). The perf5 files predate the ``ordered`` rules: there
    ``select_config`` is the batch-order pick, timed both ways."""
    rng = random.Random(seed)
    seqs = [(rng.randint(800, 2000), 1) for _ in range(batch)]
    inputs = batch_inputs(seqs, seed)
    longest_first = torch.argsort(inputs["seq_lens"], descending=True)
    nbytes = 2 * sum(c + n for c, n in seqs) * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize
    auto, in_batch_order = picked_config(seqs, ordered=True), picked_config(seqs)
    rows = []
    configs = [
        AttentionLaunchConfig(16, tile, 4, stages, segments, fused)
        for (tile, stages), (segments, fused) in itertools.product(DECODE_CONFIGS, DECODE_SEGMENTS)
    ]
    # Every candidate longest first (as the engine launches); the batch-order pick in
    # batch order.
    runs = [(config, True) for config in (configs if auto in configs else [*configs, auto])]
    for config, ordered in [*runs, (in_batch_order, False)]:
        ms = time_config(inputs, config, longest_first if ordered else None)
        pct = 100 * nbytes / (ms * 1e-3) / copy_bw
        rows.append(config_row(config, ms=ms, ordered=ordered,
                               auto=config == auto and ordered, pct_copy_bw=pct))  # fmt: skip
    best = min(rows, key=lambda r: r["ms"])
    picked = next(r for r in rows if r["auto"])
    unordered = rows[-1]
    print(
        f"decode B{batch}: best {best['config']} ordered={best['ordered']} "
        f"{best['ms'] * 1e3:.0f} us; select_config {auto} {picked['ms'] * 1e3:.0f} us "
        f"longest first; in batch order {in_batch_order} {unordered['ms'] * 1e3:.0f} us",
        flush=True,
    )
    return {
        "batch": batch,
        "context": [800, 2000],
        "select_config": auto.__dict__,
        "select_config_ms": picked["ms"],
        "select_config_pct_copy_bw": picked["pct_copy_bw"],
        "batch_order_config": in_batch_order.__dict__,
        "select_config_batch_order_ms": unordered["ms"],
        "best_ms": best["ms"],
        "best_config": best["config"],
        "best_ordered": best["ordered"],
        "rows": rows,
    }


def split_mixed_batch(name: str, seqs: list[tuple[int, int]], seed: int) -> dict:
    """A mixed batch (its decodes first) attended as the engine did before the decode
    split, in one launch, and as it does now (``DecodeSplit``): the decodes on decode
    tiles in ``seq_order``, then the chunks on prefill tiles; each half alone too. The
    cache first receives the step's keys, so both ways compute the same thing: the
    largest difference between them is reported."""
    import numpy as np

    from minivllm.attention.triton_reshape_and_cache import launch_reshape_and_cache
    from minivllm.worker.input_batch import launch_order, leading_decodes

    inputs = batch_inputs(seqs, seed)
    n = leading_decodes(np.asarray([new for _, new in seqs]))  # where the engine cuts
    table, lens, qsl = inputs["block_table"], inputs["seq_lens"], inputs["query_start_loc"]
    slots = torch.cat([
        table[i, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE
        for i, (c, new) in enumerate(seqs)
        for pos in [torch.arange(c, c + new, device="cuda")]
    ])  # fmt: skip
    launch_reshape_and_cache(inputs["key"], inputs["value"], inputs["key_cache"],
                             inputs["value_cache"], slots)  # fmt: skip
    whole_cfg = picked_config(seqs)
    dec_cfg, pre_cfg = picked_config(seqs[:n], ordered=True), picked_config(seqs[n:])
    # The decodes in the engine's launch order, sorted on the host as prepare_inputs does.
    order = torch.from_numpy(launch_order(np.asarray([c + new for c, new in seqs[:n]])))
    order = order.to("cuda")
    query, out = inputs["query"], torch.empty_like(inputs["query"])
    caches = (inputs["key_cache"], inputs["value_cache"])
    scale = HEAD_SIZE**-0.5

    def whole() -> None:
        launch_unified_attention(query, *caches, table, lens, qsl, out, scale, whole_cfg,
                                 key=inputs["key"], value=inputs["value"])  # fmt: skip

    def decodes() -> None:
        launch_unified_attention(query[:n], *caches, table[:n], lens[:n], qsl[: n + 1],
                                 out[:n], scale, dec_cfg, seq_order=order)  # fmt: skip

    def prefills() -> None:
        launch_unified_attention(query[n:], *caches, table[n:], lens[n:], qsl[n:] - n,
                                 out[n:], scale, pre_cfg, key=inputs["key"][n:],
                                 value=inputs["value"][n:])  # fmt: skip

    def split() -> None:
        decodes()
        prefills()

    whole()
    one = out.clone()
    split()
    row = {
        "batch": name,
        "num_seqs": len(seqs),
        "num_decodes": n,
        "num_tokens": query.shape[0],
        "one_launch_config": whole_cfg.__dict__,
        "decode_config": dec_cfg.__dict__,
        "prefill_config": pre_cfg.__dict__,
        "max_abs_diff": (out.float() - one.float()).abs().max().item(),
        **{f"{k}_ms": _bench_graph(fn) for k, fn in
           (("one_launch", whole), ("split", split), ("decodes", decodes),
            ("prefills", prefills))},
    }  # fmt: skip
    row["split_over_one_launch"] = row["split_ms"] / row["one_launch_ms"]
    print(f"{name}: one launch {row['one_launch_ms'] * 1e3:.0f} us, split "
          f"{row['split_ms'] * 1e3:.0f} us (decodes {row['decodes_ms'] * 1e3:.0f}, "
          f"prefills {row['prefills_ms'] * 1e3:.0f}), max diff {row['max_abs_diff']:.2e}",
          flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> None:
    """Sweep the batches and write the JSON named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="JSON result file")
    parser.add_argument(
        "--decode-only", action="store_true",
        help="only the decode batches (a fraction of the sweep's time: the prefill "
        "batches compile and time many more tile configurations)",
    )  # fmt: skip
    parser.add_argument(
        "--decode-batches", type=int, nargs="+", default=list(DECODE_BATCHES),
        help="the decode batch sizes to sweep",
    )  # fmt: skip
    parser.add_argument(
        "--mixed-split", action="store_true",
        help="only the mixed batches, in one launch against decodes and chunks apart",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: needs a CUDA GPU\n")
    copy_bw = measure_copy_bandwidth()
    result: dict = {
        **environment(),
        "copy_bandwidth_bytes_per_s": copy_bw,
        "batches": {},
        "decode": [],
    }
    # Written after every batch: a run stopped by a time limit keeps what it measured.
    output = Path(args.output)
    if args.mixed_split:
        mixed = {k: v for k, v in workload_batches().items() if k.startswith("mixed")}
        result["mixed_split"] = [
            split_mixed_batch(name, seqs, seed=i) for i, (name, seqs) in enumerate(mixed.items())
        ]
        output.write_text(json.dumps(result, indent=2) + "\n")
        return
    if not args.decode_only:
        for i, (name, seqs) in enumerate(workload_batches().items()):
            result["batches"][name] = sweep_batch(name, seqs, seed=i)
            output.write_text(json.dumps(result, indent=2) + "\n")
            torch.cuda.empty_cache()
    for batch in args.decode_batches:
        result["decode"].append(sweep_decode_batch(batch, copy_bw, seed=batch))
        output.write_text(json.dumps(result, indent=2) + "\n")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
