"""The seventeenth round's figures, computed from the raw results of the three calls:
``python3 docs/benchmarks/perf15/summarize.py`` rewrites summary.json beside it."""

import json
import re
from pathlib import Path

HERE = Path(__file__).parent


def load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def parent_phases() -> dict:
    """Call 1 (the parent commit): exec_host.py's timers inside a decode step, per batch."""
    raw = load("call1/exec_host.json")
    out = {}
    for batch, row in raw["batches"].items():
        p = {k.strip(): v["ms_per_call"] for k, v in row["phases"].items()}
        out[batch] = {
            "wall_ms": row["wall_ms_per_step"],
            "gpu_ms": row["gpu_ms_median"],
            "execute_ms": p["execute_model_async"],
            "prepare_ms": p["prepare_inputs"],
            "copy_ms": p["copy_arrays_to_device"],
            "graph_ms": p["forward"],
            "lm_head_ms": p["compute_logits"],
            "sampler_ms": p["sampler"],
            "scan_ms": p["compute_prompt_logprobs"],
            "schedule_ms": p["schedule"],
            "update_ms": p["update_from_output"],
            "outputs_ms": p["process_outputs"],
        }
    return out


def host_busy(row: dict) -> dict:
    p = row["phases_ms_per_step"]
    return {
        "wall_ms": row["wall_ms_per_step"],
        "gpu_ms": row["gpu_ms_median"],
        "host_busy_ms": row["host_busy_ms_per_step"],
        "host_over_gpu": row["host_busy_ms_per_step"] / row["gpu_ms_median"],
        "schedule_ms": p["schedule"],
        "queue_ms": p["execute"],
        "prepare_ms": p["execute.prepare_inputs"],
        "graph_ms": p["execute.forward"],
        "lm_head_ms": p["execute.compute_logits"],
        "sampler_ms": p["execute.sampler"],
        "update_ms": p["process_step.update"],
        "outputs_ms": p["process_step"] - p["process_step.update"] - p["process_step.wait"]
        + p["outputs"],
    }


def ab() -> dict:
    """Call 2: the parent (old) and this commit (new), alternating processes."""
    runs = []
    for path in sorted((HERE / "call2").glob("ab_*_*.json")):
        raw = json.loads(path.read_text())
        runs.append({"process": path.stem, "side": raw["side"],
                     "rows": {str(r["batch"]): host_busy(r) for r in raw["rows"]}})
    mean = {}
    for side in ("old", "new"):
        mine = [r for r in runs if r["side"] == side]
        mean[side] = {
            b: {k: sum(r["rows"][b][k] for r in mine) / len(mine)
                for k in ("host_busy_ms", "queue_ms", "lm_head_ms", "wall_ms", "gpu_ms")}
            for b in mine[0]["rows"]
        }
    return {"runs": runs, "mean": mean}


def skip_qknorm() -> dict:
    """Call 4: the workload with the q/k-norm + rotary kernel (kept) and without it
    (skipped), alternating processes; timed runs are each process's second and third."""
    runs = []
    for path in sorted((HERE / "call4").glob("sq_*_*.json")):
        raw = json.loads(path.read_text())
        runs.append({"process": path.stem, "side": raw["side"], "timed_s": raw["seconds"][1:]})
    mean = {
        side: sum(sum(r["timed_s"]) for r in runs if r["side"] == side)
        / sum(len(r["timed_s"]) for r in runs if r["side"] == side)
        for side in ("kept", "skipped")
    }
    return {
        "runs": runs,
        "mean_s": mean,
        "saved_s": mean["kept"] - mean["skipped"],
        "saved_fraction": 1 - mean["skipped"] / mean["kept"],
    }


def main() -> None:
    engine = load("call2/host_engine.json")
    cold = load("call3/throughput_cold.json")
    parent = parent_phases()
    summary = {
        "parent_phases": parent,
        "scan_ms_at_256": parent["256"]["scan_ms"],
        # "('decode', 256)" -> "decode_256": a key the chapter's figure paths can name.
        "graph_launch": {
            "_".join(part.strip("()' ") for part in key.split(",")): value
            for key, value in load("call1/exec_host.json")["graph_launch"].items()
        },
        "gpu_tests_passed": int(
            re.search(r"(\d+) passed", (HERE / "call3/gpu_tests.log").read_text())[1]
        ),
        "host_engine": {str(r["batch"]): host_busy(r) for r in engine["rows"]},
        "ab": ab(),
        "skip_qknorm": skip_qknorm(),
        # Call 5: the one-launch sampler (bench host --engine at 1 and 256 requests), and
        # its GPU tests, cut off by the call's timeout inside the warm-up tests.
        "one_launch": {
            str(r["batch"]): host_busy(r) for r in load("call5/host_engine.json")["rows"]
        },
        "one_launch_tests_passed": (HERE / "call5/gpu_tests.log").read_text()
        .split("rc=")[0]
        .count("."),
        "cold": {
            "first_fraction": cold["cold"]["first_run"]["fraction_of_roofline"],
            "second_fraction": cold["cold"]["second_run"]["fraction_of_roofline"],
            "first_tok_s": cold["cold"]["first_run"]["output_tokens_per_s"],
            "first_over_second": cold["first_over_second"],
            "first_host_busy_s": cold["cold"]["first_run"]["host_busy_s"],
            "first_seconds": cold["cold"]["first_run"]["seconds"],
            "warm_second_fraction": cold["warm"]["second_run"]["fraction_of_roofline"],
            "roofline_tok_s": cold["roofline"]["max_output_tokens_per_s"],
            "startup_s": cold["cold"]["startup_s"],
            "warm_startup_s": cold["warm"]["startup_s"],
            "kernels_compiled": sum(
                cold[side][run]["kernels_compiled"]
                for side in ("cold", "warm")
                for run in ("first_run", "second_run", "greedy_run")
            ),
        },
    }
    (HERE / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
