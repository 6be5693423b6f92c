"""The twenty-first round's summary.json, computed from the raw files beside it.

``python3 docs/benchmarks/perf19/summarize.py`` (from the repository root). Reads
call1/attn_probe.json (the workload's nine prompt steps, attention timed per layer),
call1/ncu_short.txt and call1/ncu_long.txt (Nsight Compute on one launch each), and the
twentieth round's cold run (perf18/call2/throughput_cold.json) for the length of a timed run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
NCU_FIELDS = {
    "duration_us": "Duration",
    "memory_throughput_pct": "Memory Throughput",
    "dram_throughput_pct": "DRAM Throughput",
    "l2_throughput_pct": "L2 Cache Throughput",
    "compute_throughput_pct": "Compute (SM) Throughput",
    "l2_hit_rate_pct": "L2 Hit Rate",
    "registers_per_thread": "Registers Per Thread",
    "block_limit_registers": "Block Limit Registers",
    "block_limit_shared_mem": "Block Limit Shared Mem",
    "theoretical_occupancy_pct": "Theoretical Occupancy",
    "achieved_occupancy_pct": "Achieved Occupancy",
    "warp_cycles_per_issued_instruction": "Warp Cycles Per Issued Instruction",
}


def ncu(path: Path) -> dict:
    """The first value of each field in an ``ncu`` text report (units dropped)."""
    text = path.read_text()
    out = {}
    for key, name in NCU_FIELDS.items():
        m = re.search(rf"^\s+{re.escape(name)}\s+(?:\S+\s+)?([\d,.]+)\s*$", text, re.M)
        out[key] = float(m.group(1).replace(",", "")) if m else None
    m = re.search(r"\((\d+), 1, 1\)x\((\d+), 1, 1\)", text)
    out["programs"], out["threads_per_program"] = int(m.group(1)), int(m.group(2))
    return out


def main() -> None:
    probe = json.loads((HERE / "call1/attn_probe.json").read_text())
    rows = probe["rows"]
    run = probe["per_run_ms"]
    cold = json.loads((HERE.parent / "perf18/call2/throughput_cold.json").read_text())
    run_s = cold["cold"]["first_run"]["seconds"]
    split_ms = run["prompts_ms"] + run["decodes_ms"]
    summary = {
        "steps": len(rows),
        "layers": 28,
        "per_run_ms": {**run, "split_ms": split_ms},
        "split_saves_ms": run["graph_single_ms"] - split_ms,
        "split_saves_pct_of_run": (run["graph_single_ms"] - split_ms) / (run_s * 1e3) * 100,
        "timed_run_s": run_s,
        "graph_attention_pct_of_run": run["graph_single_ms"] / (run_s * 1e3) * 100,
        "flash_over_ours": run["flash_prompts_ms"] / run["prompts_ms"],
        "prompts_tflops_min": min(r["prompts_tflops"] for r in rows),
        "prompts_tflops_max": max(r["prompts_tflops"] for r in rows),
        "flash_tflops_min": min(r["flash_tflops"] for r in rows),
        "flash_tflops_max": max(r["flash_tflops"] for r in rows),
        "alt_tiles_over_shipped_min": min(
            r[k] / r["prompts_ms"] for r in rows for k in r if k.startswith("prompts_ms_")
        ),
        "step3": {k: rows[3][k] for k in ("num_seqs", "num_decodes", "tokens")},
        "ncu": {name: ncu(HERE / f"call1/ncu_{name}.txt") for name in ("short", "long")},
    }
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
