"""The twenty-second round's summary.json, computed from the raw files beside it.

``python3 docs/benchmarks/perf20/summarize.py`` (from the repository root). Reads the
two tile sweeps of the fused gate/up + SiLU-and-mul kernel (call1/ and call2/
kernel_gate_up.json), the row limit the second one set (call2/limit.txt), and the
``bench throughput`` runs of the three calls: each process's timed runs at temperature 0.6
(the sampled run and the repeats), the fused kernel on or off (``MINIVLLM_GATE_UP_SILU_MAX_M``);
and the third call's cold run with its log, beside the twentieth round's (perf18/call2).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).parent
PERF18_COLD_LOG = HERE.parent / "perf18/call2/throughput_cold.log"  # the twentieth round's
# (call, tag, off files, on files): the A/B pairs, alternating processes in each call.
AB = [
    ("call1", "full", ["tp_1_off", "tp_3_off"], ["tp_2_on", "tp_4_on"]),
    ("call2", "b16", ["b16_1_off", "b16_2_off"], ["b16_1_on", "b16_2_on"]),
    ("call2", "b48", ["b48_1_off"], ["b48_1_on"]),
    ("call2", "full", ["full_1_off"], ["full_1_on"]),
    ("call3", "b16", ["b16_1_off", "b16_2_off"], ["b16_1_on", "b16_2_on"]),
    ("call3", "full", ["full_1_off"], ["full_1_on"]),
]


def sweep(path: Path) -> dict:
    """Per batch: the two-launch layer, cuBLAS alone, the best fused tiling and the gain."""
    out = {}
    for row in json.loads(path.read_text())["rows"]:
        best = row.get("best", row["fused"])
        out[str(row["m"])] = {
            "apart_us": row["apart_us"],
            "cublas_us": row["cublas_us"],
            "best_us": best["us"],
            "gain_us": row["apart_us"] - best["us"],
            "activation_us": row["apart_us"] - row["cublas_us"],
            "best_config": {k: best["config"][k]
                            for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")},
            "max_rel_err": max(r["max_rel_err"] for r in row.get("sweep", [row["fused"]])
                               if "max_rel_err" in r),
        }  # fmt: skip
    return out


def timed_runs(path: Path) -> dict:
    """A process's timed runs at temperature 0.6, its roofline share and its host time."""
    d = json.loads(path.read_text())
    runs = [d["minivllm"]["sampled"]] + d["repeats"]["runs"]
    return {
        "seconds": [r["seconds"] for r in runs],
        "fraction_of_roofline": [r["fraction_of_roofline"] for r in runs],
        "host_busy_s": [r["host_busy_s"] for r in d["repeats"]["runs"]],
        "output_tokens": d["workload"]["output_tokens"],
        "num_requests": d["workload"]["num_requests"],
    }


def ab(call: str, off: list[str], on: list[str]) -> dict:
    """Both arms' runs pooled over their processes, and on's speed-up (off time / on time)."""
    arms = {}
    for arm, names in (("off", off), ("on", on)):
        runs = [timed_runs(HERE / call / f"{name}.json") for name in names]
        seconds = [s for r in runs for s in r["seconds"]]
        fractions = [f for r in runs for f in r["fraction_of_roofline"]]
        host = [h for r in runs for h in r["host_busy_s"]]
        arms[arm] = {"seconds": seconds, "median_s": statistics.median(seconds),
                     "host_busy_min_s": min(host), "host_busy_max_s": max(host),
                     "min_s": min(seconds), "max_s": max(seconds),
                     "median_fraction_pct": 100 * statistics.median(fractions),
                     "processes": len(names), "runs": len(seconds),
                     "num_requests": runs[0]["num_requests"]}  # fmt: skip
    arms["speedup_median"] = arms["off"]["median_s"] / arms["on"]["median_s"]
    arms["speedup_min"] = arms["off"]["min_s"] / arms["on"]["min_s"]
    arms["gain_pct_median"] = 100 * (arms["speedup_median"] - 1)
    arms["gain_pct_min"] = 100 * (arms["speedup_min"] - 1)
    return arms


