"""Plot of ``minivllm bench kernel`` results (also usable on a saved ``kernel.json``).

``python -m minivllm.benchmarks.kernel_plot docs/benchmarks/kernel.json`` redraws the
PNG beside the JSON without a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot_kernel_results(results: dict, path: Path) -> None:
    """Two panels: decode bandwidth vs the copy roofline, prefill TFLOP/s vs SDPA."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode = [r for r in results["decode"] if "paged_ms" in r]
    prefill = results.get("prefill", [])
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 1.4]})

    ax = axes[0]
    labels = [f"B{r['batch']}\nC{r['context']}" for r in decode]
    xs = range(len(decode))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r["paged_pct_copy_bw"] for r in decode], width,
           label="minivllm paged (Triton)")
    ax.bar([x + width / 2 for x in xs], [r["sdpa_pct_copy_bw"] for r in decode], width,
           label="torch SDPA, contiguous K/V")
    ax.axhline(85, color="gray", linestyle="--", linewidth=1)
    ax.axhline(70, color="gray", linestyle=":", linewidth=1)
    for x, r in zip(xs, decode, strict=True):
        if r.get("num_kv_splits", 1) > 1:
            ax.annotate(f"split {r['num_kv_splits']}", (x - width / 2, 2), rotation=90,
                        fontsize=7, ha="center", va="bottom", color="white")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("% of measured copy bandwidth")
    bw = results["copy_bandwidth_bytes_per_s"] / 1e12
    ax.set_title(f"Decode attention, bf16, 16 q / 8 kv heads, d 128 (copy BW {bw:.2f} TB/s)")
    ax.legend(loc="upper left", fontsize=8)

    ax = axes[1]
    labels = [f"B{r['batch']} P{r['prefix']}\n+{r['new_tokens']}" for r in prefill]
    xs = range(len(prefill))
    ax.bar([x - width / 2 for x in xs], [r["paged_tflops"] for r in prefill], width,
           label="minivllm paged (Triton)")
    ax.bar([x + width / 2 for x in xs], [r["sdpa_tflops"] for r in prefill], width,
           label="torch SDPA (causal)")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Prefill / chunked prefill")
    ax.legend(loc="upper left", fontsize=8)

    fig.suptitle(f"{results['gpu']}, torch {results['torch']}, triton {results['triton']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1])
    plot_kernel_results(json.loads(src.read_text()), src.with_suffix(".png"))
