"""Draw a step timeline's decode steps beside their cost fit and the roofline, as one PNG.

``python -m minivllm.benchmarks.step_cost_plot RESULT.json OUT.png`` reads what
``bench throughput --step-timeline`` wrote (the per-step columns, ``decode_cost`` and the
roofline), so the picture can be redrawn without a GPU. Left: every decode step's GPU time
against the K/V it reads, with the roofline's charge for such a step (weights plus K/V at
the copy bandwidth) and the fit's fixed cost plus its K/V term; the vertical distance
between the two lines is what no batch size removes. Right: the run's decode time split the
fit's way, beside the roofline's two terms.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def plot_decode_cost(result: dict[str, Any], out: Path) -> None:
    """Draw ``result`` (a ``bench throughput --step-timeline`` JSON, loaded) into ``out``.

    Raises ValueError when the result has no fitted ``step_timeline.decode_cost`` (a CPU
    run, or a step timeline from before the fit existed).
    """
    timeline = result.get("step_timeline", {})
    cost = timeline.get("decode_cost")
    if cost is None or "skipped" in cost:
        why = "missing" if cost is None else f"skipped: {cost['skipped']}"
        raise ValueError(f"step_timeline.decode_cost is {why}; nothing to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roof, steps = result["roofline"], timeline["per_step"]
    bandwidth = roof["copy_bandwidth"]
    decode = [i for i, mixed in enumerate(steps["mixed"]) if not mixed]
    kv_gb = [steps["context_tokens"][i] * roof["kv_bytes_per_token"] / 1e9 for i in decode]
    gpu_ms = [steps["gpu_s"][i] * 1e3 for i in decode]
    batch = [steps["num_reqs"][i] for i in decode]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), width_ratios=[1.6, 1])

    points = left.scatter(kv_gb, gpu_ms, c=batch, s=6, cmap="viridis")
    fig.colorbar(points, ax=left, label="sequences in the step")
    span = [0.0, max(kv_gb)]
    weights_ms = roof["weight_bytes"] / bandwidth * 1e3
    left.plot(span, [weights_ms + gb * 1e9 / bandwidth * 1e3 for gb in span], "k--", lw=1,
              label="roofline: weights + K/V at the copy bandwidth")  # fmt: skip
    fixed, factor = cost["fixed_ms_per_step"], cost["kv_time_factor"]
    left.plot(span, [fixed + factor * gb * 1e9 / bandwidth * 1e3 for gb in span], "r-", lw=1,
              label=f"fit: {fixed:.2f} ms fixed + {factor:.2f} x K/V time")  # fmt: skip
    left.set_xlabel("K/V read by the step (GB)")
    left.set_ylabel("GPU time of the step (ms)")
    left.set_title(f"{len(decode)} decode steps")
    left.legend(fontsize=8, loc="upper left")

    totals = cost["totals_s"]
    measured = [
        ("fixed", totals["fixed"], "#ef6c00"),
        ("per sequence", totals["per_sequence"], "#ffb74d"),
        ("K/V", totals["kv"], "#3f51b5"),
    ]
    ceiling = [
        ("weights", totals["weights_at_copy_bandwidth"], "#bbbbbb"),
        ("K/V", totals["kv_at_copy_bandwidth"], "#7986cb"),
    ]
    tallest = max(sum(p[1] for p in measured), sum(p[1] for p in ceiling))
    for x, parts in ((0, measured), (1, ceiling)):
        bottom = 0.0
        for label, seconds, color in parts:
            right.bar(x, seconds, bottom=bottom, color=color, width=0.6)
            # A thin slice gets its label beside the bar rather than on it.
            thin = seconds < 0.06 * tallest
            right.text(x + (0.32 if thin else 0), bottom + seconds / 2,
                       f"{label} {seconds:.2f} s" if thin else f"{label}\n{seconds:.2f} s",
                       ha="left" if thin else "center", va="center", fontsize=8)  # fmt: skip
            bottom += seconds
    right.set_xticks([0, 1], ["decode steps, fitted", "roofline's charge"])
    right.set_ylabel("seconds over the run")
    right.set_title("where the decode time goes")
    # Where it was measured travels with the picture, as in engine_plot.
    fig.suptitle(f"{result.get('gpu')}, torch {result.get('torch')}, triton {result.get('triton')}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Command line: the result JSON in, the PNG out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="JSON written by bench throughput --step-timeline")
    parser.add_argument("output", help="PNG to write")
    args = parser.parse_args(argv)
    plot_decode_cost(json.loads(Path(args.result).read_text()), Path(args.output))


if __name__ == "__main__":
    main()
