"""Draw the engine benchmark results (throughput, latency, prefix caching) as one PNG.

Reads the JSON files that ``minivllm bench throughput | latency | prefix`` write, so the
picture can be redrawn without a GPU: ``python -m minivllm.benchmarks.engine_plot``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot_engine_results(folder: Path, out: Path) -> None:
    """Draw ``throughput.json`` (with ``throughput_peers.json`` when the peers ran
    separately), ``latency.json`` and ``prefix.json`` from ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thr = json.loads((folder / "throughput.json").read_text())
    lat = json.loads((folder / "latency.json").read_text())
    pre = json.loads((folder / "prefix.json").read_text())
    peers_file = folder / "throughput_peers.json"
    peers = json.loads(peers_file.read_text())["peers"] if peers_file.exists() else {}
    peers = thr.get("peers", peers)  # a run with --peer hf carries its own
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), width_ratios=[1.8, 1, 1])

    ax = axes[0]
    names = ["roofline", "minivllm"]
    values = [thr["roofline"]["max_output_tokens_per_s"], thr["minivllm"]["output_tokens_per_s"]]
    if "sync" in thr:
        names.append("minivllm\nsync steps")
        values.append(thr["sync"]["output_tokens_per_s"])
    if "minivllm" in peers:
        names.append(f"minivllm\n({peers['num_requests']} req)")
        values.append(peers["minivllm"]["output_tokens_per_s"])
    for key, label in (("hf_generate_batch", "HF generate_batch"), ("hf_generate", "HF generate")):
        if "output_tokens_per_s" in peers.get(key, {}):
            names.append(f"{label}\n({peers['num_requests']} req)")
            values.append(peers[key]["output_tokens_per_s"])
    colors = ["#bbbbbb", "#3f51b5"] + [
        "#3f51b5" if n.startswith("minivllm") else "#ef6c00" for n in names[2:]
    ]
    ax.bar(names, values, color=colors)
    ax.tick_params(axis="x", labelsize=8)
    if len(values) > 3:
        ax.set_yscale("log")  # peers run 10-100x slower: a linear axis would hide them
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Throughput, {thr['workload']['num_requests']} requests "
                 f"({thr['minivllm']['fraction_of_roofline']:.0%} of roofline)")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)

    ax = axes[1]
    ax.bar(["time to first token", "time per output token"],
           [lat["median_ttft_ms"], lat["median_tpot_ms"]], color=["#7986cb", "#3f51b5"])
    ax.axhline(2.0, color="red", ls="--", lw=1, label="TPOT target 2 ms")
    ax.set_ylabel("ms")
    ax.set_title(f"Batch 1 latency ({lat['input_len']} in, {lat['output_len']} out)")
    ax.legend()

    ax = axes[2]
    ax.bar(["prefix caching off", "prefix caching on"],
           [pre["caching_off"]["seconds"], pre["caching_on"]["seconds"]],
           color=["#bbbbbb", "#3f51b5"])
    ax.set_ylabel("seconds")
    ax.set_title(f"{pre['num_requests']} requests sharing {pre['prefix_len']} tokens: "
                 f"{pre['speedup']:.1f}x")
    fig.suptitle(f"{thr.get('gpu')}, torch {thr['torch']}, triton {thr['triton']}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="docs/benchmarks")
    parser.add_argument("--output", default="docs/benchmarks/engine.png")
    args = parser.parse_args(argv)
    plot_engine_results(Path(args.folder), Path(args.output))


if __name__ == "__main__":
    main()