def expected_saving(gains: dict, limit: int) -> dict:
    """What the second sweep's per-layer savings predict for the whole throughput workload:
    its decode steps (all prompts run in the first few steps; request ``i`` then decodes
    ``output_len - 1`` more tokens) whose batch, padded to its CUDA graph's size, is fused,
    times the saving at that size and the model's layers."""
    from minivllm.benchmarks.workloads import throughput_workload
    from minivllm.worker.cuda_graph import default_capture_sizes

    lens = throughput_workload().output_lens
    sizes = default_capture_sizes(256)
    steps = [sum(1 for n in lens if n - 1 >= k) for k in range(1, max(lens))]
    fused = [next(c for c in sizes if c >= b) for b in steps if 2 < b <= limit]
    saved_us = sum(LAYERS * gains[str(c)]["gain_us"] for c in fused)
    return {"decode_steps": len(steps), "fused_steps": len(fused), "saved_s": saved_us / 1e6}


LAYERS = 28  # Qwen3-0.6B's decoder layers


def main() -> None:
    sweeps = {"1": sweep(HERE / "call1/kernel_gate_up.json"),
              "2": sweep(HERE / "call2/kernel_gate_up.json")}  # fmt: skip
    limit = int((HERE / "call2/limit.txt").read_text())
    activation = [row["activation_us"] for s in sweeps.values() for row in s.values()]
    summary = {
        "sweep": sweeps,
        "limit": limit,
        "activation_launch_us": {"min": min(activation), "max": max(activation)},
        "max_rel_err": max(row["max_rel_err"] for s in sweeps.values() for row in s.values()),
        "ab": {},
    }
    for key, rows in sweeps.items():
        wins = [row["gain_us"] for m, row in rows.items() if int(m) <= limit]
        losses = [row["gain_us"] for m, row in rows.items() if int(m) > limit]
        summary[f"sweep_{key}_gain_up_to_limit_us"] = {"min": min(wins), "max": max(wins)}
        summary[f"sweep_{key}_loss_above_limit_us"] = {"min": -max(losses), "max": -min(losses)}
    summary["whole_workload"] = expected_saving(sweeps["2"], limit)
    for call, tag, off, on in AB:
        if all((HERE / call / f"{n}.json").exists() for n in off + on):
            summary["ab"].setdefault(call, {})[tag] = ab(call, off, on)
    for arms in summary["ab"].values():
        if "b16" in arms:  # 1,024 output tokens: one prompt step, then 1,023 decode steps
            b16 = arms["b16"]
            b16["saved_us_per_step"] = (b16["off"]["median_s"] - b16["on"]["median_s"]) / 1023 * 1e6
            b16["predicted_us_per_step"] = LAYERS * sweeps["2"]["16"]["gain_us"]
    cold = HERE / "call3/throughput_cold.json"
    if cold.exists():
        c = json.loads(cold.read_text())["cold"]
        summary["cold"] = {
            "first_pct": 100 * c["first_run"]["fraction_of_roofline"],
            "second_pct": 100 * c["second_run"]["fraction_of_roofline"],
            "first_over_second_pct":
                100 * (c["first_run"]["seconds"] / c["second_run"]["seconds"] - 1),
            "first_kernels_compiled": c["first_run"]["kernels_compiled"],
        }  # fmt: skip
        # The attention kernels' compile time at start-up, as each cold run's log reports
        # it: the same kernels on both leases, so a measure of the host's compile speed.
        for key, log in (("attention_compile_s", cold.with_suffix(".log")),
                         ("attention_compile_s_perf18", PERF18_COLD_LOG)):
            m = re.search(r"compiled \d+ attention kernel variants in ([\d.]+) s", log.read_text())
            summary["cold"][key] = float(m.group(1))
        summary["cold"]["startup_s"] = json.loads(cold.read_text())["cold"]["startup_s"]
        summary["cold"]["startup_s_perf18"] = json.loads(
            PERF18_COLD_LOG.with_suffix(".json").read_text())["cold"]["startup_s"]
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
