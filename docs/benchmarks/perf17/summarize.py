"""The nineteenth round's figures, computed from the raw results of the four calls:
``python3 docs/benchmarks/perf17/summarize.py`` rewrites summary.json beside it."""

import json
import re
from pathlib import Path
from statistics import mean

HERE = Path(__file__).parent
# The workload's roofline as the eighteenth round's run measured it (the same code and
# workload; the roofline's copy bandwidth comes from that run).
ROOFLINE = "../perf16/call1/throughput_cold.json"


def load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def dual() -> dict:
    """dual.py (call 1): a decode graph as one batch, as two halves on two streams, and as
    two halves on one stream; ms per replay, medians of four turns."""
    sizes = load("call1/dual.json")["sizes"]
    rows = {
        "b{}_c{}".format(*key.split("/uniform_100_")): {
            "single_ms": r["single"],
            "dual_ms": r["dual"],
            "split_one_stream_ms": r["split_one_stream"],
            "dual_over_single": r["dual_over_single"],
            "split_over_single": r["serial_over_single"],
            # What running the halves side by side won back of what splitting cost.
            "overlap_recovered": (r["split_one_stream"] - r["dual"])
            / (r["split_one_stream"] - r["single"]),
        }
        for key, r in sizes.items()
    }
    ratios = [r["dual_over_single"] for r in rows.values()]
    split = [r["split_over_single"] for r in rows.values()]
    return {
        "rows": rows,
        "dual_over_single_min": min(ratios),
        "dual_over_single_max": max(ratios),
        "split_over_single_min": min(split),
        "split_over_single_max": max(split),
        "recovered_min": min(r["overlap_recovered"] for r in rows.values()),
        "recovered_max": max(r["overlap_recovered"] for r in rows.values()),
    }


def gc_runs() -> dict:
    """gc_ab.py (call 2): per variant, the timed runs (each process's first is a warm-up),
    their mean, the collector's time and collections per timed run."""
    out = {}
    for variant in ("auto", "off", "deferred"):
        timed = []
        for path in sorted((HERE / "call2").glob(f"gc_*_{variant}.json")):
            timed += json.loads(path.read_text())["runs"][1:]
        out[variant] = {
            "timed_s": [r["seconds"] for r in timed],
            "timed_runs": len(timed),
            "mean_s": mean(r["seconds"] for r in timed),
            "gc_ms_mean": mean(r["gc_ms"] for r in timed),
            "collections": [max(r["collections"][g] for r in timed) for g in range(3)],
            "full_collections": sum(r["collections"][2] for r in timed),
            "longest_pause_ms": max(max(r["max_ms_by_generation"]) for r in timed),
        }
    for variant in ("off", "deferred"):
        out[variant]["over_auto"] = out[variant]["mean_s"] / out["auto"]["mean_s"]
    return out


def pdl_ab() -> dict:
    """pdl_ab.py (call 3): the workload with MINIVLLM_ATTENTION_PDL=2 and =0."""
    processes = []
    for path in sorted((HERE / "call3").glob("ab_*_*.json")):
        raw = json.loads(path.read_text())
        processes.append({"file": path.name, "side": raw["side"], "timed_s": raw["seconds"][1:]})
    means = {
        side: mean(s for p in processes if p["side"] == side for s in p["timed_s"])
        for side in ("2", "0")
    }
    roofline = load(ROOFLINE)["roofline"]["max_output_tokens_per_s"]
    tokens = load(f"call3/{processes[0]['file']}")["output_tokens"]
    return {
        "processes": processes,
        "mean_s": {"on": means["2"], "off": means["0"]},
        "on_over_off": means["2"] / means["0"],
        "fraction_of_roofline": {
            "on": tokens / means["2"] / roofline, "off": tokens / means["0"] / roofline,
        },
    }


def pdl_micro() -> dict:
    """pdl.py (call 4): decode graphs in each mode, replayed on one ragged batch per size."""
    sizes = load("call4/pdl.json")["sizes"]
    rows = {
        f"b{n}": {
            "off_ms": r["ms_mode0"],
            "wait_first_ms": r["ms_mode1"],
            "metadata_first_ms": r["ms_mode2"],
            "saved_us_wait_first": r["saved_us_mode1"],
            "saved_us_metadata_first": r["saved_us_mode2"],
            "bitwise_equal": all(r["graph_equal_to_mode0"].values())
            and all(r["eager_equal_to_mode0"].values()),
        }
        for n, r in sizes.items()
    }
    saved = [r["saved_us_metadata_first"] for r in rows.values()]
    return {
        "rows": rows,
        "all_bitwise_equal": all(r["bitwise_equal"] for r in rows.values()),
        "most_saved_us": max(saved),
        "most_lost_us": -min(saved),
    }


def cold() -> dict:
    """``bench throughput --cold`` at this round's code (call 5), reduced to what the
    chapter shows."""
    raw = load("call5/throughput_cold.json")
    c, w = raw["cold"], raw["warm"]
    return {
        "first_fraction": c["first_run"]["fraction_of_roofline"],
        "second_fraction": c["second_run"]["fraction_of_roofline"],
        "first_tok_s": c["first_run"]["output_tokens_per_s"],
        "first_over_second": raw["first_over_second"],
        "first_compiled": c["first_run"]["kernels_compiled"],
        "first_host_busy_s": c["first_run"]["host_busy_s"],
        "first_seconds": c["first_run"]["seconds"],
        "roofline_tok_s": raw["roofline"]["max_output_tokens_per_s"],
        "cold_startup_s": c["startup_s"],
        "warm_startup_s": w["startup_s"],
    }


def passed(log: str) -> int:
    """Passed tests, counted from a pytest log's summary line."""
    found = re.findall(r"(\d+) passed", (HERE / log).read_text())
    return int(found[-1]) if found else 0


summary = {
    "dual": dual(),
    "gc": gc_runs(),
    "pdl_ab": pdl_ab(),
    "warm_up_tests_passed": {"graphs": passed("call2/warmup_test.log")},
    "head_cold": cold(),
}
if (HERE / "call4/pdl.json").exists():
    summary["pdl_micro"] = pdl_micro()
summary["graph_and_engine_tests_passed"] = passed("call6/gpu_tests.log")
if (HERE / "call4/warmup_test_eager.log").exists():
    summary["warm_up_tests_passed"]["eager"] = passed("call4/warmup_test_eager.log")
(HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
