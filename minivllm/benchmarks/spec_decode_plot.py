"""Plot of ``minivllm bench spec`` results (also usable on a saved JSON).

``python -m minivllm.benchmarks.spec_decode_plot docs/benchmarks/spec/x.json`` redraws
the PNG beside the JSON without a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _series(batch1: dict, method: str) -> tuple[list[int], list[dict]]:
    entries = batch1.get(method) or {}
    if "skipped" in entries:
        return [], []
    ks = sorted(int(k) for k, e in entries.items() if "tpot_ms" in e)  # not failed ones
    return ks, [entries[str(k)] for k in ks]


def plot_spec_results(results: dict, path: Path) -> None:
    """Two panels against k: batch-1 time per output token (off as a line), and the
    speed-up over off with the mean acceptance length beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch1 = results["batch1"]
    off = batch1["off"]["tpot_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax_tpot, ax_speed = axes
    ax_tpot.axhline(off, color="gray", linestyle="--", linewidth=1, label="speculation off")
    ax_speed.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    for method, label, marker in (("ngram", "n-gram", "o"), ("draft_model", "draft model", "s")):
        ks, entries = _series(batch1, method)
        if not ks:
            continue
        ax_tpot.plot(ks, [e["tpot_ms"] for e in entries], marker=marker, label=label)
        ax_speed.plot(ks, [e["speedup_tpot"] for e in entries], marker=marker, label=label)
        for k, e in zip(ks, entries, strict=True):
            if e.get("mean_acceptance_length") is not None:
                ax_speed.annotate(
                    f"{e['mean_acceptance_length']:.2f}",
                    (k, e["speedup_tpot"]),
                    textcoords="offset points",
                    xytext=(0, 6),
                    fontsize=7,
                    ha="center",
                )
    ax_tpot.set_xlabel("k (num_speculative_tokens)")
    ax_tpot.set_ylabel("ms per output token, batch 1")
    ax_tpot.set_ylim(bottom=0)
    ax_tpot.set_title("Time per output token (repetitive prompts)")
    ax_tpot.legend(fontsize=8)
    ax_speed.set_xlabel("k (num_speculative_tokens)")
    ax_speed.set_ylabel("speed-up over speculation off")
    ax_speed.set_title("Speed-up (labels: mean acceptance length)")
    ax_speed.legend(fontsize=8)
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
    note = ""
    if results.get("throughput"):
        t = results["throughput"]
        note = (
            f"; batch {t['num_requests']} throughput, n-gram k={t['ngram']['k']} / off: "
            f"{t['ratio_on_over_off']:.2f}x"
        )
    fig.suptitle(
        f"{Path(results['model']).name} on {results['gpu'] or 'CPU'}, torch "
        f"{results['torch']}, triton {results['triton']}{note}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1])
    plot_spec_results(json.loads(src.read_text()), src.with_suffix(".png"))
