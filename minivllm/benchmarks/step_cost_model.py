"""What a decode step costs the GPU, fitted over a whole run: the ``decode_cost`` section of
``bench throughput --step-timeline``.

The roofline (``roofline.py``) charges every decode step the bytes it must move at the
copy bandwidth: all the weights once, and the K/V of every sequence's context. The step
timeline measures each step's GPU time, so over the run's decode steps a least-squares
fit of::

    gpu_s = fixed + per_sequence * num_seqs + kv_time_factor * kv_bytes / copy_bandwidth

(``kv_bytes``: the step's context tokens, every sequence's length including its new
token, times the KV bytes per token of all layers) splits a step's time into three parts:

* ``fixed``: what a step costs at any batch size: each kernel's launch, ramp-up and tail,
  the GEMMs at a few rows, which are bound by their latency rather than by their bytes,
  and the weights themselves. The roofline's share of it is the weight read alone.
* ``per_sequence``: what each sequence adds beside its context: its row of the LM head
  and of the sampler, and its share of the per-token kernels.
* ``kv_time_factor``: seconds of GPU time per second the KV read would take at the copy
  bandwidth (1: attention streams the cache exactly as fast as a copy).

Set beside the roofline, the fit says which part of the gap no batch size closes (the
fixed part over the weight read, paid once per step) and which part a faster attention
kernel would (the KV factor over 1). Steps whose GPU time includes waiting for the host
are left out of the fit as outliers (``_robust_fit``); their time above the line is
reported as ``unexplained``. :func:`fit_decode_cost_by_class` fits the same model to each
kernel class's seconds per step (``step_kernels.py``), which splits the fixed cost by
class. Upstream has no such tool; the step timeline's own
docstring (``step_timeline.py``) says what it measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Fewer decode steps than this do not pin down three coefficients.
MIN_DECODE_STEPS = 8
# A step further from the fitted line than this many robust standard deviations is left
# out of the next fit (see _robust_fit); a few refits settle the kept set.
OUTLIER_MADS = 3.0
MAX_REFITS = 10
RANK_DEFICIENT = "batch size and context do not vary independently over the decode steps"
MODEL = (
    "gpu_s = fixed + per_sequence * num_seqs "
    "+ kv_time_factor * context_tokens * kv_bytes_per_token / copy_bandwidth"
)


def fit_decode_cost(
    steps: Sequence[Any],
    kv_bytes_per_token: int,
    weight_bytes: int,
    copy_bandwidth: float,
) -> dict[str, Any]:
    """Fit the decode steps of ``steps`` (``StepTiming``s with GPU times); returns the
    coefficients, how well they fit, and the run's decode time split into the three
    parts beside the roofline's terms, or ``{"skipped": why}`` when the steps cannot
    support a fit (no GPU times, too few steps, batch and context that never vary)."""
    decode = [s for s in steps if not s.mixed and s.gpu_s is not None]
    if len(decode) < MIN_DECODE_STEPS:
        return {"skipped": f"{len(decode)} decode steps with GPU times (at least "
                           f"{MIN_DECODE_STEPS} are needed)"}  # fmt: skip
    x = _design(decode, kv_bytes_per_token, copy_bandwidth)
    if np.linalg.matrix_rank(x) < x.shape[1]:
        return {"skipped": RANK_DEFICIENT}
    num_seqs, kv_s = x[:, 1], x[:, 2]
    y = np.array([s.gpu_s for s in decode], dtype=np.float64)
    coef, keep = _robust_fit(x, y)
    fixed, per_seq, kv_factor = (float(c) for c in coef)
    residual = (y - x @ coef)[keep]
    spread = float(((y[keep] - y[keep].mean()) ** 2).sum())
    weights_s = weight_bytes / copy_bandwidth
    n = len(decode)
    totals = {
        "gpu": float(y.sum()),
        "fixed": fixed * n,
        "per_sequence": per_seq * float(num_seqs.sum()),
        "kv": kv_factor * float(kv_s.sum()),
    }
    # What the line does not explain: mostly the outlying steps' time above it.
    totals["unexplained"] = totals["gpu"] - totals["fixed"] - totals["per_sequence"] - totals["kv"]
    return {
        "model": MODEL,
        "decode_steps": n,
        "outlier_steps": int(n - keep.sum()),
        "fixed_ms_per_step": fixed * 1e3,
        "per_sequence_us": per_seq * 1e6,
        "kv_time_factor": kv_factor,
        "residual_rms_ms": float(np.sqrt((residual**2).mean())) * 1e3,
        "r_squared": 1.0 - float((residual**2).sum()) / spread if spread > 0 else None,
        "weights_ms_per_step_at_copy_bandwidth": weights_s * 1e3,
        "totals_s": {
            **totals,
            "kv_at_copy_bandwidth": float(kv_s.sum()),
            "weights_at_copy_bandwidth": weights_s * n,
            "fixed_over_weights": (fixed - weights_s) * n,
        },
    }


def fit_decode_cost_by_class(
    steps: Sequence[Any],
    class_seconds: dict[str, Sequence[float]],
    kv_bytes_per_token: int,
    copy_bandwidth: float,
) -> dict[str, Any]:
    """The same model fitted to each class's kernel seconds per decode step
    (``class_seconds[c][i]``: class ``c`` in ``steps[i]``, see ``step_kernels.py``).

    The outlying steps are chosen once, by the robust fit of the classes' sum; every
    class is then fitted on the steps kept. Least squares is linear in what it fits, so
    the classes' coefficients add up to those of the sum: the fixed cost per step splits
    exactly into its classes. ``{"skipped": why}`` as for :func:`fit_decode_cost`."""
    idx = [i for i, s in enumerate(steps) if not s.mixed]
    if len(idx) < MIN_DECODE_STEPS:
        return {"skipped": f"{len(idx)} decode steps (at least {MIN_DECODE_STEPS} are "
                           "needed)"}  # fmt: skip
    x = _design([steps[i] for i in idx], kv_bytes_per_token, copy_bandwidth)
    if np.linalg.matrix_rank(x) < x.shape[1]:
        return {"skipped": RANK_DEFICIENT}
    ys = {c: np.array([v[i] for i in idx], dtype=np.float64) for c, v in class_seconds.items()}
    total = np.sum(list(ys.values()), axis=0)
    coef, keep = _robust_fit(x, total)

    def coefficients(c: np.ndarray, y: np.ndarray) -> dict[str, float]:
        return {
            "fixed_ms_per_step": float(c[0]) * 1e3,
            "per_sequence_us": float(c[1]) * 1e6,
            "kv_time_factor": float(c[2]),
            "seconds": float(y.sum()),
        }

    classes = {}
    for cls, y in sorted(ys.items(), key=lambda kv: -kv[1].sum()):
        c, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
        classes[cls] = coefficients(c, y)
    return {
        "model": MODEL,
        "decode_steps": len(idx),
        "outlier_steps": int(len(idx) - keep.sum()),
        "total": coefficients(coef, total),
        "classes": classes,
    }


def _design(decode: Sequence[Any], kv_bytes_per_token: int, copy_bandwidth: float) -> np.ndarray:
    """The fit's columns for ``decode`` steps: 1, the batch size, and the KV read's
    seconds at the copy bandwidth."""
    num_seqs = np.array([s.num_reqs for s in decode], dtype=np.float64)
    kv_s = np.array([s.context_tokens for s in decode], dtype=np.float64)
    kv_s *= kv_bytes_per_token / copy_bandwidth
    return np.stack([np.ones_like(num_seqs), num_seqs, kv_s], axis=1)


def _robust_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares that leaves out outlying steps: fit, drop every step more than
    ``OUTLIER_MADS`` robust standard deviations (1.4826 x the median absolute deviation)
    from the line, refit on the rest, until the kept set stops changing. Returns the
    coefficients and the mask of kept steps.

    A step whose GPU time includes waiting (the host still launching its kernels when
    the GPU caught up, a pause of the process) sits far above the line; a handful of
    those tilt a plain fit (on one H200 run they inflated the per-sequence cost several
    times over and pulled the KV factor well below 1: ``fit_at_run`` against ``fit`` in
    docs/benchmarks/perf11/decode_cost.json), while the GPU's own cost is what is wanted.
    """
    keep = np.ones(len(y), dtype=bool)
    for _ in range(MAX_REFITS):
        coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
        residual = y - x @ coef
        centre = np.median(residual[keep])
        scale = 1.4826 * np.median(np.abs(residual[keep] - centre))
        if scale <= 1e-9 * np.abs(y).mean():  # the line goes through the points
            break
        kept = np.abs(residual - centre) <= OUTLIER_MADS * scale
        if (kept == keep).all() or kept.sum() < x.shape[1] + 1:
            break
        keep = kept
    return coef, keep
