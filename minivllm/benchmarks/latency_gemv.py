"""Batch-1 latency with layer kernels switched on and off, side by side (GPU only).

``python -m minivllm.benchmarks.latency_gemv --output OUT.json`` runs ``minivllm bench
latency`` (with a profile of eight decode steps) in fresh processes, alternately with the
linear layers' small-M kernel off (``MINIVLLM_GEMV_MAX_M=0``: cuBLAS for every shape),
on (the default row limit) and, with ``--sides``, on with programmatic dependent launch
(``MINIVLLM_GEMV_PDL=1``), on with the decoder layer's fusions undone (``on_unfused``:
Qwen3's q/k norm and rotary embedding as three kernels, ``MINIVLLM_FUSED_QK_NORM_ROPE=0``,
and each RMSNorm a kernel of its own, ``MINIVLLM_NORM_GEMV=0``), with only the second
undone (``on_qk_fused``), or with both fusions on (``on_norm_gemv``). It writes one
JSON with every run, the medians of each side and each side's ratio to the baseline
(``--baseline``, ``off`` unless told). Separate processes, because the layers bind their
implementation at the first forward pass and the captured CUDA graphs keep it;
alternating, so that a drift of the GPU's clocks over the run shows as a spread between
rounds rather than as a ratio. Any option after ``--`` goes to ``minivllm bench latency``
unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import environment, make_random_checkpoint
from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT
from minivllm.model_executor.layers.norm_linear import NORM_GEMV_ENV
from minivllm.model_executor.layers.qk_norm_rope import FUSED_QK_NORM_ROPE_ENV
from minivllm.model_executor.layers.utils import DEFAULT_GEMV_MAX_M, GEMV_MAX_M_ENV, PDL_ENV

# The environment of each side: kernel off, on, on with programmatic dependent launch, on
# with the decoder layer's fusions undone (the default before them), on with only the
# q/k norm + RoPE fusion, and on with it and RMSNorm folded into the next GEMV.
SIDES: dict[str, dict[str, str]] = {
    "off": {GEMV_MAX_M_ENV: "0"},
    "on": {},
    "on_pdl": {PDL_ENV: "1"},
    "on_unfused": {FUSED_QK_NORM_ROPE_ENV: "0", NORM_GEMV_ENV: "0"},
    "on_qk_fused": {NORM_GEMV_ENV: "0"},
    "on_norm_gemv": {NORM_GEMV_ENV: "1"},
}
# Variables a side sets; every child starts without them, then gets its side's.
SWITCHES = (GEMV_MAX_M_ENV, PDL_ENV, FUSED_QK_NORM_ROPE_ENV, NORM_GEMV_ENV)


def _run_side(
    side: str, out_dir: Path, round_no: int, extra: list[str], timeout_s: float
) -> dict[str, Any]:
    """One ``minivllm bench latency`` process for ``side``; its JSON result (or the error)."""
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(SIDES[side])
    output = out_dir / f"latency_{side}_{round_no}.json"
    cmd = [sys.executable, "-m", "minivllm.cli", "bench", "latency", "--output", str(output),
           "--profile-dir", str(out_dir / f"profile_{side}_{round_no}"), *extra]  # fmt: skip
    try:
        subprocess.run(cmd, env=env, check=True, timeout=timeout_s)  # kills it on timeout
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        print(f"latency_gemv: the {side} run failed: {exc}", flush=True)
        return {"error": str(exc)}
    result = json.loads(output.read_text())
    profile = result.get("profile", {})
    # The trace itself stays behind in the temporary folder; keep the summary's top rows.
    result["profile"] = {k: v for k, v in profile.items() if k != "top"}
    result["profile"]["top"] = profile.get("top", [])[:25]
    return result


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m minivllm.benchmarks.latency_gemv``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results/latency_gemv.json")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs to run")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="stop a bench latency process that runs longer than this",
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["off", "on"],
        choices=list(SIDES),
        help="which settings to run besides the baseline",
    )
    parser.add_argument(
        "--baseline",
        default="off",
        choices=list(SIDES),
        help="the setting that runs first in each round and that the ratios divide",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=3600.0,
        help="start no process after this many seconds; cap the last one",
    )
    parser.add_argument("extra", nargs="*", help="after --: options of minivllm bench latency")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    base = args.baseline
    sides = [base, *[s for s in args.sides if s != base]]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    deadline = time.monotonic() + args.budget_s
    extra = list(args.extra)
    if "--model" not in extra:
        # Create the random checkpoint here, once, outside every child's time limit (a
        # child stopped while writing it would leave a broken file for the others).
        extra = ["--model", str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT))), *extra]
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            for side in sides:
                left = deadline - time.monotonic()
                if left < 5:
                    runs[side].append({"error": f"skipped: --budget-s {args.budget_s} spent"})
                    continue
                timeout = min(args.timeout_s, left)
                runs[side].append(_run_side(side, Path(tmp), round_no, extra, timeout))
    result: dict[str, Any] = {**environment(), "env_switch": GEMV_MAX_M_ENV,
                              "gemv_max_m_on": DEFAULT_GEMV_MAX_M, "baseline": base,
                              "side_env": {side: SIDES[side] for side in sides},
                              "runs": runs}  # fmt: skip
    ok = {side: [r for r in runs[side] if "error" not in r] for side in sides}
    for side in sides:
        for key in ("median_tpot_ms", "median_ttft_ms"):
            values = [r[key] for r in ok[side]]
            result[f"{side}_{key}"] = statistics.median(values) if values else None
        busy = [r["profile"].get("device_busy_ms_per_step") for r in ok[side]]
        result[f"{side}_device_busy_ms_per_step"] = statistics.median(busy) if busy else None
    for side in sides[1:]:
        if result[f"{base}_median_tpot_ms"] and result[f"{side}_median_tpot_ms"]:
            ratio = result[f"{base}_median_tpot_ms"] / result[f"{side}_median_tpot_ms"]
            result[f"tpot_{base}_over_{side}"] = ratio
            print(
                f"batch-1 TPOT: {base} {result[f'{base}_median_tpot_ms']:.3f} ms, "
                f"{side} {result[f'{side}_median_tpot_ms']:.3f} ms (x{ratio:.3f})",
                flush=True,
            )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
