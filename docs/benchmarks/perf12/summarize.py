"""Derive the fourteenth round's figures from the raw files beside this script.
Usage: python3 docs/benchmarks/perf12/summarize.py docs/benchmarks/perf12 (writes summary.json)."""
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

here = Path(sys.argv[1])
perf11 = here.parent / "perf11"
SLOW_MS = 25.0  # a process whose eager forward takes longer than this to queue is "slow"


def prompt_steps(path: Path) -> dict:
    """The prompt (mixed) steps of a step timeline: host time queuing them, their GPU time,
    and the GPU's idle time after them, as means in ms."""
    ps = json.loads(path.read_text())["step_timeline"]["per_step"]
    idx = [i for i, m in enumerate(ps["mixed"]) if m]
    mean = lambda key: statistics.fmean(ps[key][i] or 0.0 for i in idx) * 1e3  # noqa: E731
    return {"steps": len(idx), "execute_ms": mean("execute_s"), "gpu_ms": mean("gpu_s"),
            "gap_after_ms": mean("gap_s"),
            "gpu_plus_gap_s": sum(ps["gpu_s"][i] + (ps["gap_s"][i] or 0.0) for i in idx)}


runs = {"perf11_1": perf11 / "step_timeline.json", "perf11_2": perf11 / "step_timeline_2.json",
        "perf12_1": here / "step_timeline.json", "perf12_2": here / "step_timeline_2.json"}
out: dict = {"prompt_steps": {name: prompt_steps(p) for name, p in runs.items()}}
fastest = min(out["prompt_steps"].values(), key=lambda r: r["gpu_plus_gap_s"])
for r in out["prompt_steps"].values():
    r["over_fastest_s"] = r["gpu_plus_gap_s"] - fastest["gpu_plus_gap_s"]

by_step = json.loads((here / "step_timeline_2.json").read_text())["step_timeline"]["kernels"]["by_step"]
mixed = by_step["by_kind"]["mixed"]
per_prompt = {c: s / mixed["steps"] * 1e3 for c, s in mixed["classes_s"].items() if c != "idle"}
out["prompt_step_kernels_ms"] = {
    "gemm": per_prompt["gemm"], "attention": per_prompt["attention"],
    "other": sum(v for c, v in per_prompt.items() if c not in ("gemm", "attention")),
    "total": sum(per_prompt.values()),
}
fit = by_step["decode_cost_by_class"]
classes = fit["classes"]
small = ("norm", "rotary", "activation", "sampler", "copy", "other")
out["decode_fixed_ms"] = {
    "gemm": classes["gemm"]["fixed_ms_per_step"],
    "attention": classes["attention"]["fixed_ms_per_step"],
    "small_kernels": sum(classes[c]["fixed_ms_per_step"] for c in small if c in classes),
    "idle_profiled": classes["idle"]["fixed_ms_per_step"],
    "kernels": sum(v["fixed_ms_per_step"] for c, v in classes.items() if c != "idle"),
    "unprofiled_fit": json.loads((here / "step_timeline_2.json").read_text())["step_timeline"]["decode_cost"]["fixed_ms_per_step"],
    "attention_per_layer_us": classes["attention"]["fixed_ms_per_step"] / 28 * 1e3,
    "attention_kv_time_factor": classes["attention"]["kv_time_factor"],
    "outlier_steps": fit["outlier_steps"], "decode_steps": fit["decode_steps"],
}

# The thirteenth round's open question: which kernel class holds the step between 131 and
# 133 sequences? Each class's decode seconds per step, fitted by plain least squares on
# every decode step, and its mean residual on either side.
st2 = json.loads((here / "step_timeline_2.json").read_text())
ps, roof = st2["step_timeline"]["per_step"], st2["roofline"]
dec = [i for i, m in enumerate(ps["mixed"]) if not m]
x = np.array([[1.0, ps["num_reqs"][i], ps["context_tokens"][i] * roof["kv_bytes_per_token"]
               / roof["copy_bandwidth"]] for i in dec])
