"""Pictures of an engine trace: batch composition, block tables, KV usage over time,
and, with speculative decoding, the drafts each step verified.

Each helper draws one picture from an :class:`~minivllm.tracing.tracer.EngineTracer` (or
one snapshot of the KV pool) with matplotlib, and returns the figure so a notebook shows
it and ``minivllm trace`` saves it. matplotlib is imported lazily: the engine itself
never needs it (``pip install matplotlib``, part of the ``test`` extra).

Colors are stable: request ``i`` (in order of first appearance) always gets color ``i``
of a 20-color cycle, shared blocks are always orange, and prefill work is hatched.
Drafts are green when accepted and red when rejected, in every picture.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minivllm.tracing.tracer import EngineTracer, KVSnapshot, StepRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SHARED_COLOR = "#ff7f0e"
CACHED_FREE_COLOR = "#c6dbef"
FREE_COLOR = "#f0f0f0"
PREEMPT_COLOR = "#d62728"
ACCEPTED_COLOR = "#2ca02c"
REJECTED_COLOR = "#f4b6b6"
TARGET_COLOR = "#9ecae1"
# Above this many cells in a row, block ids are not written into the cells.
_MAX_LABELLED_CELLS = 48


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("trace plots need matplotlib: pip install matplotlib") from exc
    return plt


def request_colors(request_ids: list[str]) -> dict[str, Any]:
    """Request id -> an RGBA color from a 16-color cycle, by position in the list."""
    cmap = _pyplot().get_cmap("tab20")
    # The saturated half of tab20 first, then the light half; orange (slots 2, 3) is
    # left out because it marks shared blocks, green (4, 5) because it marks accepted
    # drafts.
    order = [i for i in range(0, 20, 2) if i not in (2, 4)]
    order += [i for i in range(1, 20, 2) if i not in (3, 5)]
    return {rid: cmap(order[i % len(order)]) for i, rid in enumerate(request_ids)}


def _new_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig, ax = _pyplot().subplots(figsize=figsize, dpi=90, layout="constrained")
    return fig, ax


def _check_steps(tracer: EngineTracer) -> list[StepRecord]:
    if not tracer.steps:
        raise ValueError("the tracer recorded no steps: run the engine inside trace()")
    return tracer.steps


def plot_batch_timeline(
    tracer: EngineTracer, ax: Axes | None = None, by_request: bool = True, legend: bool = True
) -> Figure:
    """Stacked bars: the tokens of each step, prefill hatched, decode solid.

    With ``by_request`` every request has its own color, so a reader can follow one
    request from its prompt chunks to its decodes (and its recompute after a
    preemption); without it the bars are just prefill vs decode. Red triangles mark
    preemptions; the dashed line is the token budget ``max_num_batched_tokens``.
    """
    import numpy as np

    steps = _check_steps(tracer)
    fig, ax = _new_axes(ax, (9, 3.6))
    x = np.arange(len(steps))
    ids = tracer.request_ids()
    row = {rid: i for i, rid in enumerate(ids)}
    prefill = np.zeros((len(ids), len(steps)))
    decode = np.zeros((len(ids), len(steps)))
    accepted = np.zeros(len(steps))
    rejected = np.zeros(len(steps))
    for j, record in enumerate(steps):
        for s in record.scheduled:
            prefill[row[s.request_id], j] += s.num_prefill_tokens
            decode[row[s.request_id], j] += s.num_decode_tokens
        accepted[j] = record.num_accepted_tokens
        rejected[j] = record.num_draft_tokens - record.num_accepted_tokens
    if by_request:
        colors = request_colors(ids)
        bottom = np.zeros(len(steps))
        for rid in ids:
            i = row[rid]
            ax.bar(x, prefill[i], bottom=bottom, width=0.9, color=colors[rid], hatch="///",
                   edgecolor="white", linewidth=0.3, label=f"req {rid}")
            bottom += prefill[i]
            ax.bar(x, decode[i], bottom=bottom, width=0.9, color=colors[rid],
                   edgecolor="white", linewidth=0.3)
            bottom += decode[i]
        total = bottom
    else:
        p, d = prefill.sum(0), decode.sum(0)
        ax.bar(x, p, width=0.9, color="#6baed6", hatch="///", edgecolor="white", label="prefill")
        ax.bar(x, d, bottom=p, width=0.9, color="#08519c", label="decode")
        total = p + d
    if rejected.any() or accepted.any():  # speculative decoding: the drafts on top
        ax.bar(x, accepted, bottom=total, width=0.9, color=ACCEPTED_COLOR,
               label="drafts accepted")
        ax.bar(x, rejected, bottom=total + accepted, width=0.9, color=REJECTED_COLOR,
               hatch="xx", edgecolor=PREEMPT_COLOR, linewidth=0.3, label="drafts rejected")
        total = total + accepted + rejected
    preempted = [j for j, r in enumerate(steps) if r.preempted_req_ids]
    if preempted:
        ax.scatter(preempted, total[preempted] + total.max() * 0.04, marker="v",
                   color=PREEMPT_COLOR, zorder=3, label="preemption")
    budget = tracer.max_num_batched_tokens
    # A budget far above every batch (a default of 8192 or 16384) would only squash the bars.
    show_budget = budget is not None and budget <= 2 * max(total.max(), 1)
    if show_budget:
        ax.axhline(budget, ls="--", lw=1, color="grey", label="token budget")
    ax.set_ylim(0, max(total.max(), budget if show_budget else 0) * 1.12 + 1)
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens in the batch")
    drafts = " + drafts" if accepted.any() or rejected.any() else ""
    ax.set_title(f"Batch composition per step (hatched: prefill, solid: decode{drafts})")
    ax.set_xlim(-0.6, len(steps) - 0.4)
    if legend:
        handles, labels = ax.get_legend_handles_labels()
        if len(handles) <= 16:
            ax.legend(handles, labels, fontsize=7, ncols=2, loc="upper right")
    return fig


def plot_kv_usage(tracer: EngineTracer, ax: Axes | None = None) -> Figure:
    """KV pool over time: blocks held (of which shared), and free blocks still cached.

    Cached-but-free blocks cost nothing (any allocation may take them) yet can still be
    hit by a later request with the same prefix: they are the prefix cache's reserve.
    """
    import numpy as np

    steps = _check_steps(tracer)
    fig, ax = _new_axes(ax, (9, 3.0))
    x = np.arange(len(steps))
    n = steps[0].kv.num_blocks
    in_use = np.array([r.kv.num_blocks_in_use for r in steps]) / n
    shared = np.array([len(r.kv.shared_block_ids) for r in steps]) / n
    cached_free = np.array([r.kv.num_cached_free_blocks for r in steps]) / n
    ax.stackplot(x, in_use - shared, shared, cached_free,
                 colors=["#2ca02c", SHARED_COLOR, CACHED_FREE_COLOR],
                 labels=["held by one request", "shared (prefix cache hit)",
                         "free but cached"], step="mid")
    for j, record in enumerate(steps):
        if record.preempted_req_ids:
            ax.axvline(j, color=PREEMPT_COLOR, lw=1, ls=":")
    if any(r.preempted_req_ids for r in steps):
        ax.plot([], [], color=PREEMPT_COLOR, ls=":", label="preemption")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_xlabel("engine step")
    ax.set_ylabel(f"fraction of {n} blocks")
    ax.set_title("KV cache utilization")
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_block_table(
    kv: KVSnapshot | StepRecord, title: str | None = None, max_blocks: int = 256
) -> Figure:
    """Two panels: the physical pool, and each request's block table.

    Top: one cell per physical block: the holder's color, orange when shared, light
    blue when free but still cached, grey when free. Bottom: one row per request, its
    logical blocks left to right, each labelled with the physical block it maps to
    (the address translation the attention kernel performs), shared ones in orange.

    Args:
        kv: A snapshot (``snapshot_kv(manager)``) or a step record (its ``kv``).
        title: Figure title.
        max_blocks: Draw at most this many physical blocks in the top panel (the
            lowest ids; a fresh pool hands them out first).
    """
    import numpy as np
    from matplotlib.patches import Patch, Rectangle

    if isinstance(kv, StepRecord):
        title = title or f"KV blocks after step {kv.step}"
        kv = kv.kv
    plt = _pyplot()
    tables = dict(sorted(kv.block_tables.items(), key=lambda item: _sort_key(item[0])))
    refs = kv.ref_counts()
    colors = request_colors(list(tables))
    owner = {b: rid for rid, table in tables.items() for b in table}
    shown = min(kv.num_blocks, max_blocks)
    rows = max(len(tables), 1)
    width = max([len(t) for t in tables.values()] + [8])
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 2.4 + 0.4 * rows), dpi=90, layout="constrained",
        gridspec_kw={"height_ratios": [1.2, max(rows, 1.5)]},
    )
    pool = np.zeros((1, shown, 4))
    for b in range(shown):
        if refs.get(b, 0) > 1:
            color = SHARED_COLOR
        elif b in refs:
            color = colors[owner[b]]
        elif b in kv.cached_block_ids:
            color = CACHED_FREE_COLOR
        else:
            color = FREE_COLOR
        pool[0, b] = _rgba(color)
    top.imshow(pool, aspect="auto", interpolation="nearest", extent=(-0.5, shown - 0.5, 0, 1))
    top.set_yticks([])
    top.set_xlabel("physical block id")
    suffix = "" if shown == kv.num_blocks else f" (first {shown} of {kv.num_blocks})"
    top.set_title(f"the pool: {kv.num_blocks_in_use} held, {kv.num_cached_free_blocks} free "
                  f"but cached, {kv.num_free_blocks} free{suffix}", fontsize=9)
    if shown <= _MAX_LABELLED_CELLS:
        top.set_xticks(range(shown))
        top.tick_params(axis="x", labelsize=7)
        top.vlines(np.arange(shown - 1) + 0.5, 0, 1, color="white", lw=1.5)

    for r, (rid, table) in enumerate(tables.items()):
        for j, b in enumerate(table):
            is_shared = refs[b] > 1
            bottom.add_patch(Rectangle(
                (j - 0.45, r - 0.4), 0.9, 0.8,
                facecolor=SHARED_COLOR if is_shared else colors[rid],
                edgecolor="black" if is_shared else "white", linewidth=1.2 if is_shared else 0.5,
            ))
            if width <= _MAX_LABELLED_CELLS:
                bottom.text(j, r, str(b), ha="center", va="center", fontsize=7)
    if not tables:
        bottom.text(width / 2, 0, "no request holds a block", ha="center", va="center")
    bottom.set_xlim(-0.6, width - 0.4)
    bottom.set_ylim(rows - 0.5, -0.5)
    bottom.set_yticks(range(len(tables)), [f"req {rid}" for rid in tables])
    bottom.set_xlabel(f"logical block (tokens j*{kv.block_size} .. j*{kv.block_size}"
                      f"+{kv.block_size - 1}); the label is the physical block")
    bottom.set_title("block tables", fontsize=9)
    bottom.legend(handles=[
        Patch(facecolor=SHARED_COLOR, edgecolor="black", label="shared"),
        Patch(facecolor=CACHED_FREE_COLOR, label="free, cached"),
        Patch(facecolor=FREE_COLOR, label="free"),
    ], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title)
    return fig


def plot_drafts(
    tracer: EngineTracer,
    request_id: str | None = None,
    decode: Callable[[int], str] | None = None,
    max_steps: int = 20,
) -> Figure:
    """One request's decode steps, one row each: the drafts it verified, green when
    accepted and red (hatched) when rejected, then the target model's own token (blue).

    A row reads left to right as the tokens the step tried: the accepted drafts and
    the blue token are what the request gained, so a step with ``a`` accepted drafts
    emitted ``a + 1`` tokens. A row with no draft is an ordinary decode step (the
    proposer found nothing to propose).

    Args:
        tracer: A trace of an engine with speculative decoding on.
        request_id: The request to show (default: the one with the most accepted
            drafts, then the most drafts).
        decode: Token id -> text for the cells (e.g. a tokenizer's ``decode`` of one
            id); default: the ids.
        max_steps: Show at most this many decode steps (its first ones).

    Raises:
        ValueError: No step verified a draft, or ``request_id`` never decoded.
    """
    from matplotlib.patches import Patch, Rectangle

    steps = _check_steps(tracer)
    if request_id is None:
        drafted: dict[str, tuple[int, int]] = {}
        for record in steps:
            for s in record.scheduled:
                kept, tried = drafted.get(s.request_id, (0, 0))
                drafted[s.request_id] = (
                    kept + (s.num_accepted_tokens or 0),
                    tried + s.num_draft_tokens,
                )
        if not drafted or max(tried for _, tried in drafted.values()) == 0:
            raise ValueError("no step verified a draft: trace an engine with speculative "
                             "decoding on (speculative_config)")
        request_id = max(drafted, key=lambda rid: drafted[rid])
    rows = [(record.step, s) for record in steps for s in record.scheduled
            if s.request_id == request_id and s.is_decode and s.new_token_ids][:max_steps]
    if not rows:
        raise ValueError(f"request {request_id!r} has no decode step in the trace")
    text = decode or str
    width = max(s.num_draft_tokens for _, s in rows) + 1
    fig, ax = _pyplot().subplots(figsize=(1.5 + 1.1 * width, 0.8 + 0.32 * len(rows)), dpi=90,
                                 layout="constrained")

    def cell(x: int, y: int, token: int, face: str, hatch: str | None = None) -> None:
        ax.add_patch(Rectangle((x - 0.47, y - 0.4), 0.94, 0.8, facecolor=face, hatch=hatch,
                               edgecolor="white", linewidth=0.5))
        label = text(token).replace("\n", "\\n")
        ax.text(x, y, label if len(label) <= 12 else label[:11] + "…", ha="center",
                va="center", fontsize=7)

    for y, (_, s) in enumerate(rows):
        accepted = s.num_accepted_tokens or 0
        for x, token in enumerate(s.spec_token_ids):
            if x < accepted:
                cell(x, y, token, ACCEPTED_COLOR)
            else:
                cell(x, y, token, REJECTED_COLOR, "///")
        cell(width - 1, y, s.new_token_ids[-1], TARGET_COLOR)
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), [f"step {step}" for step, _ in rows], fontsize=7)
    ax.set_xticks(range(width), [f"draft {i + 1}" for i in range(width - 1)] + ["target"],
                  fontsize=7)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.legend(handles=[Patch(facecolor=ACCEPTED_COLOR, label="draft accepted"),
                       Patch(facecolor=REJECTED_COLOR, hatch="///", label="draft rejected"),
                       Patch(facecolor=TARGET_COLOR, label="the target's token")],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"request {request_id}: drafts verified per decode step", fontsize=9)
    return fig


def _rgba(color: Any) -> tuple[float, float, float, float]:
    from matplotlib.colors import to_rgba

    return to_rgba(color)


def _sort_key(request_id: str) -> tuple[int, str]:
    return (int(request_id), "") if request_id.isdigit() else (1 << 62, request_id)


def busiest_step(tracer: EngineTracer) -> StepRecord:
    """The first step with the most blocks held, counting shared blocks once per holder:
    the most interesting block-table picture of a run."""
    steps = _check_steps(tracer)
    return max(steps, key=lambda r: (sum(len(t) for t in r.kv.block_tables.values()), -r.step))


def save_trace_figures(
    tracer: EngineTracer, out_dir: str | Path, decode: Callable[[int], str] | None = None
) -> list[Path]:
    """Write ``timeline.png``, ``kv_usage.png``, ``block_table.png`` and ``trace.json``,
    and ``drafts.png`` when steps verified drafts (``decode``: token id -> text for it).

    Returns:
        The paths written.
    """
    _check_steps(tracer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    figures = {
        "timeline.png": plot_batch_timeline(tracer),
        "kv_usage.png": plot_kv_usage(tracer),
        "block_table.png": plot_block_table(busiest_step(tracer)),
    }
    if any(r.num_draft_tokens for r in tracer.steps):
        figures["drafts.png"] = plot_drafts(tracer, decode=decode)
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name)
        plt.close(fig)
        paths.append(out / name)
    (out / "trace.json").write_text(json.dumps(tracer.to_dict(), indent=1))
    paths.append(out / "trace.json")
    return paths
