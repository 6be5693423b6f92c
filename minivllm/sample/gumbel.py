"""One pass over the logits: temperature sampling by the Gumbel-max trick, in Triton.

Upstream counterpart: ``gumbel_sample`` in Model Runner V2's
``vllm/v1/worker/gpu/sample/gumbel.py`` (same trick, noise from a per-request seed and
the token's position).

The exponential race of ``random_sample`` picks ``argmax_i p_i / E_i`` with
``E_i ~ Exp(1)``. Taking logarithms, with ``p = softmax(x / T)``, that is
``argmax_i (x_i / T - log E_i)``: the softmax's normalizer is the same for every ``i``
and drops out, so neither the probabilities nor their sum are ever needed. Each
program reads its slice of one logits row once, makes its own noise (Philox, counter-
based: the same ``(seed, position, column)`` always gives the same number, whichever
program computes it), and keeps the best score; the last program of a row to finish
picks the best slice (its arrival counted on a per-row-block counter, as the split-K of
``triton_skinny_gemm.py``), so one launch does it all. The result does not depend on the
tiling, and a row's token depends on nothing but its own logits, temperature, seed and
position.

A step whose rows are all unseeded needs no per-row keys: the caller passes one key for
the batch (a fresh draw from the engine's seed each step) and each row's noise is
counted by its row index instead of its position, so nothing but a kernel argument
changes from step to step (no host array, no copy to the device).

``E = -log(1 - u)`` is computed so that small ``E`` keeps full precision: a token of
probability ``1e-7`` wins only when its ``E`` is below about ``1e-7``, and ``1 - u`` in
float32 cannot resolve that. For small ``u`` a series replaces the logarithm, and ``u``
itself comes from 32 random bits scaled down, exact near 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minivllm.utils.math_utils import cdiv, next_power_of_2

# Below this u, -log(1 - u) is the series u + u^2/2 + ... + u^6/6 (relative error
# < u^6 / 7, under float32's resolution); above it, 1 - u is exact enough.
_SERIES_BELOW = tl.constexpr(0.0625)
_TWO_POW_M32 = tl.constexpr(2.3283064365386963e-10)
_LOG2E = tl.constexpr(1.4426950408889634)
_BATCH_KEY_MIN = 2**31


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2: the GPU's one-instruction approximation (relative error ~2^-22, far below
    the bf16 logits' own), or the exact one where that is unavailable (interpreter)."""
    if FAST:
        return libdevice.fast_log2f(x)
    else:
        return tl.log2(x)


@triton.jit
def _exponential_log2(bits, FAST: tl.constexpr):
    """``E / ln 2`` for ``E ~ Exp(1)``, from 32 random bits (as int32); small values keep
    full precision."""
    u = (bits.to(tl.uint32, bitcast=True).to(tl.float32) + 0.5) * _TWO_POW_M32
    series = u * (1.0 + u * (0.5 + u * (1.0 / 3.0 + u * (0.25 + u * (0.2 + u / 6.0)))))
    return tl.where(u < _SERIES_BELOW, series * _LOG2E, -_log2(1.0 - u, FAST))


