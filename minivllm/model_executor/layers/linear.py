"""Linear layers that know how they are split across tensor-parallel ranks.

Upstream counterpart: ``vllm/model_executor/layers/linear.py`` (``ColumnParallelLinear``,
``MergedColumnParallelLinear``, ``QKVParallelLinear``, ``RowParallelLinear``).

A transformer block needs communication only twice if its matrices are split the
Megatron way: the first matrix of a pair (QKV, gate/up) is split by *output* features
(column parallel: each rank computes some heads / some hidden units, no communication),
the second (o_proj, down_proj) by *input* features (row parallel: each rank computes a
partial sum, then one all-reduce). Every layer here owns only its rank's slice of the
weight, and each parameter carries a ``weight_loader`` that cuts that slice out of the
full checkpoint tensor. With one rank the slice is the whole tensor and the layers are
plain ``F.linear``.

Every layer is a :class:`~minivllm.model_executor.custom_op.CustomOp`: ``forward_native`` is
``F.linear``; ``forward_cuda`` sends an input of at most ``MINIVLLM_GEMV_MAX_M`` rows (a
decode step of a small batch) to the Triton kernel of ``triton_skinny_gemm.py``, which
streams the weight at close to the memory bandwidth where cuBLAS does not, and larger
inputs to ``F.linear``, on the layer shapes where it beats cuBLAS (``utils.kernel_wins``).
A tensor-parallel shard is just a smaller weight to it.

Unlike upstream, ``forward`` returns one tensor rather than ``(output, bias)``: minivllm
never defers the bias add into a following fused kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from minivllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.utils import (
    FUSED_ACTIVATION_MAX_M,
    gemv_max_m,
    kernel_wins,
)
from minivllm.model_executor.weight_utils import check_shape


def divide(numerator: int, denominator: int, what: str) -> int:
    """Exact integer division, with an error naming ``what`` when it does not divide."""
    if numerator % denominator != 0:
        raise ValueError(
            f"{what}={numerator} is not divisible by tensor_parallel_size={denominator}"
        )
    return numerator // denominator


def load_shard(
    what: str,
    dst: torch.Tensor,
    loaded: torch.Tensor,
    dim: int,
    full_size: int,
    start: int,
) -> None:
    """Copy ``loaded.narrow(dim, start, dst.shape[dim])`` into ``dst``.

    ``loaded`` is the checkpoint tensor as stored (all ranks' rows); it must have
    ``full_size`` along ``dim`` and match ``dst`` everywhere else. Checking the full
    shape first matters: narrowing a too-large tensor would succeed and load the wrong
    numbers silently.
    """
    expected = list(dst.shape)
    expected[dim] = full_size
    check_shape(what, torch.Size(expected), loaded.shape)
    with torch.no_grad():
        dst.copy_(loaded.narrow(dim, start, dst.shape[dim]))


class LinearBase(CustomOp):
    """Shared set-up: this rank's weight ``[out_per_rank, in_per_rank]`` and bias, and the
    matrix multiply ``x @ weight^T (+ bias)`` the subclasses' ``forward`` builds on.

    Args:
        input_size_per_partition: Input features held by this rank.
        output_size_per_partition: Output features computed by this rank.
        bias: Whether the layer has a bias (sharded like the output, except for row
            parallel layers where it is replicated).
        prefix: Dotted module name, used in error messages.
    """

    def __init__(
        self,
        input_size_per_partition: int,
        output_size_per_partition: int,
        bias: bool,
        prefix: str,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        # torch.empty: every element is overwritten by the checkpoint, and the loader
        # refuses to return a model with a parameter left unloaded.
        self.weight = nn.Parameter(
            torch.empty(output_size_per_partition, input_size_per_partition),
            requires_grad=False,
        )
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size_per_partition), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.gemv_max_m = 0  # set when forward_cuda is bound (dispatch_forward)

    def dispatch_forward(self, device: torch.device) -> Callable[..., Any]:
        """Bind as :class:`CustomOp` does, and decide once whether this layer's shape goes
        to the small-M kernel (``gemv_max_m``: its row limit, 0 for never)."""
        impl = super().dispatch_forward(device)
        self.gemv_max_m = 0
        if impl == self.forward_cuda:
            n, k = self.weight.shape
            if kernel_wins(n, k, device):
                self.gemv_max_m = gemv_max_m()
        return impl

    def forward_native(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, act: nn.Module | None = None
    ) -> torch.Tensor:
        """``act(x) @ weight^T (+ bias)`` with ``F.linear`` (``act``: none, or SwiGLU's
        :class:`~minivllm.model_executor.layers.activation.SiluAndMul`)."""
        return F.linear(x if act is None else act(x), self.weight, bias)

    def forward_cuda(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, act: nn.Module | None = None
    ) -> torch.Tensor:
        """The small-M Triton kernel for inputs of at most ``gemv_max_m`` rows, else
        ``F.linear``: at a few rows the product is bound by reading the weight, and on the
        shapes where cuBLAS reads it slowly the kernel reads it faster
        (see ``triton_skinny_gemm.py``). At up to ``FUSED_ACTIVATION_MAX_M`` rows the
        kernel also applies SiLU-and-mul as it loads ``x``, which saves that layer's kernel
        launch and its round trip through memory; above, the activation runs first."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows <= self.gemv_max_m and (act is None or isinstance(act, SiluAndMul)):
            from minivllm.model_executor.layers import triton_skinny_gemm  # Triton is optional

            if act is not None and rows > FUSED_ACTIVATION_MAX_M:
                x, act = act(x), None
            return triton_skinny_gemm.skinny_gemm(x, self.weight, bias, act is not None)
        return F.linear(x if act is None else act(x), self.weight, bias)

    def param_name(self, param: torch.Tensor) -> str:
        """Full dotted name of ``param`` (``weight`` or ``bias``) for error messages."""
        return f"{self.prefix}.{'bias' if param is self.bias else 'weight'}"

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's part of a checkpoint tensor into ``param``."""
        raise NotImplementedError


class ColumnParallelLinear(LinearBase):
    """``Y = X A`` with ``A`` split by columns (output features) across ranks.

    Rank ``r`` computes output features ``[r * n, (r + 1) * n)`` where
    ``n = output_size / tp_size``. Its input is the full ``X``, so no communication
    is needed unless the caller wants the full output (``gather_output``).

    Args:
        input_size: Input features (full).
        output_size: Output features (full, before splitting).
        bias: Add a bias (split like the output).
        gather_output: All-gather the outputs so every rank gets the full ``Y``.
        prefix: Dotted module name.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.output_size = output_size
        self.output_size_per_partition = divide(output_size, tp_size, f"{prefix} output_size")
        self.gather_output = gather_output
        super().__init__(input_size, self.output_size_per_partition, bias, prefix)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Take rows ``[rank * n, (rank + 1) * n)`` of the checkpoint tensor."""
        shard = self.output_size_per_partition
        load_shard(
            self.param_name(param),
            param.data,
            loaded_weight,
            0,
            self.output_size,
            self.tp_rank * shard,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's output features (all of them when ``gather_output``)."""
        out = super().forward(x, self.bias)
        return tensor_model_parallel_all_gather(out) if self.gather_output else out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices with the same input fused into one GEMM.

    Used for the MLP's gate and up projections: one ``[2 * I / tp, H]`` matmul instead
    of two. The checkpoint stores the pieces separately, so the loader receives each
    with a ``shard_id`` (its index in ``output_sizes``) and places this rank's rows of
    it at that piece's offset inside the fused weight.

    Args:
        input_size: Input features.
        output_sizes: Full output features of each fused piece, in order.
        bias: Add a bias.
        prefix: Dotted module name.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        prefix: str = "",
    ) -> None:
        self.output_sizes = list(output_sizes)
        tp_size = get_tensor_model_parallel_world_size()
        for i, size in enumerate(self.output_sizes):
            divide(size, tp_size, f"{prefix} output_sizes[{i}]")
        super().__init__(input_size, sum(self.output_sizes), bias, prefix=prefix)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None:
        """Load piece ``shard_id`` (or, when None, a checkpoint that is already fused)."""
        if shard_id is None:
            check_shape(
                self.param_name(param), (self.output_size, *param.shape[1:]), loaded_weight.shape
            )
            for i, piece in enumerate(loaded_weight.split(self.output_sizes, dim=0)):
                self.weight_loader(param, piece, i)
            return
        if not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{self.prefix}: shard_id {shard_id} out of range")
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        load_shard(
            f"{self.param_name(param)} (shard {shard_id})",
            param.data.narrow(0, offset, size),
            loaded_weight,
            0,
            self.output_sizes[shard_id],
            self.tp_rank * size,
        )


class QKVParallelLinear(ColumnParallelLinear):
    """The fused query/key/value projection, split by attention heads.

    Each rank owns ``num_heads / tp`` query heads and the key/value heads they attend
    with. With grouped-query attention there may be fewer KV heads than ranks; each KV
    head is then *replicated* on ``tp / num_kv_heads`` ranks (rank ``r`` holds KV head
    ``r // replicas``), because a query head needs its whole KV head, not a slice of it.

    Args:
        hidden_size: Input features.
        head_size: Size of one head.
        total_num_heads: Query heads of the whole model.
        total_num_kv_heads: Key/value heads of the whole model.
        bias: Add a bias (Qwen2 has one on q, k and v).
        prefix: Dotted module name.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, f"{prefix} num_attention_heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, f"{prefix} num_kv_heads")
            self.num_kv_head_replicas = 1
        else:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, total_num_kv_heads, "tp_size")
        per_rank = (self.num_heads + 2 * self.num_kv_heads) * head_size
        super().__init__(hidden_size, per_rank * tp_size, bias, prefix=prefix)

    def shard_layout(self, shard_id: str) -> tuple[int, int, int, int]:
        """``(offset in this rank's weight, rows, rows in the checkpoint, source start)``."""
        q_rows = self.num_heads * self.head_size
        kv_rows = self.num_kv_heads * self.head_size
        if shard_id == "q":
            return 0, q_rows, self.total_num_heads * self.head_size, self.tp_rank * q_rows
        if shard_id not in ("k", "v"):
            raise ValueError(f"{self.prefix}: shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        offset = q_rows if shard_id == "k" else q_rows + kv_rows
        # Replicated KV heads: ranks 0..replicas-1 share KV head 0, and so on.
        kv_head_rank = self.tp_rank // self.num_kv_head_replicas
        return offset, kv_rows, self.total_num_kv_heads * self.head_size, kv_head_rank * kv_rows

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | None = None
    ) -> None:
        """Load the ``"q"``, ``"k"`` or ``"v"`` checkpoint tensor (None: already fused)."""
        if shard_id is None:
            sizes = [self.total_num_heads * self.head_size] + [
                self.total_num_kv_heads * self.head_size
            ] * 2
            check_shape(self.param_name(param), (sum(sizes), *param.shape[1:]), loaded_weight.shape)
            for sid, piece in zip("qkv", loaded_weight.split(sizes, dim=0), strict=True):
                self.weight_loader(param, piece, sid)
            return
        offset, rows, full_rows, start = self.shard_layout(shard_id)
        load_shard(
            f"{self.param_name(param)} (shard {shard_id!r})",
            param.data.narrow(0, offset, rows),
            loaded_weight,
            0,
            full_rows,
            start,
        )


class RowParallelLinear(LinearBase):
    """``Y = X A`` with ``A`` split by rows (input features) across ranks.

    The input arrives already split (it is the output of a column-parallel layer), so
    each rank computes a partial product ``X_r A_r`` and one all-reduce sums them. The
    bias is added once, after the sum, so it is not counted ``tp_size`` times.

    Args:
        input_size: Input features (full, before splitting).
        output_size: Output features.
        bias: Add a bias (replicated on every rank).
        prefix: Dotted module name.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.input_size = input_size
        self.input_size_per_partition = divide(input_size, tp_size, f"{prefix} input_size")
        super().__init__(self.input_size_per_partition, output_size, bias, prefix)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Take columns ``[rank * n, (rank + 1) * n)`` of the weight; the bias whole."""
        if param is self.bias:
            load_shard(self.param_name(param), param.data, loaded_weight, 0, param.shape[0], 0)
            return
        shard = self.input_size_per_partition
        load_shard(
            self.param_name(param),
            param.data,
            loaded_weight,
            1,
            self.input_size,
            self.tp_rank * shard,
        )

    def forward(self, x: torch.Tensor, act: nn.Module | None = None) -> torch.Tensor:
        """Partial product of ``act(x)`` (``act`` optional, see ``forward_cuda``),
        all-reduced over ranks, plus bias."""
        out = tensor_model_parallel_all_reduce(super().forward(x, None, act))
        if self.bias is not None:
            out = out + self.bias
        return out
