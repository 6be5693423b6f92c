"""Which small-M GEMM a linear layer runs: the skinny kernel or cuBLAS, with which tiles,
and whether it starts before the previous kernel ends.

Upstream counterpart: ``vllm/model_executor/layers/utils.py``, where
``rocm_unquantized_gemm_impl`` decides by shape (and ``dispatch_unquantized_gemm`` by
platform) whether a linear layer's product goes to the ROCm skinny GEMMs or to the
general GEMM. minivllm makes the same decision for its Triton kernel
(``triton_skinny_gemm.py``) and keeps it apart from the kernel for the same reason
upstream does: the kernel is code that stays right on every GPU, while these choices are
measurements (an H200 sweep of Qwen3-0.6B's layers, ``minivllm/benchmarks/kernel_gemv.py``)
that another GPU or model would redo. Nothing here needs Triton, so a layer decides
whether it will use the kernel without importing it. The row limit a layer sends to the
kernel (``gemv_max_m``, ``MINIVLLM_GEMV_MAX_M``) and the start-up compilation of every
variant the layers can launch (``warm_up_small_m_kernels``) live here too, beside the
decision they belong to, rather than in ``linear.py`` with the layers themselves. So do
the same three choices for the MLP's fused gate/up + SiLU-and-mul kernel
(``triton_gate_up_silu.py``): its row limit, its tiles and its warm-up, measured by
``minivllm/benchmarks/kernel_gate_up.py``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
from torch import nn

#: Whether Triton runs its kernels in the interpreter (``TRITON_INTERPRET=1``, the CPU):
#: Triton reads the variable once, at import, and so does this module
#: (tests/conftest.py sets it before either is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
#: Environment switch: the most rows (tokens) an input may have to use the small-M kernel;
#: ``MINIVLLM_GEMV_MAX_M=0`` keeps every linear layer on ``F.linear``.
GEMV_MAX_M_ENV = "MINIVLLM_GEMV_MAX_M"
DEFAULT_GEMV_MAX_M = 8
#: The most rows at which down_proj's small-M kernel applies SiLU-and-mul as it loads its
#: input. One or two rows run on the CUDA-core tiling, where the fused activation saves
#: its kernel; from three rows on, the tensor-core tiling recomputes it in every output
#: tile and the fused call took 20 us against 6 us for the activation kernel's output
#: through the same kernel unfused (and 9 us for the activation and cuBLAS) on the H200
#: (docs/benchmarks/perf8/gemv_small_m.json).
FUSED_ACTIVATION_MAX_M = 2


def gemv_max_m() -> int:
    """The row limit of the small-M kernel: ``MINIVLLM_GEMV_MAX_M``, or the default."""
    return _row_limit(GEMV_MAX_M_ENV, DEFAULT_GEMV_MAX_M)


def _row_limit(env: str, default: int) -> int:
    """A row limit from the environment variable ``env`` (an integer >= 0), or ``default``."""
    raw = os.environ.get(env, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{env} must be an integer >= 0, got {raw!r}")
    return value


#: Environment switch: the most rows for which ``gate_up_proj`` and SiLU-and-mul run as one
#: kernel (``triton_gate_up_silu.py``); ``MINIVLLM_GATE_UP_SILU_MAX_M=0`` keeps them apart.
GATE_UP_SILU_MAX_M_ENV = "MINIVLLM_GATE_UP_SILU_MAX_M"
#: Two H200 sweeps (``docs/benchmarks/perf20``): up to 64 rows the fused kernel's best
#: tiling beat cuBLAS followed by the activation kernel at every batch of the second sweep,
#: by 0.45 to 1.4 us per layer; from 80 rows on cuBLAS's GEMM alone gains more over any
#: Triton tiling swept than the activation's launch costs, and the fused kernel lost by
#: 0.3 to 1.9 us.
DEFAULT_GATE_UP_SILU_MAX_M = 64


def gate_up_silu_max_m() -> int:
    """The row limit of the fused gate/up kernel: ``MINIVLLM_GATE_UP_SILU_MAX_M``, or the
    default."""
    return _row_limit(GATE_UP_SILU_MAX_M_ENV, DEFAULT_GATE_UP_SILU_MAX_M)


#: ``MINIVLLM_GEMV_PDL=1``: launch with programmatic dependent launch (read once).
PDL_ENV = "MINIVLLM_GEMV_PDL"
_PDL_ENV = os.environ.get(PDL_ENV, "0")
_pdl_capable: dict[torch.device, bool] = {}


@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration of ``triton_skinny_gemm.skinny_gemm_kernel``.

    Attributes:
        block_n: Output features (rows of ``W``) per program.
        block_k: Input features loaded per loop step.
        split_k: Programs sharing one output tile (``1``: no split).
        num_warps: Warps per program.
        num_stages: Loop steps whose loads are in flight at once (software pipelining).
        use_dot: Multiply with ``tl.dot`` (tensor cores) rather than multiply-and-sum.
        prefetch: Ask L2 for every line of the program's weights before the loop.
        pdl: Programmatic dependent launch: start while the previous kernel finishes,
            prefetch the weights, and wait for it only before reading ``x`` (needs
            ``prefetch``; Hopper or newer).
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = True
    prefetch: bool = False
    pdl: bool = False
    block_m: int = 0

    def rows_per_program(self, m: int) -> int:
        """``BLOCK_M``: ``block_m`` if set, else all ``m`` rows in one program (16, the
        smallest tensor-core tile, with ``use_dot``; the next power of two without)."""
        if self.block_m:
            return self.block_m
        return 16 if self.use_dot else max(1, 1 << (m - 1).bit_length())


def default_config(m: int, n: int, k: int, pdl: bool = False) -> GemvConfig:
    """The launch configuration for ``[m, k] x [n, k]^T``, from the H200 sweep of
    ``minivllm/benchmarks/kernel_gemv.py`` on Qwen3-0.6B's layers (M = 1, 2, 4, 8).

    * One or two rows of a narrow layer (``n <= 2048``: o_proj, down_proj): four output
      features per program and all of ``K`` (up to 1024) in one step, on the CUDA cores.
      256 programs each issue one 8 KB load and wait once, where cuBLAS took 2-3 times
      longer (split-K plus a reduction kernel).
    * Everything else: tensor-core tiles of 16 features x 128 inputs, two warps, four
      stages in flight; narrow layers split ``K`` four ways so 64 output tiles still
      make 256 programs.

    Args:
        m: Rows of ``x``. n: Output features. k: Input features.
        pdl: Prefetch the weights and use programmatic dependent launch (see
            :class:`GemvConfig`); the caller checks that the GPU supports it.
    """
    narrow = n <= 2048
    if narrow and m <= 2:
        config = GemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=2, use_dot=False)
    else:
        config = GemvConfig(block_n=16, block_k=128, split_k=4 if narrow and k >= 1024 else 1,
                            num_warps=2, num_stages=4)  # fmt: skip
    return dataclasses.replace(config, prefetch=pdl, pdl=pdl)


def kernel_wins(n: int, k: int, device: torch.device) -> bool:
    """Whether a layer of ``n`` outputs and ``k`` inputs should use this kernel at small M.

    The H200 sweep: on layers that reduce (``n <= k``: o_proj 2048 -> 1024, down_proj
    3072 -> 1024) cuBLAS reads the weight at a third of the bandwidth or less, and the
    kernel takes 1.2-3x less time; on layers that widen (qkv, gate/up) both sit within
    a few percent of each other, so cuBLAS keeps them. With programmatic dependent launch
    (opt-in) every layer uses it, since only this kernel can start its weight stream
    before the previous kernel ends; measured end to end that was slower than the default
    (``docs/benchmarks/perf2/latency_gemv.json``), hence off unless asked for.
    """
    return n <= k or pdl_enabled(device)


#: The fused gate/up kernel's tiles by batch: ``(most rows, config)``, the first entry
#: whose bound holds ``M``. The best tilings of the H200 sweep of
#: ``minivllm/benchmarks/kernel_gate_up.py`` on Qwen3-0.6B's gate_up_proj
#: (``docs/benchmarks/perf20``): 32 output columns (64 weight rows) and 128 inputs per
#: step throughout; one row block of 16 up to 32 rows (two warps from 24 rows on), then
#: blocks of 64 rows.
GATE_UP_SILU_TABLE: tuple[tuple[int, GemvConfig], ...] = (
    (16, GemvConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=4)),
    (32, GemvConfig(block_m=16, block_n=32, block_k=128, num_warps=2, num_stages=4)),
    (1 << 30, GemvConfig(block_m=64, block_n=32, block_k=128, num_warps=4, num_stages=4)),
)


def gate_up_silu_config(m: int, d: int, k: int) -> GemvConfig:
    """The fused gate/up kernel's launch configuration for ``x [m, k]`` and ``d`` outputs
    (:data:`GATE_UP_SILU_TABLE`; the shape beyond ``m`` does not change the choice yet)."""
    return next(config for bound, config in GATE_UP_SILU_TABLE if m <= bound)


def pdl_enabled(device: torch.device) -> bool:
    """Whether the layers launch with programmatic dependent launch on ``device``:
    ``MINIVLLM_GEMV_PDL=1`` and a Hopper or newer GPU."""
    if _PDL_ENV != "1" or device.type != "cuda" or INTERPRETED:
        return False
    if device not in _pdl_capable:
        _pdl_capable[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return _pdl_capable[device]


def warm_up_small_m_kernels(model: nn.Module) -> int:
    """Compile every small-M kernel variant ``model``'s linear layers can launch.

    The launch configuration depends on the row count only through "one or two rows" or
    "more" (the kernel does not specialise on ``M`` itself), so running each distinct
    layer shape at 1, 2 and 3 rows (row-parallel ones also with SiLU-and-mul fused, at the
    rows that fuse it, ``FUSED_ACTIVATION_MAX_M``) compiles them all, before the engine
    serves and also when it runs without CUDA graphs. Returns the number of launches (0
    when the layers do not use the kernel here).
    """
    # Imported here: the layers import this module, and Triton is optional.
    from minivllm.model_executor.custom_op import CustomOp
    from minivllm.model_executor.layers import triton_skinny_gemm
    from minivllm.model_executor.layers.linear import LinearBase, RowParallelLinear

    limit = gemv_max_m()
    seen: set[tuple] = set()
    launches = 0
    for module in model.modules():
        if not isinstance(module, LinearBase) or limit == 0:
            continue
        weight = module.weight
        if CustomOp.selected_impl(weight.device) != "cuda":
            continue
        if not kernel_wins(*weight.shape, weight.device):
            continue
        # A row-parallel layer adds its bias after the all-reduce, not in the kernel.
        bias = None if isinstance(module, RowParallelLinear) else module.bias
        key = (tuple(weight.shape), weight.dtype, bias is not None, weight.device)
        if key in seen:
            continue
        seen.add(key)
        # A row-parallel layer may also be down_proj, which fuses SiLU-and-mul (gated) at
        # up to FUSED_ACTIVATION_MAX_M rows.
        for gated in (False, True) if isinstance(module, RowParallelLinear) else (False,):
            top = min(3, FUSED_ACTIVATION_MAX_M) if gated else 3
            for m in sorted({min(rows, limit) for rows in range(1, top + 1)}):
                width = weight.shape[1] * (2 if gated else 1)
                x = torch.zeros(m, width, dtype=weight.dtype, device=weight.device)
                triton_skinny_gemm.skinny_gemm(x, weight, bias, gated)
                launches += 1
    return launches


def warm_up_gate_up_silu(model: nn.Module) -> int:
    """Compile every variant of the fused gate/up kernel ``model``'s MLPs can launch.

    The kernel does not specialise on ``M``, so one launch per tile configuration of
    :data:`GATE_UP_SILU_TABLE` that a batch within the row limits reaches, for each
    distinct weight shape, compiles them all. An MLP is any module with a
    ``fuses_gate_up_act`` method and a ``gate_up_proj`` (``LlamaMLP``). Returns the
    number of launches (0 when the fusion does not apply here).
    """
    from minivllm.model_executor.layers import triton_gate_up_silu  # Triton is optional

    limit = gate_up_silu_max_m()
    seen: set[tuple] = set()
    launches = 0
    for module in model.modules():
        fuses = getattr(module, "fuses_gate_up_act", None)
        if fuses is None:
            continue
        weight = module.gate_up_proj.weight
        key = (tuple(weight.shape), weight.dtype, weight.device)
        if key in seen:
            continue
        seen.add(key)
        below = FUSED_ACTIVATION_MAX_M  # rows up to here never reach the kernel
        for bound, _ in GATE_UP_SILU_TABLE:
            rows = min(bound, limit)
            if rows > below:
                x = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
                if fuses(x):
                    triton_gate_up_silu.gate_up_silu(x, weight)
                    launches += 1
            below = max(below, bound)
    return launches