nreq = np.array([ps["num_reqs"][i] for i in dec])
below, above = (nreq >= 126) & (nreq <= 131), (nreq >= 133) & (nreq <= 144)
out["batch_132"] = {}
for cls, seconds in by_step["per_step"].items():
    y = np.array([seconds[i] for i in dec])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    res = y - x @ coef
    out["batch_132"][cls] = {"residual_126_131_us": float(res[below].mean() * 1e6),
                             "residual_133_144_us": float(res[above].mean() * 1e6)}
b = out["batch_132"]["attention"]
b["jump_us"] = b["residual_133_144_us"] - b["residual_126_131_us"]
b["jump_per_layer_us"] = b["jump_us"] / 28
b["steps_126_131"], b["steps_133_144"] = int(below.sum()), int(above.sum())

# Host time to queue one eager 16,384-token forward, per process: the median of its first
# eight timed calls (every process has those; --quick processes time sixteen more).
procs = []
for p in sorted((here / "host_modes").glob("*.json")):
    d = json.loads(p.read_text())
    procs.append({"process": p.stem, "code": "final", "host_ms": statistics.median(d["forward_host_ms"]),
                  "pinned": p.stem.startswith("pin"), "gpu_ms": d["forward_gpu_ms"]})
label, n_old = None, 0
for line in (here / "host_modes" / "ab_stdout.log").read_text().splitlines():
    if line in ("A", "B", "warm-up"):
        label = line
    m = re.match(r"forward host ms \[(.*?)\] total", line)
    if m and label in ("B", "warm-up"):
        ms = [float(x) for x in m.group(1).split(",")]
        procs.append({"process": f"ab_old_{n_old}", "code": "parent", "host_ms": statistics.median(ms),
                      "pinned": False, "gpu_ms": None})
        n_old += 1
for name, code in (("eager_host.json", "final"), ("eager_host_parent.json", "parent")):
    d = json.loads((here / name).read_text())
    procs.append({"process": name[:-5], "code": code, "host_ms": statistics.median(d["forward_host_ms"]),
                  "pinned": False, "gpu_ms": d["forward_gpu_ms"]})
fast = [p for p in procs if p["host_ms"] <= SLOW_MS]
slow = [p for p in procs if p["host_ms"] > SLOW_MS]


def spread(code: str) -> dict:
    ms = sorted(p["host_ms"] for p in fast if p["code"] == code)
    return {"processes": len(ms), "median": statistics.median(ms), "min": ms[0], "max": ms[-1]}


out["eager_forward"] = {
    "slow_above_ms": SLOW_MS, "processes": procs, "num_processes": len(procs),
    "num_slow": len(slow), "num_slow_final": sum(p["code"] == "final" for p in slow),
    "num_slow_pinned": sum(p["pinned"] for p in slow), "num_pinned": sum(p["pinned"] for p in procs),
    "fast": {c: spread(c) for c in ("final", "parent")},
    "slow_median_ms": statistics.median([p["host_ms"] for p in slow]),
    "gpu_ms": statistics.median([p["gpu_ms"] for p in procs if p["gpu_ms"]]),
}
e = out["eager_forward"]
e["slow_over_fast"] = e["slow_median_ms"] / e["fast"]["final"]["median"]
# The attention op's self CPU time per call under torch.profiler, one fast process of each code.
for key, name in (("final", "host_modes/ab_new_3_torchprof.txt"), ("parent", "eager_parent_torchprof.txt")):
    for line in (here / name).read_text().splitlines():
        if line.strip().startswith("minivllm::paged_attention"):
            e.setdefault("attention_op_profiled_us", {})[key] = float(line.split()[-2].removesuffix("us"))

cold = json.loads((here / "throughput_cold.json").read_text())
out["cold"] = {"first_fraction": cold["cold"]["first_run"]["fraction_of_roofline"],
               "second_fraction": cold["cold"]["second_run"]["fraction_of_roofline"],
               "first_tok_s": cold["cold"]["first_run"]["output_tokens_per_s"],
               "first_over_second": cold["first_over_second"], "startup_s": cold["cold"]["startup_s"],
               "warm_startup_s": cold["warm"]["startup_s"], "host_busy_s": cold["cold"]["first_run"]["host_busy_s"]}
(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({k: v for k, v in out.items() if k != "eager_forward"}, indent=1))
print({k: v for k, v in e.items() if k != "processes"})