# The batch size and the batch key change every step: not specializations (one variant
# per model and key mode).
@triton.jit(do_not_specialize=["num_rows", "batch_key"])
def _gumbel_max_partial_kernel(
    logits_ptr,
    logits_stride,
    temperature_ptr,
    seeds_ptr,
    positions_ptr,
    batch_key,
    best_score_ptr,
    best_token_ptr,
    row_max_ptr,
    counter_ptr,
    sampled_ptr,
    finite_ptr,
    num_rows,
    vocab_size,
    NUM_SPLITS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    FAST_LOG: tl.constexpr,
    ROW_KEYS: tl.constexpr,
):
    """Best ``(x / T - log E) / ln 2`` (``x`` when ``T == 0``) of one slice of
    ``BLOCK_ROWS`` rows: base 2 and ``E / ln 2`` (whose log differs from ``log2 E`` by a
    constant) change no argmax. The row block's last program to finish then picks each
    row's best slice (``_pick_best_slice``).

    Columns are handled in groups of four: one Philox call gives four random words, so
    group ``g`` (columns ``4g .. 4g+3``) of a row uses counter ``(g, position)`` under
    the row's seed. Tiles are ``[BLOCK_ROWS, GROUPS, 4]``. With ``ROW_KEYS`` each row's
    seed and position are loaded; without, every row uses ``batch_key`` and its own row
    index as the position (see ``gumbel_sample``).
    """
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    split = tl.program_id(1)
    row_ok = rows < num_rows
    temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=1.0)
    greedy = (temperature == 0.0)[:, None, None]
    scale = _LOG2E / tl.where(greedy, 1.0, temperature[:, None, None])
    if ROW_KEYS:
        seed = tl.load(seeds_ptr + rows, mask=row_ok, other=0)[:, None]
        position = tl.load(positions_ptr + rows, mask=row_ok, other=0).to(tl.int32)[:, None]
    else:
        seed = tl.zeros((BLOCK_ROWS, 1), tl.int64) + batch_key
        position = rows.to(tl.int32)[:, None]
    row_ptr = logits_ptr + rows.to(tl.int64)[:, None, None] * logits_stride
    lane = tl.arange(0, 4)[None, None, :]
    # Running best per tile position, reduced once at the end: no cross-thread work
    # inside the loop. Strict ">" keeps the earlier (smaller) column of a tie.
    best = tl.full((BLOCK_ROWS, GROUPS, 4), -float("inf"), tl.float32)
    best_col = tl.zeros((BLOCK_ROWS, GROUPS, 4), tl.int32) + split * SPLIT_SIZE
    row_max = tl.full((BLOCK_ROWS, GROUPS, 4), -float("inf"), tl.float32)
    has_nan = tl.zeros((BLOCK_ROWS, GROUPS, 4), tl.int1)
    for i in tl.static_range(SPLIT_SIZE // (4 * GROUPS)):
        group = (split * SPLIT_SIZE) // 4 + i * GROUPS + tl.arange(0, GROUPS)
        cols = group[None, :, None] * 4 + lane
        mask = row_ok[:, None, None] & (cols < vocab_size)
        x = tl.load(row_ptr + cols, mask=mask, other=-float("inf")).to(tl.float32)
        row_max = tl.maximum(row_max, x)
        has_nan = has_nan | (x != x)
        counter = group[None, :] + tl.zeros_like(position)  # [BLOCK_ROWS, GROUPS]
        zeros = tl.zeros_like(counter)
        r0, r1, r2, r3 = tl.philox(seed, counter, zeros + position, zeros, zeros)
        bits = tl.where(
            lane == 0,
            r0[:, :, None],
            tl.where(
                lane == 1,
                r1[:, :, None],
                tl.where(lane == 2, r2[:, :, None], r3[:, :, None]),
            ),
        )
        noise = _log2(_exponential_log2(bits, FAST_LOG), FAST_LOG)
        score = tl.where(greedy, x, x * scale - noise)
        better = score > best  # NaN never wins
        best_col = tl.where(better, cols, best_col)
        best = tl.where(better, score, best)
    split_best = tl.max(tl.max(best, axis=2), axis=1)
    # The first column reaching the maximum, as torch.argmax.
    at_best = best == split_best[:, None, None]
    first = tl.min(tl.min(tl.where(at_best, best_col, 2147483647), axis=2), axis=1)
    # No winner (all -inf or NaN): the slice's first column, a valid id.
    best_token = tl.where(split_best > -float("inf"), first, split * SPLIT_SIZE)
    row_max = tl.max(tl.max(row_max, axis=2), axis=1)
    num_nan = tl.sum(tl.sum(has_nan.to(tl.int32), axis=2), axis=1)
    best = split_best
    out = rows * NUM_SPLITS + split
    tl.store(best_score_ptr + out, best, mask=row_ok)
    tl.store(best_token_ptr + out, best_token, mask=row_ok)
    # A NaN anywhere makes the row non-finite; +inf says so to the reduction.
    tl.store(row_max_ptr + out, tl.where(num_nan > 0, float("inf"), row_max), mask=row_ok)
    # Every thread's partials are written before the arrival is counted; the counter's
    # acq_rel atomic publishes them to the program that arrives last.
    tl.debug_barrier()
    counter = counter_ptr + tl.program_id(0)
    if tl.atomic_add(counter, 1, sem="acq_rel") == NUM_SPLITS - 1:
        _pick_best_slice(best_score_ptr, best_token_ptr, row_max_ptr, sampled_ptr, finite_ptr,
                         rows, row_ok, vocab_size, NUM_SPLITS, SPLITS_POW2)  # fmt: skip
        tl.atomic_xchg(counter, 0)  # ready for the next launch


@triton.jit
def _pick_best_slice(
    best_score_ptr,
    best_token_ptr,
    row_max_ptr,
    sampled_ptr,
    finite_ptr,
    rows,
    row_ok,
    vocab_size,
    NUM_SPLITS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
):
    """The winning slice of each row (the first on a tie), and the row's finiteness.

    The loads bypass L1 (``.cg``): the other programs wrote the partials moments ago, and
    this SM's L1 may hold stale lines of them."""
    s = tl.arange(0, SPLITS_POW2)[None, :]
    mask = row_ok[:, None] & (s < NUM_SPLITS)
    at = rows[:, None] * NUM_SPLITS + s
    score = tl.load(best_score_ptr + at, mask=mask, other=-float("inf"), cache_modifier=".cg")
    token = tl.load(best_token_ptr + at, mask=mask, other=0, cache_modifier=".cg")
    row_max = tl.load(row_max_ptr + at, mask=mask, other=-float("inf"), cache_modifier=".cg")
    row_max = tl.max(row_max, axis=1)
    best = tl.max(score, axis=1)
    first = tl.min(tl.where(score == best[:, None], s, SPLITS_POW2), axis=1)
    winner = tl.sum(tl.where(s == first[:, None], token, 0), axis=1)
    # A row without a winner (NaN scores) still gets a valid id: the caller flags it.
    winner = tl.minimum(tl.maximum(winner, 0), vocab_size - 1)
    tl.store(sampled_ptr + rows, winner.to(tl.int64), mask=row_ok)
    finite = (row_max > -float("inf")) & (row_max < float("inf"))
    tl.store(finite_ptr + rows, finite.to(tl.int8), mask=row_ok)


# The partials and the per-row-block arrival counters, per device, kept from call to call
# (grown when a call needs more): a sampling step allocates only its two results. Like the
# skinny GEMM's workspace, it assumes one stream per device launches the kernel.
_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def reserve_workspace(device: torch.device, num_rows: int, vocab_size: int) -> None:
    """Size ``device``'s workspace for ``num_rows`` rows at the default tiling, so that no
    later step allocates it (the engine's warm-up calls this with the most rows a step
    samples)."""
    _workspace(device, num_rows, gumbel_launch_config(vocab_size, device.type != "cuda", num_rows))


def _workspace(
    device: torch.device, num_rows: int, cfg: GumbelLaunchConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best scores, best tokens, row maxima (one per row slot and slice) and zeroed
    counters (one per row block) for ``num_rows`` rows tiled by ``cfg``, on ``device``."""
    num_row_blocks = cdiv(num_rows, cfg.block_rows)
    num_partials = num_row_blocks * cfg.block_rows * cfg.num_splits
    if device.type == "cuda" and device.index is None:  # one entry per GPU, however named
        device = torch.device("cuda", torch.cuda.current_device())
    ws = _workspaces.get(device)
    if ws is None or ws[0].numel() < num_partials or ws[3].numel() < num_row_blocks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Zeroing the counters would be captured, not run now.
            raise RuntimeError(
                "gumbel_sample under CUDA graph capture needs its workspace reserved "
                "first (reserve_workspace, or one eager call with as many rows)"
            )
        partials = max(num_partials, 0 if ws is None else ws[0].numel())
        blocks = max(num_row_blocks, 0 if ws is None else ws[3].numel())
        ws = (
            torch.empty(partials, dtype=torch.float32, device=device),
            torch.empty(partials, dtype=torch.int32, device=device),
            torch.empty(partials, dtype=torch.float32, device=device),
            torch.zeros(blocks, dtype=torch.int32, device=device),
        )
        _workspaces[device] = ws
    return ws


def batch_key(seed: int) -> int:
    """``seed`` folded into ``[2**31, 2**63)``: Triton types an int argument by its value
    (int32 below ``2**31``, uint64 from ``2**63``), and one kernel variant should serve
    every key (Philox reads the key as two 32-bit words, so the fold loses no noise
    quality, only keys below ``2**31``)."""
    return _BATCH_KEY_MIN + seed % (2**63 - _BATCH_KEY_MIN)


@dataclass(frozen=True)
class GumbelLaunchConfig:
    """Tiling: ``num_splits`` programs per row of ``split_size`` columns, each read in
    ``4 * groups``-column blocks, ``block_rows`` rows per program. A function of the
    vocabulary size and the device alone, so a model compiles one variant of each kernel.
    """

    groups: int
    split_size: int
    num_splits: int
    block_rows: int
    num_warps: int


def gumbel_launch_config(
    vocab_size: int, interpreted: bool = False, num_rows: int = 512
) -> GumbelLaunchConfig:
    """2,048-column blocks, four per program: Qwen3's 151,936 columns make 19 programs a
    row, 4,864 for 256 rows, enough loads in flight on every SM. One row per program on
    a GPU; the interpreter (``interpreted``) pays per operation, not per element, so
    there a program takes up to 512 of the ``num_rows`` rows at once (the interpreter
    compiles nothing, so a tiling that follows the batch costs nothing there)."""
    block = min(2048, max(16, next_power_of_2(vocab_size)))
    blocks_per_split = min(4, cdiv(vocab_size, block))
    split_size = block * blocks_per_split
    # Triton's largest tile is 2**20 elements.
    rows = min(512, next_power_of_2(num_rows), 2**20 // block)
    return GumbelLaunchConfig(
        groups=block // 4,
        split_size=split_size,
        num_splits=cdiv(vocab_size, split_size),
        block_rows=rows if interpreted else 1,
        num_warps=8 if block >= 2048 else 4,
    )


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor | int,
    positions: torch.Tensor | None,
    config: GumbelLaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: a draw from ``softmax(logits / T)``, or the argmax where ``T == 0``.

    Args:
        logits: ``[num_rows, vocab_size]`` (any float dtype; rows may be strided).
        temperature: ``[num_rows]`` float32, 0 on greedy rows.
        seeds: ``[num_rows]`` int64, the Philox key of each row's noise; or one Python
            int, the key of the whole batch, each row's position then being its row
            index (unseeded rows of one step: nothing to copy to the device per row).
        positions: ``[num_rows]`` int64, the position of the token each row samples
            (the second Philox counter word: a new token, new noise); None with a
            batch key.
        config: The tiling (tests try others); the default is ``gumbel_launch_config``'s.

    Returns:
        ``([num_rows]`` int64 token ids, ``[num_rows]`` bool: the row's maximum is finite
        and it has no NaN). The tokens do not depend on ``config``.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    cfg = config or gumbel_launch_config(vocab_size, device.type != "cuda", num_rows)
    row_keys = isinstance(seeds, torch.Tensor)
    if not row_keys and positions is not None:
        raise ValueError("gumbel_sample: positions must be None with a batch key (an int seeds)")
    sampled = torch.empty(num_rows, dtype=torch.int64, device=device)
    finite = torch.empty(num_rows, dtype=torch.int8, device=device)
    if num_rows == 0:
        return sampled, finite.view(torch.bool)
    row_blocks = cdiv(num_rows, cfg.block_rows)
    best_score, best_token, row_max, counters = _workspace(device, num_rows, cfg)
    _gumbel_max_partial_kernel[(row_blocks, cfg.num_splits)](
        logits,
        logits.stride(0),
        temperature,
        seeds if row_keys else temperature,  # unread without ROW_KEYS
        positions if row_keys else temperature,
        0 if row_keys else batch_key(seeds),
        best_score,
        best_token,
        row_max,
        counters,
        sampled,
        finite,
        num_rows,
        vocab_size,
        NUM_SPLITS=cfg.num_splits,
        SPLITS_POW2=next_power_of_2(cfg.num_splits),
        SPLIT_SIZE=cfg.split_size,
        GROUPS=cfg.groups,
        BLOCK_ROWS=cfg.block_rows,
        FAST_LOG=device.type == "cuda",
        ROW_KEYS=row_keys,
        num_warps=cfg.num_warps,
    )
    return sampled, finite.view(torch.bool)
