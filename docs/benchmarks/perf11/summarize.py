"""Summary figures of the thirteenth round, computed from the raw JSON beside it (the
Benchmarks chapter reads them from summary.json; nothing here is typed by hand):

    python3 docs/benchmarks/perf11/summarize.py docs/benchmarks/perf11
"""

import json
import sys
from pathlib import Path

here = Path(sys.argv[1])


def load(name):
    return json.loads((here / name).read_text())


out = {"command": " ".join(["python3", *sys.argv]), "first_use": {}, "gemm": {}, "small_kernels": {}}

# A cold process's three runs, with and without the start-up extras (first_use.py).
for mode in ("plain", "warm"):
    d = load(f"first_use_{mode}.json")
    runs = {}
    for run in ("first", "second", "third"):
        r = d[run]
        runs[run] = {
            "seconds": r["seconds"],
            "minflt": r["minflt"],
            "device_allocs": r["device_allocs"],
            "host_allocs": r["host_allocs"],
            "prompt_steps_ms": sum(p["total"] for p in r["prompt_steps"]),
            "decode_steps_ms": r["decode_ms"]["total"],
            "decode_forward_ms": r["decode_ms"]["forward"],
        }
    out["first_use"][mode] = {"startup_s": d["startup_s"], **runs}

# Decode GEMMs: every layer shape, batch size, weight layout and BLAS library.
rows = load("gemm_layout.json")["rows"]
base = {(r["layer"], r["m"]): r["linear_NK"] for r in rows if r["lib"] == "cublas"}
spread = [abs(r[v] / base[(r["layer"], r["m"])] - 1) for r in rows for v in ("linear_NK", "mm_KN")]
# Left apart: the rows the engine never sends to cuBLAS. A layer that reduces (o_proj,
# down_proj) runs the skinny Triton kernel up to DEFAULT_GEMV_MAX_M = 8 rows
# (model_executor/layers/utils.py); there cuBLAS on the stored layout is the slow one.
apart = {(la, m) for la in ("o_proj", "down_proj") for m in (1, 2, 4, 8)}
spread_rest = [
    abs(r[v] / base[(r["layer"], r["m"])] - 1)
    for r in rows if (r["layer"], r["m"]) not in apart for v in ("linear_NK", "mm_KN")
]  # fmt: skip
# Each variant over the step timeline's run: every decode step's four layer GEMMs (28
# layers) and its LM head at the step's batch padded to the captured size, as graphs run.
st_steps = load("step_timeline_2.json")["step_timeline"]["per_step"]
sizes = sorted({r["m"] for r in rows})
padded = [
    next(m for m in sizes if m >= n)
    for n, mixed in zip(st_steps["num_reqs"], st_steps["mixed"]) if not mixed
]  # fmt: skip
by_variant = {}
for lib in ("cublas", "cublaslt"):
    for v in ("linear_NK", "mm_KN"):
        t = {(r["layer"], r["m"]): r[v] for r in rows if r["lib"] == lib}
        total = 0.0
        for m in padded:
            total += 28 * sum(t[(la, m)] for la in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
            total += t[("lm_head", m)]
        by_variant[f"{lib}_{v}_run_s"] = total * 1e-6
out["gemm"]["run_decode_steps"] = len(padded)
bandwidth = load("step_timeline_2.json")["copy_bandwidth_bytes_per_s"]
layer_bytes = sum(2 * r["n"] * r["k"] for r in rows if r["m"] == 1 and r["lib"] == "cublas"
                  and r["layer"] != "lm_head")  # fmt: skip
out["gemm"]["layer_weights_at_copy_bandwidth_us"] = layer_bytes / bandwidth * 1e6
out["gemm"].update(by_variant)
layers = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
for layer in layers:
    times = {m: base[(layer, m)] for m in (1, 16, 64, 128, 256)}
    out["gemm"][layer] = {f"m{m}_us": t for m, t in times.items()}
out["gemm"]["layer_sum_m16_us"] = sum(base[(la, 16)] for la in layers[:4])
out["gemm"]["layer_sum_m256_us"] = sum(base[(la, 256)] for la in layers[:4])
out["gemm"]["max_variant_difference_pct"] = 100 * max(spread_rest)
out["gemm"]["max_variant_difference_apart_pct"] = 100 * max(spread)
out["gemm"]["o_proj_m4_kn_us"] = next(
    r["mm_KN"] for r in rows if r["layer"] == "o_proj" and r["m"] == 4 and r["lib"] == "cublas"
)
out["gemm"]["o_proj_m4_nk_us"] = base[("o_proj", 4)]

# Small kernels: the configuration in use against the best of the sweep, per batch size.
sk = load("small_kernels.json")["rows"]
worst_gap = 0.0
for kernel in ("fused_add_rms_norm", "silu_and_mul", "qk_norm_rope_kv_cache"):
    entry = {}
    for m in (16, 256):
        cands = [r for r in sk if r["kernel"] == kernel and r["m"] == m]
        cur = next(r["us"] for r in cands if r["current"])
        best = min(r["us"] for r in cands)
        entry[f"m{m}_current_us"], entry[f"m{m}_best_us"] = cur, best
    for m in (16, 64, 128, 256):
        cands = [r for r in sk if r["kernel"] == kernel and r["m"] == m]
        cur = next(r["us"] for r in cands if r["current"])
        worst_gap = max(worst_gap, cur / min(r["us"] for r in cands) - 1)
    out["small_kernels"][kernel] = entry
out["small_kernels"]["max_gap_to_best_pct"] = 100 * worst_gap
out["small_kernels"]["trivial_kernel_us"] = next(r["us"] for r in sk if r["kernel"] == "add_one_element")

# Where a run's time goes beside the roofline: the step timeline's run at the round's
# final code, with the fit that code wrote (step_timeline_2.json).
st = load("step_timeline_2.json")
fit = st["step_timeline"]["decode_cost"]
totals, tl = fit["totals_s"], st["step_timeline"]
mixed = next(k for k in tl["kinds"] if k["kind"] == "mixed")
out["gap"] = {
    "run_s": tl["totals"]["wall_s"],
    "roofline_s": st["roofline"]["min_seconds"],
    "gap_s": tl["totals"]["wall_s"] - st["roofline"]["min_seconds"],
    "fixed_over_weights_s": totals["fixed_over_weights"],
    "per_sequence_s": totals["per_sequence"],
    "kv_minus_copy_s": totals["kv"] - totals["kv_at_copy_bandwidth"],
    "unexplained_s": totals["unexplained"],
    "mixed_steps_gpu_s": mixed["gpu_s"],
    "gpu_idle_between_steps_s": tl["totals"]["gap_s"],
    "decode_gpu_s": totals["gpu"],
}
# The steps of 133 to 144 sequences against those of 126 to 131: the same captured graph
# (144 sequences) replays them all, yet they sit on either side of the fit.
per_step, roof = tl["per_step"], st["roofline"]
def mean_residual_ms(low, high, per_step=per_step, fit=fit):
    res = []
    for n, m, c, g in zip(per_step["num_reqs"], per_step["mixed"], per_step["context_tokens"],
                          per_step["gpu_s"]):  # fmt: skip
        if m or not low <= n <= high:
            continue
        kv = c * roof["kv_bytes_per_token"] / roof["copy_bandwidth"]
        pred = fit["fixed_ms_per_step"] / 1e3 + fit["per_sequence_us"] / 1e6 * n
        res.append(g - pred - fit["kv_time_factor"] * kv)
    return 1e3 * sum(res) / len(res)
first_run = load("step_timeline.json")["step_timeline"]
lm = {r["m"]: r["lm_head_us"] for r in load("lm_head_rows.json")["rows"]}
out["batch_132"] = {
    "residual_133_144_ms": mean_residual_ms(133, 144),
    "residual_126_131_ms": mean_residual_ms(126, 131),
    "first_lease_residual_133_144_ms": mean_residual_ms(
        133, 144, first_run["per_step"], load("decode_cost.json")["fit"]),
    "first_lease_residual_126_131_ms": mean_residual_ms(
        126, 131, first_run["per_step"], load("decode_cost.json")["fit"]),
    "lm_head_131_us": lm[131],
    "lm_head_133_us": lm[133],
}
(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
