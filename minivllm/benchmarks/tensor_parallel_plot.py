"""Draw ``minivllm bench tp``'s result as one PNG: throughput per tensor-parallel size, and
the top-2 margin at every first greedy divergence.

Reads only the result dictionary (the JSON the benchmark writes), so the picture can be
redrawn without a GPU: ``python -m minivllm.benchmarks.tensor_parallel_plot RESULT.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def plot_tp_results(result: dict[str, Any], out: Path) -> None:
    """Left: output tokens/s of TP=1, TP=N (and TP=N with synchronous steps, and the rank
    stand-in of ``--rank-standin``), with the speed-up target. Right: TP=1's top-2
    logprob gap at each first divergence of the equivalence run, against its position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp1, tpn = result["tp1"], result["tpn"]
    n = tpn["tensor_parallel_size"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4), width_ratios=[1, 1.3])
    names = ["TP=1", f"TP={n}"]
    values = [tp1["output_tokens_per_s"], tpn["output_tokens_per_s"]]
    colors = ["#888888", "#1f77b4"]
    if "tpn_nccl" in result:
        names[1] = f"TP={n}\nsymm. memory"
        names.append(f"TP={n}\nNCCL all-reduce")
        values.append(result["tpn_nccl"]["output_tokens_per_s"])
        colors.append("#ff7f0e")
    if "sync" in tpn:
        names.append(f"TP={n}\nsync steps")
        values.append(tpn["sync"]["output_tokens_per_s"])
        colors.append("#aec7e8")
    standin = result.get("rank_standin")
    if standin:  # its ratio to TP=1 is TP=N's ceiling from per-rank work alone
        names.append(f"one rank of\nTP={n} alone")
        values.append(standin["output_tokens_per_s"])
        colors.append("#2ca02c")
    bars = ax.bar(names, values, color=colors)
    for bar, value in zip(bars, values):
        ax.annotate(
            f"{value:,.0f}\n({value / values[0]:.2f}x)",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    target = result.get("target_tpn_over_tp1")
    if target:
        ax.axhline(target * values[0], color="#d62728", linestyle="--", linewidth=1)
        ax.annotate(
            f"target {target}x TP=1",
            (0.02, target * values[0]),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
            color="#d62728",
        )
    ax.set_ylim(0, max(values + [target * values[0] if target else 0]) * 1.25)
    ax.set_ylabel("output tokens/s")
    wl = result["workload"]
    ax.set_title(
        f"throughput workload ({wl['num_requests']} requests, "
        f"{wl['output_tokens']:,} output tokens)",
        fontsize=10,
    )

    eq = result["equivalence"]
    divergences = eq["divergences"]
    if divergences:
        bx.scatter(
            [d["position"] for d in divergences],
            [d["tp1_margin"] for d in divergences],
            color="#1f77b4",
            s=18,
        )
    bx.set_xlabel("position of the first divergent token")
    bx.set_ylabel("TP=1 top-2 logprob gap there")
    bx.set_title(
        f"greedy TP={n} vs TP=1: {eq['num_identical']}/{eq['num_prompts']} sequences "
        f"identical ({eq['max_tokens']} tokens)",
        fontsize=10,
    )
    bx.set_ylim(bottom=0)
    fig.suptitle(
        f"{result['model']}, {result.get('dtype', '')}; {result.get('gpu') or 'CPU'}", fontsize=10
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    """Redraw the PNG from a result JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="the JSON minivllm bench tp wrote")
    parser.add_argument("--output", default=None, help="PNG (default: beside the JSON)")
    args = parser.parse_args()
    path = Path(args.result)
    plot_tp_results(
        json.loads(path.read_text()), Path(args.output) if args.output else path.with_suffix(".png")
    )


if __name__ == "__main__":
    main()
