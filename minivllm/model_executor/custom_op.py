"""Layers with two implementations: readable PyTorch, and one fused kernel for the GPU.

Upstream counterpart: ``vllm/model_executor/custom_op.py`` (``CustomOp``).

Why: written as plain torch, RMSNorm is about ten kernels (upcast, square, mean, add,
rsqrt, multiply, cast, multiply by the weight, plus the residual add), rotary embedding
about fifteen (gather, casts, four multiplies, add, subtract, cat, for q and for k)
and SiLU-and-mul two. A decode step of a small model is bound by those launches, not
by memory traffic. So each such layer keeps its torch code as ``forward_native`` (the
definition a reader checks, the CPU path, what ``torch.compile`` can fuse by itself) and
adds a ``forward_cuda`` that runs one Triton kernel. :class:`CustomOp` binds one of the
two per layer.

Two different things share the name "custom op", as upstream:

* :class:`CustomOp` (this class) *chooses* the implementation of a layer;
* :func:`~minivllm.utils.torch_utils.direct_register_custom_op` makes a kernel a
  ``torch.ops.minivllm.*`` operator, so that ``torch.compile`` treats it as one opaque
  node and profilers show it by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn

from minivllm.attention.selector import triton_available

#: Environment switch: ``MINIVLLM_NATIVE_OPS=1`` makes every CustomOp run forward_native.
NATIVE_OPS_ENV = "MINIVLLM_NATIVE_OPS"

IMPLEMENTATIONS = ("native", "cuda")


class CustomOp(nn.Module):
    """Base of layers that have a torch definition and a fused-kernel implementation.

    Subclasses implement ``forward_native`` and ``forward_cuda`` with one signature whose
    first argument is a tensor. ``forward`` calls the implementation bound on the first
    call: ``forward_cuda`` when that tensor is on a CUDA device and Triton is available,
    else ``forward_native``. The binding is kept (the Python of a step runs once per
    layer, so it should not re-decide every time) until :meth:`force` changes the rule.

    Binding at the first call rather than in ``__init__`` (which is where upstream's
    ``dispatch_forward`` runs) lets a module built on the CPU and moved to the GPU still
    get its kernel, and keeps construction independent of the device.
    """

    # Which implementation every instance must use (None: decide by device), and a
    # counter bumped on each change so that instances re-bind lazily.
    _forced_impl: ClassVar[str | None] = None
    _generation: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self._forward_method: Callable[..., Any] | None = None
        self._bound_generation = -1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the bound implementation (binding it first if needed)."""
        if self._bound_generation != CustomOp._generation:
            first = args[0] if args else next(iter(kwargs.values()))
            self._forward_method = self.dispatch_forward(first.device)
            self._bound_generation = CustomOp._generation
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The PyTorch definition: the reference semantics and the CPU path."""
        raise NotImplementedError(f"{type(self).__name__} has no forward_native")

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        """The fused-kernel implementation (Triton); must match ``forward_native``."""
        raise NotImplementedError(f"{type(self).__name__} has no forward_cuda")

    def dispatch_forward(self, device: torch.device) -> Callable[..., Any]:
        """The implementation to use for inputs on ``device``."""
        impl = self.selected_impl(device)
        return self.forward_cuda if impl == "cuda" else self.forward_native

    @classmethod
    def selected_impl(cls, device: torch.device) -> str:
        """``"native"`` or ``"cuda"``: the rule :meth:`dispatch_forward` applies."""
        if cls._forced_impl is not None:
            return cls._forced_impl
        if os.environ.get(NATIVE_OPS_ENV, "0") not in ("", "0"):
            return "native"
        if device.type == "cuda" and triton_available()[0]:
            return "cuda"
        return "native"

    @classmethod
    @contextmanager
    def force(cls, impl: str) -> Iterator[None]:
        """Make every CustomOp use ``impl`` (``"native"`` or ``"cuda"``) inside the block.

        For tests and comparisons: ``force("cuda")`` on the CPU runs the Triton kernels
        through ``TRITON_INTERPRET=1``; ``force("native")`` on a GPU measures the
        unfused layers.
        """
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
        previous = CustomOp._forced_impl
        CustomOp._set_forced(impl)
        try:
            yield
        finally:
            CustomOp._set_forced(previous)

    @staticmethod
    def _set_forced(impl: str | None) -> None:
        CustomOp._forced_impl = impl
        CustomOp._generation += 1
