"""Plot the demo model's loss curves into docs/assets/demo_model_loss.png.

Reads the training log shipped with the model (minivllm/demo/model/training_log.json) and
the log of the longer comparison run (docs/assets/demo_model_run_1500_steps.json), and
draws training loss (lines) and validation loss (markers) against optimizer steps.

Usage: python docs/scripts/plot_demo_loss.py   (needs matplotlib)
"""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_LOG = REPO_ROOT / "minivllm" / "demo" / "model" / "training_log.json"
LONG_LOG = REPO_ROOT / "docs" / "assets" / "demo_model_run_1500_steps.json"
OUT = REPO_ROOT / "docs" / "assets" / "demo_model_loss.png"


def main() -> None:
    """Draw both runs and write the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    runs = [(SHIPPED_LOG, "shipped: 600 steps", "tab:blue"), (LONG_LOG, "1500 steps", "tab:gray")]
    for path, label, color in runs:
        log = json.loads(path.read_text(encoding="utf-8"))
        curve, evals = log["loss_curve"], log["eval"]
        ax.plot(
            [p["step"] for p in curve],
            [p["loss"] for p in curve],
            color=color,
            lw=1.2,
            label=f"{label}: train",
        )
        ax.plot(
            [e["step"] for e in evals],
            [e["val_loss"] for e in evals],
            "o--",
            color=color,
            ms=4,
            lw=0.8,
            label=f"{label}: validation",
        )
    ax.set_xlabel("optimizer step (32 x 512 tokens each)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(0, 8.5)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    ax.set_title("Demo model on the King James Bible (seed 0, H200)")
    fig.tight_layout()
    fig.savefig(OUT)
    print(f"wrote {OUT.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
