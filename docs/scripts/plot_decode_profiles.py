"""Draw two pictures from the committed batch-1 decode profiles (H200, Qwen3-0.6B shape).

- ``docs/assets/decode_kernels.png`` (Layers as custom ops): the device time of one decode
  step by kind of kernel, for the layers written as plain torch ops
  (``docs/benchmarks/latency_native_layers.json``) and as fused Triton kernels
  (``docs/benchmarks/latency.json``), with the kernel launches per step of each kind.
- ``docs/assets/cuda_graph_timeline.png`` (CUDA graphs): one decoder layer's kernels on a
  timeline, launched one by one (eager) and replayed from one graph. Kernel widths are the
  mean durations the fused profile records; the profile has no timestamps, so the
  launch gaps of the eager row are drawn with an assumed host cost per launch
  (``SCHEMATIC_LAUNCH_US``), which the picture labels as schematic.

Both profiles keep the 25 entries with the most device time (``profile.top`` written by
``minivllm/benchmarks/profiling.py``), which is every kernel of the fused step and all but
the smallest of the torch-ops step.

Usage: python docs/scripts/plot_decode_profiles.py   (needs matplotlib)
"""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "docs" / "benchmarks"
ASSETS = REPO_ROOT / "docs" / "assets"
FUSED = BENCH / "latency.json"
NATIVE = BENCH / "latency_native_layers.json"
NUM_LAYERS = 28  # Qwen3-0.6B, the shape `minivllm bench latency` measures
SCHEMATIC_LAUNCH_US = 5.0
"""Host time per kernel launch in the eager row: an assumption for the drawing, not data."""

KINDS = ("GEMM", "attention", "norm, RoPE, SiLU layers", "other")
COLORS = {
    "GEMM": "tab:blue",
    "attention": "tab:orange",
    "norm, RoPE, SiLU layers": "tab:green",
    "other": "tab:gray",
}


def kind_of(name: str, calls_per_step: float = NUM_LAYERS) -> str:
    """Which group a kernel belongs to (by name, and for torch's own kernels by how often
    it runs: at least once per decoder layer for the layers' elementwise chains)."""
    if "nvjet" in name or "cublas" in name or "gemm" in name.lower():
        return "GEMM"
    if name in ("kernel_unified_attention", "reduce_segments_kernel", "reshape_and_cache_kernel"):
        return "attention"
    if "ArgMax" in name or name.startswith(("Memcpy", "Memset")):
        return "other"
    if name in ("rms_norm_kernel", "rotary_embedding_kernel", "silu_and_mul_kernel"):
        return "norm, RoPE, SiLU layers"
    if "at::native" in name and calls_per_step >= NUM_LAYERS:
        return "norm, RoPE, SiLU layers"  # the torch-op layers' elementwise/copy kernels
    return "other"


def kernels(path: Path) -> tuple[int, list[dict]]:
    """(profiled steps, the device-side rows: kernels and copies, not the aten:: ops)."""
    profile = json.loads(path.read_text(encoding="utf-8"))["profile"]
    rows = [
        r
        for r in profile["top"]
        if not r["name"].startswith("aten::") and r["cpu_time_total_us"] == 0
    ]
    return profile["num_steps"], rows


def by_kind(path: Path) -> dict[str, tuple[float, float]]:
    """Per kind: (device ms per step, kernel launches per step)."""
    steps, rows = kernels(path)
    out = {k: [0.0, 0.0] for k in KINDS}
    for r in rows:
        kind = kind_of(r["name"], r["calls"] / steps)
        out[kind][0] += r["device_time_total_us"] / 1e3 / steps
        out[kind][1] += r["calls"] / steps
    return {k: (v[0], v[1]) for k, v in out.items()}


def plot_kernels(plt) -> Path:
    """Stacked bars: device time per decode step by kind, torch-op layers vs fused."""
    runs = [("layers as torch ops", by_kind(NATIVE)), ("fused layer kernels", by_kind(FUSED))]
    fig, ax = plt.subplots(figsize=(8.5, 3.2), dpi=120)
    for y, (_label, kinds) in enumerate(runs):
        left = 0.0
        for kind in KINDS:
            ms, launches = kinds[kind]
            ax.barh(
                y,
                ms,
                left=left,
                color=COLORS[kind],
                edgecolor="white",
                label=kind if y == 0 else None,
            )
            if ms > 0.25:
                ax.text(
                    left + ms / 2,
                    y,
                    f"{launches:.0f} launches",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                )
            left += ms
        ax.text(
            left + 0.05,
            y,
            f"{left:.2f} ms, {sum(v[1] for v in kinds.values()):.0f} launches",
            va="center",
            fontsize=9,
        )
    ax.set_yticks(range(len(runs)), [r[0] for r in runs])
    ax.invert_yaxis()
    ax.set_xlabel("device time per batch-1 decode step (ms), profiled kernels")
    ax.set_xlim(0, max(sum(v[0] for v in k.values()) for _, k in runs) * 1.35)
    ax.set_title(
        "Where one decode step's GPU time goes (H200, Qwen3-0.6B shape, CUDA graphs on)",
        fontsize=10,
    )
    ax.legend(loc="lower right", fontsize=8, ncol=2, frameon=False)
    fig.tight_layout()
    out = ASSETS / "decode_kernels.png"
    fig.savefig(out)
    return out


