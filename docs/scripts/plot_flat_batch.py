"""Draw the model runner's flat batch for one real step: docs/assets/flat_batch.png.

Runs the demo model on the CPU with block size 4 and a 12-token budget, and builds the
Model runner chapter's worked example with the real engine: request C is decoding when
A (a new 6-token prompt) and B (a 10-token prompt whose first block is C's first block)
arrive. The step that serves all three is caught where the runner builds it
(``ModelRunner._prepare_inputs``), and every number in the picture is read from the
tensors the runner made: ``input_ids``, ``positions``, ``slot_mapping``,
``query_start_loc``, ``seq_lens``, ``block_table`` and ``logits_indices``.

Usage: python docs/scripts/plot_flat_batch.py   (needs matplotlib; a few seconds)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT = REPO_ROOT / "docs" / "assets" / "flat_batch.png"
COLORS = {"C": "tab:blue", "A": "tab:orange", "B": "tab:green"}


def capture_step() -> tuple[dict, list[str]]:
    """Run the scenario; return the runner's tensors for the mixed step and its request order."""
    sys.path.insert(0, str(REPO_ROOT))
    from minivllm.demo import demo_model_path
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.sampling_params import SamplingParams
    from minivllm.worker.model_runner import ModelRunner

    steps: list[tuple[list[str], object]] = []
    original = ModelRunner._prepare_inputs

    def recording(self, scheduler_output):
        inputs = original(self, scheduler_output)
        steps.append(([s.request_id for s in scheduler_output.scheduled], inputs))
        return inputs

    ModelRunner._prepare_inputs = recording
    try:
        args = EngineArgs(
            model=str(demo_model_path()),
            device="cpu",
            block_size=4,
            num_kv_blocks=16,
            max_num_batched_tokens=12,
            max_model_len=64,
            async_scheduling=False,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
        )
        engine = LLMEngine.from_engine_args(args)
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        prompt_c = [11, 12, 13, 14, 15, 16, 17, 18, 19]
        ids = {"C": engine.add_request({"prompt_token_ids": prompt_c}, params)}
        engine.step()  # C's prefill, which samples its 10th token
        ids["A"] = engine.add_request({"prompt_token_ids": [31, 32, 33, 34, 35, 36]}, params)
        ids["B"] = engine.add_request(
            {"prompt_token_ids": prompt_c[:4] + [41, 42, 43, 44, 45, 46]}, params
        )
        engine.step()  # the mixed step
        engine.shutdown()
    finally:
        ModelRunner._prepare_inputs = original
    names = {rid: name for name, rid in ids.items()}
    order, inputs = steps[-1]
    meta = inputs.attn_metadata
    return {
        "input_ids": inputs.input_ids.tolist(),
        "positions": inputs.positions.tolist(),
        "slot_mapping": meta.slot_mapping.tolist(),
        "query_start_loc": meta.query_start_loc.tolist(),
        "seq_lens": meta.seq_lens.tolist(),
        "block_table": meta.block_table.tolist(),
        "logits_indices": inputs.logits_indices.tolist(),
    }, [names[rid] for rid in order]


def draw(t: dict, order: list[str]) -> None:
    """The flat token axis (three rows) above the per-request tensors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qsl = t["query_start_loc"]
    owner = [order[i] for i in range(len(order)) for _ in range(qsl[i + 1] - qsl[i])]
    n = len(owner)
    fig, ax = plt.subplots(figsize=(9.5, 4.6), dpi=120)
    ax.set_xlim(-3.2, n + 0.2)
    ax.set_ylim(-7.9, 1.6)
    ax.axis("off")

    def cell(x: float, y: float, text: str, color: str | None = None, w: float = 1.0) -> None:
        face = matplotlib.colors.to_rgba(color, 0.35) if color else "white"
        ax.add_patch(plt.Rectangle((x, y), w, 0.8, facecolor=face, edgecolor="0.4", lw=0.8))
        ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=8.5)

    ax.text(n / 2, 1.25, "flat token axis: one column per scheduled token", ha="center", fontsize=9)
    for j in range(n):
        ax.text(j + 0.5, 0.95, str(j), ha="center", fontsize=7, color="0.4")
    rows = [
        ("request", owner),
        ("input_ids", t["input_ids"]),
        ("positions", t["positions"]),
        ("slot_mapping", t["slot_mapping"]),
    ]
    for r, (label, values) in enumerate(rows):
        y = -r
        ax.text(-0.2, y + 0.4, label, ha="right", va="center", fontsize=9, family="monospace")
        for j, v in enumerate(values):
            cell(j, y, str(v), COLORS[owner[j]])
    for j in t["logits_indices"]:  # where a token is sampled
        ax.annotate(
            "",
            xy=(j + 0.5, -3.25),
            xytext=(j + 0.5, -3.75),
            arrowprops=dict(arrowstyle="->", color="crimson"),
        )
    ax.text(n, -3.6, "logits_indices", ha="right", va="center", fontsize=8, color="crimson")

    top = -5.0
    ax.text(-0.2, top + 1.0, "per request", ha="right", fontsize=9, style="italic")
    headers = ["request", "query_start_loc", "seq_lens", "block_table row"]
    widths = [1.6, 2.4, 1.6, 4.0]
    x = 0.0
    for h, w in zip(headers, widths, strict=True):
        ax.text(x + w / 2, top + 1.0, h, ha="center", fontsize=8.5, family="monospace")
        x += w
    for i, name in enumerate(order):
        y = top - i
        values = [name, str(qsl[i]), str(t["seq_lens"][i]), str(t["block_table"][i])]
        x = 0.0
        for v, w in zip(values, widths, strict=True):
            cell(x, y, v, COLORS[name], w)
            x += w
    ax.text(
        widths[0] + widths[1] / 2,
        top - len(order) + 0.35,
        f"end: {qsl[-1]}",
        ha="center",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(OUT)
    print(f"wrote {OUT.relative_to(REPO_ROOT)}")


def main() -> int:
    """Capture the step and draw it."""
    tensors, order = capture_step()
    print(tensors, order)
    draw(tensors, order)
    return 0


if __name__ == "__main__":
    sys.exit(main())
