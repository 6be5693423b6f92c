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
    """Batch-1 time per output token and speed-up against k (top); when the run has
    them, the batch-size sweep's speed-up over off and the top-2 gaps at the first
    greedy divergences from off (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bottom = bool(results.get("sweep") or results.get("identity"))
    fig, axes = plt.subplots(2 if bottom else 1, 2, figsize=(12, 8.8 if bottom else 4.4))
    axes = axes.reshape(-1, 2)
    _plot_batch1(results["batch1"], *axes[0])
    if (results.get("workload") or {}).get("kind") == "heldout_continuation":
        axes[0][0].set_title("Time per output token (held-out continuations)")
    if bottom:
        _plot_sweep(results.get("sweep"), results.get("throughput"), axes[1][0])
        _plot_margins(results, axes[1][1])
    note = ""
    if results.get("throughput") and results["throughput"].get("ngram"):
        t = results["throughput"]
        note = (
            f"; batch {t['num_requests']} throughput, n-gram k={t['ngram']['k']} / off: "
            f"{t['ratio_on_over_off']:.2f}x"
        )
        if t.get("ngram_threshold"):
            th = t["ngram_threshold"]
            note += (
                f", with disable_by_batch_size={th['disable_by_batch_size']}: "
                f"{th['ratio_over_off']:.2f}x"
            )
    fig.suptitle(
        f"{Path(results['model']).name} on {results['gpu'] or 'CPU'}, torch "
        f"{results['torch']}, triton {results['triton']}{note}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_batch1(batch1: dict, ax_tpot, ax_speed) -> None:
    off = batch1["off"]["tpot_ms"]
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
    for ax in (ax_tpot, ax_speed):
        ax.xaxis.get_major_locator().set_params(integer=True)


def _plot_sweep(sweep: dict | None, throughput: dict | None, ax) -> None:
    """Output tokens/s over off against the batch size, n-gram without and with the
    threshold; the batch-256 workload's ratios as separate markers."""
    if not sweep:
        ax.set_axis_off()
        return
    rows = sweep["rows"]
    sizes = [r["batch_size"] for r in rows]
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="speculation off")
    ax.axhline(0.95, color="gray", linestyle=":", linewidth=1, label="5 % below off")
    for name, label in (
        ("ngram", f"n-gram k={sweep['k']}"),
        ("ngram_threshold", f"... with disable_by_batch_size={sweep.get('disable_by_batch_size')}"),
        ("off_again", "off again, last (drift)"),
    ):
        if rows and name in rows[0]:
            ax.plot(sizes, [r[name]["ratio_over_off"] for r in rows], marker="o", label=label)
    if throughput and throughput.get("ngram_threshold"):
        n = throughput["num_requests"]
        ax.plot([n], [throughput["ratio_on_over_off"]], "kx", label="throughput workload")
        ax.plot([n], [throughput["ngram_threshold"]["ratio_over_off"]], "kx")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("requests at once (batch size)")
    ax.set_ylabel("output tokens/s over off")
    ax.set_title(
        f"Batch-size sweep ({sweep['output_len']} tokens each); crossover: {sweep.get('crossover')}"
    )
    ax.legend(fontsize=8)


def _plot_margins(results: dict, ax) -> None:
    """Each first divergence from off (batch 1, greedy): off's top-2 logprob gap there,
    against k; the counts of identical sequences in the title."""
    identity = results.get("identity")
    if not identity:
        ax.set_axis_off()
        return
    all_ks = []
    for method, marker in (("ngram", "o"), ("draft_model", "s")):
        ks, entries = _series(results["batch1"], method)
        for k, e in zip(ks, entries, strict=True):
            found = e.get("greedy_margins")
            if not found:
                continue
            all_ks.append(k)
            gaps = [d["off_margin"] for d in found["divergences"]]
            ax.plot([k] * len(gaps), gaps, marker, color="C0" if method == "ngram" else "C1")
            ax.annotate(
                f"{found['num_identical']}/{found['num_prompts']} equal",
                (k, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, -12),
                textcoords="offset points",
                fontsize=7,
                ha="center",
            )
    if all_ks:
        ax.set_xlim(min(all_ks) - 0.5, max(all_ks) + 0.5)
    top = identity["max_off_margin"]
    ax.set_ylim(0, 1.0 if not top else top * 1.4)  # room for the labels above the points
    ax.set_xlabel("k (num_speculative_tokens)")
    ax.set_ylabel("off's top-2 logprob gap at the first divergence")
    ax.set_title(
        f"Greedy identity: {identity['num_identical']}/{identity['num_sequences']} sequences "
        f"equal off; largest gap {_fmt(identity['max_off_margin'])}"
    )
    ax.xaxis.get_major_locator().set_params(integer=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    src = Path(sys.argv[1])
    plot_spec_results(json.loads(src.read_text()), src.with_suffix(".png"))