def layer_kernels() -> list[tuple[str, str, float]]:
    """One decoder layer's kernels in execution order: (label, kind, mean µs)."""
    steps, rows = kernels(FUSED)
    mean = {r["name"]: r["device_time_total_us"] / r["calls"] for r in rows}
    per_layer_gemm = sum(
        r["device_time_total_us"] / steps / NUM_LAYERS
        for r in rows
        if kind_of(r["name"]) == "GEMM" and r["calls"] >= steps * NUM_LAYERS
    )
    gemm = per_layer_gemm / 4  # four GEMMs per layer: qkv, o, gate_up, down
    order = [
        ("norm", "rms_norm_kernel"),
        ("qkv", None),
        ("q norm", "rms_norm_kernel"),
        ("k norm", "rms_norm_kernel"),
        ("RoPE", "rotary_embedding_kernel"),
        ("KV write", "reshape_and_cache_kernel"),
        ("attention", "kernel_unified_attention"),
        ("merge", "reduce_segments_kernel"),
        ("o", None),
        ("norm", "rms_norm_kernel"),
        ("gate_up", None),
        ("SiLU", "silu_and_mul_kernel"),
        ("down", None),
    ]
    return [
        (label, kind_of(name) if name else "GEMM", mean[name] if name else gemm)
        for label, name in order
    ]


def plot_timeline(plt) -> Path:
    """Eager launches with gaps against one graph replay, for one decoder layer."""
    seq = layer_kernels()
    fig, ax = plt.subplots(figsize=(9.5, 3.0), dpi=120)
    rows = {"eager: CPU": 3, "eager: GPU": 2, "graph: CPU": 1, "graph: GPU": 0}
    t_gpu = 0.0
    for i, (_label, kind, us) in enumerate(seq):  # eager: kernel i launched at i * gap
        launch = i * SCHEMATIC_LAUNCH_US
        ax.barh(rows["eager: CPU"], SCHEMATIC_LAUNCH_US * 0.9, left=launch, color="0.6")
        start = max(launch + SCHEMATIC_LAUNCH_US, t_gpu)
        ax.barh(rows["eager: GPU"], us, left=start, color=COLORS[kind], edgecolor="white")
        t_gpu = start + us
    eager_end = t_gpu
    ax.barh(rows["graph: CPU"], SCHEMATIC_LAUNCH_US * 0.9, left=0, color="0.6")
    t = SCHEMATIC_LAUNCH_US
    for label, kind, us in seq:
        ax.barh(rows["graph: GPU"], us, left=t, color=COLORS[kind], edgecolor="white")
        if us > 3:  # the small norm/RoPE/SiLU kernels stay unlabelled
            ax.text(
                t + us / 2, rows["graph: GPU"] + 0.5, label, ha="center", va="center", fontsize=6.5
            )
        t += us
    ax.text(
        t + 1,
        rows["graph: GPU"],
        f"one replay: {t - SCHEMATIC_LAUNCH_US:.0f} µs of kernels",
        va="center",
        fontsize=8,
    )
    ax.text(eager_end + 1, rows["eager: GPU"], "GPU idle between launches", va="center", fontsize=8)
    ax.text(
        len(seq) * SCHEMATIC_LAUNCH_US + 1,
        rows["eager: CPU"],
        f"{len(seq)} launches (schematic cost each)",
        va="center",
        fontsize=8,
    )
    ax.text(
        SCHEMATIC_LAUNCH_US + 1,
        rows["graph: CPU"],
        "one graph launch replays all layers of the step",
        va="center",
        fontsize=8,
    )
    ax.set_yticks(list(rows.values()), list(rows.keys()))
    ax.set_xlim(0, max(eager_end, t) * 1.45)
    ax.set_xlabel("µs within one decoder layer of a batch-1 decode step")
    ax.set_title(
        "One decoder layer: kernels launched one by one vs replayed from a CUDA graph\n"
        "(kernel widths: mean durations from latency.json's profile; "
        "eager launch gaps: schematic)",
        fontsize=9,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in KINDS[:3]]
    ax.legend(handles, KINDS[:3], loc="lower right", fontsize=7, frameon=False)
    fig.tight_layout()
    out = ASSETS / "cuda_graph_timeline.png"
    fig.savefig(out)
    return out


def main() -> None:
    """Write both pictures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ASSETS.mkdir(parents=True, exist_ok=True)
    for out in (plot_kernels(plt), plot_timeline(plt)):
        print(f"wrote {out.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
