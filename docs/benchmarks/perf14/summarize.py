"""Derive the sixteenth round's figures from the raw files beside this script.
Usage: python3 docs/benchmarks/perf14/summarize.py docs/benchmarks/perf14 (writes summary.json)."""
import json
import re
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1])
LAYERS = 28  # the Qwen3-0.6B shape's decoder layers: one attention launch each per step


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def memory_run(path: Path) -> dict:
    """One `bench throughput` run (through release.py or graph_budget.py): the device
    memory after the runs against the budget, the graphs' memory as the profile measured
    it (None before the profile counted it) and as the capture did, the KV pool, the
    throughput and the start-up."""
    m = load(path)["minivllm"]
    log = path.with_suffix(".log").read_text()
    profile = re.search(r"memory profile: .*", log).group(0)
    budget = float(re.search(r"budget ([\d.]+) GiB", profile).group(1))
    profiled = re.search(r"CUDA graphs ([\d.]+) GiB", profile)
    used = m["device_memory"]["used_gib"]
    return {
        "variant": path.stem.split("_", 2)[2],
        "used_gib": used, "budget_gib": budget, "used_over_budget_gib": used - budget,
        "torch_reserved_gib": m["device_memory"]["torch_reserved_gib"],
        "graphs_captured_gib": m["cuda_graph_gib"],
        "graphs_profiled_gib": float(profiled.group(1)) if profiled else None,
        "kv_blocks": m["num_kv_blocks"], "peak_blocks_in_use": m["peak_blocks_in_use"],
        "greedy_tok_s": m["output_tokens_per_s"], "sampled_tok_s": m["sampled"]["output_tokens_per_s"],
        "fraction_of_roofline": m["fraction_of_roofline"], "startup_s": m["startup_s"],
    }


def ab(call: str, variants: tuple[str, str]) -> dict:
    """Four alternating processes of one call: each run, each variant's means, and the
    second variant minus the first."""
    runs = {p.stem: memory_run(p) for p in sorted((here / call).glob("tp_*.json"))}
    mean = {}
    for v in variants:
        rows = [r for r in runs.values() if r["variant"] == v]
        mean[v] = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]
                   if isinstance(rows[0][k], (int, float)) and not isinstance(rows[0][k], bool)}
    a, b = variants
    diff = {k: mean[b][k] - mean[a][k] for k in mean[a] if k in mean[b]}
    return {"runs": runs, "mean": mean, f"{b}_minus_{a}": diff}


def real_step() -> dict:
    """A real mixed step's attention (layer 0), four ways; the graph's padded single
    launch against the two launches of the eager split, both replayed from a graph,
    and that per layer summed over the model's layers."""
    r = load(here / "call2/real_step_attn.json")
    per_layer = r["padded_single_graph_us"] - r["eager_split_graph_us"]
    perf13 = load(here.parent / "perf13/summary.json")["ab"]
    return {**r, "single_minus_split_in_graph_us": per_layer,
            "single_minus_split_in_graph_per_step_ms": per_layer * LAYERS / 1e3,
            "perf13_attention_graphs_minus_eager_ms": perf13["graphs_minus_eager"]["prompt_attention_ms"],
            "perf13_prompt_steps": perf13["mean"]["graphs"]["prompt_steps"]}


def cold(call: str) -> dict:
    """`bench throughput --cold` at this round's code, in call ``call``."""
    d = load(here / call / "throughput_cold.json")
    c, w = d["cold"], d["warm"]
    first, second = c["first_run"], c["second_run"]
    log = (here / call / "throughput_cold.log").read_text()
    profile = re.search(r"memory profile: .*", log).group(0)
    return {
        "first_fraction": first["fraction_of_roofline"], "first_tok_s": first["output_tokens_per_s"],
        "second_fraction": second["fraction_of_roofline"], "second_tok_s": second["output_tokens_per_s"],
        "first_over_second": d["first_over_second"],
        "roofline_tok_s": d["roofline"]["max_output_tokens_per_s"],
        "kernels_compiled": sum(c[k]["kernels_compiled"] for k in ("first_run", "second_run", "greedy_run")),
        "first_run_device_allocs": first["allocator"]["num_device_alloc"],
        "host_busy_s": first["host_busy_s"], "second_host_busy_s": second["host_busy_s"],
        "warm_first_fraction": w["first_run"]["fraction_of_roofline"],
        "warm_host_busy_s": w["first_run"]["host_busy_s"],
        "startup_s": c["startup_s"], "warm_startup_s": w["startup_s"],
        "non_torch_gib": float(re.search(r"non-torch ([\d.]+) GiB", profile).group(1)),
        "graphs_profiled_gib": float(re.search(r"CUDA graphs ([\d.]+) GiB", profile).group(1)),
        "kv_blocks": int(re.search(r"= (\d+) blocks", profile).group(1)),
    }


def test_counts(path: Path) -> dict:
    tail = path.read_text().strip().splitlines()[-2]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped)", tail)}


summary = {
    "release": ab("call1", ("keep", "release")),
    "graph_budget": ab("call2", ("uncounted", "counted")),
    "real_step": real_step(),
    "cold": cold("call3"),
    "cold_2": cold("call4"),
    "gpu_tests": {"call1": test_counts(here / "call1/gpu_tests.log"),
                  "call2": test_counts(here / "call2/gpu_tests.log"),
                  "call3": test_counts(here / "call3/gpu_tests.log")},
}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({k: v for k, v in summary.items() if k not in ("release", "graph_budget")}, indent=1))
print(json.dumps({k: summary[k]["mean"] for k in ("release", "graph_budget")}, indent=1))
