"""Draw a ``minivllm bench serve --request-rates ...`` sweep: time to first token and
inter-token latency (median and p99) against the request rate, as one PNG; with the JSON
of a ``--compare-offline`` run, also served against offline output tokens per second.

Reads the JSON files only, so the picture can be redrawn without a GPU::

    python -m minivllm.benchmarks.serve_plot docs/benchmarks/serve_sweep.json \
        --compare docs/benchmarks/serve.json --output docs/benchmarks/serve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def plot_serve_sweep(result: dict[str, Any], out: Path,
                     compare: dict[str, Any] | None = None) -> None:
    """Two panels (TTFT, ITL), one point per run, the rates evenly spaced on the x axis
    (``inf``, all requests at once, last); a throughput panel first when ``compare`` (a
    ``--compare-offline`` result) is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    runs = result["runs"]
    labels = [r if r == "inf" else f"{r:g}" for r in (run["request_rate"] for run in runs)]
    # Plain numbers on the log axes; minor ticks labelled at 2x and 5x only.
    major = FuncFormatter(lambda v, _: f"{v:g}")
    minor = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "25" else "")
    x = list(range(len(runs)))
    fig, axes = plt.subplots(1, 3 if compare else 2, figsize=(16 if compare else 11, 4.2))
    if compare:
        _throughput_panel(axes[0], compare)
    for ax, metric, title in ((axes[-2], "ttft", "Time to first token"),
                              (axes[-1], "itl", "Inter-token latency")):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            values = [r[f"{stat}_{metric}_ms"] for r in runs]
            ax.plot(x, values, style, color="#3f51b5" if stat == "median" else "#ef6c00",
                    label=stat)
            for xi, v in zip(x, values):
                ax.annotate(f"{v:.1f}", (xi, v), textcoords="offset points", xytext=(0, 5),
                            ha="center", fontsize=8)
        ax.set_xticks(x, labels)
        ax.set_xlabel("request rate (requests / s)")
        ax.set_ylabel("ms")
        ax.set_yscale("log")  # TTFT spans queueing seconds to single milliseconds
        ax.yaxis.set_major_formatter(major)
        ax.yaxis.set_minor_formatter(minor)
        ax.set_title(title)
        ax.legend()
    work = result["workload"]
    fig.suptitle(f"minivllm serve on {result.get('gpu') or 'the CPU'}; latencies: "
                 f"{work['num_prompts']} requests per rate")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _throughput_panel(ax: Any, compare: dict[str, Any]) -> None:
    """Offline ``LLM.generate`` and the server on the same requests, one bar each."""
    c = compare["comparison"]
    values = [c["offline_output_throughput"], c["served_output_throughput"]]
    ax.bar(["offline LLM.generate", f"minivllm serve\n(rate {c['request_rate']})"], values,
           color=["#bbbbbb", "#3f51b5"])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{compare['workload']['num_prompts']} requests: served is "
                 f"{c['served_over_offline']:.0%} of offline")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="JSON written by minivllm bench serve --request-rates")
    parser.add_argument("--compare", default=None,
                        help="JSON of a --compare-offline run: add its throughput panel")
    parser.add_argument("--output", default=None, help="PNG (default: next to the JSON)")
    args = parser.parse_args(argv)
    path = Path(args.result)
    compare = json.loads(Path(args.compare).read_text()) if args.compare else None
    plot_serve_sweep(json.loads(path.read_text()),
                     Path(args.output) if args.output else path.with_suffix(".png"), compare)


if __name__ == "__main__":
    main()
