"""The eighteenth round's figures, computed from the raw results of the three calls:
``python3 docs/benchmarks/perf16/summarize.py`` rewrites summary.json beside it."""

import json
import re
from pathlib import Path
from statistics import mean

HERE = Path(__file__).parent


def load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def cold(name: str) -> dict:
    """A ``bench throughput --cold`` result, reduced to what the chapter shows."""
    raw = load(name)
    c, w = raw["cold"], raw["warm"]
    return {
        "first_fraction": c["first_run"]["fraction_of_roofline"],
        "second_fraction": c["second_run"]["fraction_of_roofline"],
        "first_tok_s": c["first_run"]["output_tokens_per_s"],
        "second_tok_s": c["second_run"]["output_tokens_per_s"],
        "first_over_second": raw["first_over_second"],
        "first_compiled": c["first_run"]["kernels_compiled"],
        "second_compiled": c["second_run"]["kernels_compiled"],
        "first_host_busy_s": c["first_run"]["host_busy_s"],
        "first_seconds": c["first_run"]["seconds"],
        "roofline_tok_s": raw["roofline"]["max_output_tokens_per_s"],
        "warm_second_fraction": w["second_run"]["fraction_of_roofline"],
        "cold_startup_s": c["startup_s"],
        "warm_startup_s": w["startup_s"],
    }


def side_by_side(call: str) -> dict:
    """Alternating processes of fold_ab.py: each process's timed runs (its first run is a
    warm-up), the mean per side and the fold's time over the separate kernel's."""
    processes = []
    for path in sorted((HERE / call).glob("ab_*_*.json")):
        raw = json.loads(path.read_text())
        processes.append({"file": path.name, "side": raw["side"], "timed_s": raw["seconds"][1:]})
    means = {
        side: mean(s for p in processes if p["side"] == side for s in p["timed_s"])
        for side in ("fold", "nofold")
    }
    tokens = load(f"{call}/{processes[0]['file']}")["output_tokens"]
    return {
        "processes": processes,
        "mean_s": means,
        "fold_over_nofold": means["fold"] / means["nofold"],
        "tok_s": {side: tokens / s for side, s in means.items()},
    }


def registers() -> dict:
    """kernel_inspect on the GPU's Triton (call 3): registers per thread of the ordered
    decode variant, without the prologue, with it (own key first), and the first placement
    (own key after the tiles), per configuration (tiles x segments)."""
    out = {}
    for key, name in (("plain", "inspectordered"), ("own_key_first", "inspectqk-norm-rope"),
                      ("own_key_after", "inspect_after_loop")):
        for row in load(f"call3/{name}.json")["rows"]:
            c = row["config"]
            out.setdefault(f"seg{c['num_segments']}", {})[key] = row["registers"]
    return out


def passed(log: str) -> int:
    """The number of passed tests on a pytest log's summary line (0 when it has none)."""
    found = re.findall(r"(\d+) passed", (HERE / log).read_text())
    return int(found[-1]) if found else 0


def main() -> None:
    summary = {
        "head_cold": cold("call1/throughput_cold.json"),
        "after_loop": side_by_side("call2"),
        "own_key_first": side_by_side("call3"),
        "registers": registers(),
        "fold_cold": cold("call3/throughput_cold.json"),
        "tests_passed": {
            name: passed(name)
            for name in (
                "call2/gpu_tests_fold.log", "call2/gpu_tests.log", "call3/gpu_tests_fold.log"
            )
        },
    }
    # What the fold added to a run, and per step and layer (28 layers; the run's steps,
    # nearly all of them decode steps, from the cold run's step comparison).
    steps = load("call3/throughput_cold.json")["cold"]["first_vs_second_steps"]["steps"][0]
    for key in ("after_loop", "own_key_first"):
        row = summary[key]
        row["extra_s"] = row["mean_s"]["fold"] - row["mean_s"]["nofold"]
        row["extra_us_per_layer_step"] = row["extra_s"] / steps / 28 * 1e6
    summary["steps_per_run"] = steps
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
