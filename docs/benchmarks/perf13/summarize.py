"""Derive the fifteenth round's figures from the raw files beside this script.
Usage: python3 docs/benchmarks/perf13/summarize.py docs/benchmarks/perf13 (writes summary.json)."""
import ast
import json
import math
import re
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1])
LAYERS = 28


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def run_figures(st_path: Path, side_path: Path) -> dict:
    """One `bench throughput --step-timeline` run: its throughput, its prompt (mixed)
    steps' host queuing time, GPU time and idle after, their kernels by class (profiled
    pass), and the engine's start-up time and device memory (side JSON)."""
    d, side = load(st_path), load(side_path)
    st = d["step_timeline"]
    ps = st["per_step"]
    idx = [i for i, m in enumerate(ps["mixed"]) if m]
    mean = lambda key: statistics.fmean(ps[key][i] or 0.0 for i in idx) * 1e3  # noqa: E731
    mixed = st["kernels"]["by_step"]["by_kind"]["mixed"]
    per_step = {c: s / mixed["steps"] * 1e3 for c, s in mixed["classes_s"].items()}
    log = (st_path.with_suffix(".log")).read_text()
    budget_gib = float(re.search(r"budget ([\d.]+) GiB", log).group(1))
    kv_blocks = int(re.search(r"KV cache: (\d+) blocks", log).group(1))
    tok_s = float(re.search(r"minivllm: (\d+) output tok/s", log).group(1))
    roofline = float(re.search(r"of the (\d+) tok/s roofline", log).group(1))
    return {
        "output_tok_s": tok_s, "fraction_of_roofline": tok_s / roofline,
        "timeline_wall_s": st["totals"]["wall_s"],
        "prompt_steps": len(idx),
        "prompt_execute_ms": mean("execute_s"), "prompt_gpu_ms": mean("gpu_s"),
        "prompt_gap_after_ms": mean("gap_s"),
        "prompt_gpu_plus_gap_s": sum(ps["gpu_s"][i] + (ps["gap_s"][i] or 0.0) for i in idx),
        "prompt_attention_ms": per_step["attention"], "prompt_gemm_ms": per_step["gemm"],
        "prompt_attention_launches": next(
            k["calls"] for k in mixed["top_kernels"] if k["name"] == "kernel_unified_attention"
        ),
        "startup_s": side["startup_s"], "device_used_gib": side["device_used_gib"],
        "kv_blocks": kv_blocks, "used_over_budget_gib": side["device_used_gib"] - budget_gib,
        "prefill_graphs": len(side["prefill_sizes"]), "graphs": side["num_graphs"],
    }


def ab(call: str, names: list[str]) -> dict:
    runs = {n: run_figures(here / call / f"st_{n}.json", here / call / f"side_{n}.json")
            for n in names}
    eager = [r for n, r in runs.items() if n.endswith("2048")]
    graphs = [r for n, r in runs.items() if not n.endswith("2048")]
    means = {}
    for label, rs in (("eager", eager), ("graphs", graphs)):
        means[label] = {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
    diff = {k: means["graphs"][k] - means["eager"][k] for k in means["eager"]}
    # Start-up: the first run of a call compiles on a cold Triton cache and the second is
    # the first to read that cache, so the warm comparison is the last pair (runs 3 and 4).
    diff["warm_startup_s"] = runs[names[3]]["startup_s"] - runs[names[2]]["startup_s"]
    return {"runs": runs, "mean": means, "graphs_minus_eager": diff}


out: dict = {
    "ab": ab("call1", ["1_2048", "2_16384", "3_2048", "4_16384"]),
    "ab_split": ab("call2_split", ["1_2048", "2_budget", "3_2048", "4_budget"]),
}
# The slowed process of the second call (its eager run 1) against that call's graph runs:
# what the nine prompt steps cost with the GPU's idle time after each.
split = out["ab_split"]["runs"]
slow = split["1_2048"]
out["slowed_eager"] = {
    "execute_ms": slow["prompt_execute_ms"], "gpu_ms": slow["prompt_gpu_ms"],
    "gap_after_ms": slow["prompt_gap_after_ms"],
    "over_graphs_s": slow["prompt_gpu_plus_gap_s"] - statistics.fmean(
        split[n]["prompt_gpu_plus_gap_s"] for n in ("2_budget", "4_budget")),
}

cold = load(here / "call4" / "throughput_cold.json")
first, second = cold["cold"]["first_run"], cold["cold"]["second_run"]
out["cold"] = {
    "first_fraction": first["fraction_of_roofline"], "first_tok_s": first["output_tokens_per_s"],
    "second_fraction": second["fraction_of_roofline"],
    "first_over_second": cold["first_over_second"], "kernels_compiled": first["kernels_compiled"],
    "startup_s": cold["cold"]["startup_s"], "warm_startup_s": cold["warm"]["startup_s"],
    "host_busy_s": first["host_busy_s"],
}

out["pad_seqs"] = load(here / "call4" / "pad_seqs.json")
p = out["pad_seqs"]
p["eager_split_us"] = p["eager_decode_us"] + p["eager_prefill_us"]

# The decode graphs' attention variant (SEQ_ORDER, one segment) and its residency per SM.
occ = load(here / "call1" / "occupancy.json")
for v in occ["variants"]:
    consts = [ast.literal_eval(c) for c in re.findall(r"\('constexpr', ([^)]*)\)", v["key"])]
    # NUM_HEADS, GROUP, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_M, BLOCK_Q, TILE_N,
    # NUM_SEGMENTS, FUSED_REDUCE, NEW_KV, SEQ_ORDER, ... (the kernel's constexprs, in order)
    block_m, tile_n, segments, seq_order = consts[7], consts[9], consts[10], consts[13]
    if seq_order is True and segments == 1 and block_m == 16:
        resident = v["resident_per_sm"]
        slots = occ["sms"] * resident
        out["decode_occupancy"] = {
            "block_m": block_m, "tile_n": tile_n, "num_warps": v["num_warps"],
            "num_stages": v["num_stages"], "registers": v["n_regs"], "shared_bytes": v["shared"],
            "resident_per_sm": resident, "limits": v["limits"], "sms": occ["sms"],
            "slots": slots, "kv_heads": 8,
            "waves_at_132": math.ceil(132 * 8 / slots), "waves_at_133": math.ceil(133 * 8 / slots),
            "programs_in_last_wave_at_133": 133 * 8 - slots * (math.ceil(133 * 8 / slots) - 1),
        }
        break

log = (here / "call4" / "gpu_tests.log").read_text()
m = re.search(r"(\d+) failed, (\d+) passed", log)
out["gpu_tests"] = {"failed": int(m.group(1)), "passed": int(m.group(2))}

(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({k: v for k, v in out.items() if k not in ("ab", "ab_split")}, indent=1))
print(json.dumps(out["ab"]["graphs_minus_eager"], indent=1))
