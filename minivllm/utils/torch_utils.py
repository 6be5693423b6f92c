"""Torch helpers used by more than one package.

Upstream counterpart: ``vllm/utils/torch_utils.py``: its pinned-memory and
``async_tensor_h2d`` helpers, and ``direct_register_custom_op``, which the attention and
layer kernels use to become ``torch.ops.minivllm.*`` operators. The packing into one
page-locked buffer, reused from a ring, follows Model Runner V2
(``vllm/v1/worker/gpu/buffer_utils.py``). The sampler's metadata (``sample/``), the model
runner (``worker/``), the attention backend and the layer kernels all use this module, so
it lives below them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from minivllm.utils.buffer_utils import pinned_pool

ALIGN_BYTES = 16


def copy_to_device(
    arrays: list[np.ndarray], dtype: type, device: torch.device
) -> list[torch.Tensor]:
    """Send several host arrays to ``device`` in one copy that never makes the host wait.

    From ordinary (pageable) memory, CUDA may stage a host-to-device copy synchronously,
    stalling the host until the device has caught up with everything queued before it,
    which is exactly the wait async scheduling is meant to remove. So the arrays are
    packed into one page-locked buffer, reused from a ring
    (``utils/buffer_utils.py``: no allocation and no torch CPU op per step), and copied
    at once; the results are views of one device buffer, each with its array's shape,
    all of dtype ``dtype``.
    """
    return copy_arrays_to_device(arrays, [dtype] * len(arrays), device)


def copy_arrays_to_device(
    arrays: list[np.ndarray], dtypes: list[type], device: torch.device
) -> list[torch.Tensor]:
    """``copy_to_device`` for arrays of different widths: array ``i`` arrives as
    ``dtypes[i]``, all of them in one copy.

    The arrays are laid out as bytes in one buffer, so a step whose host work ends in
    int64 positions and int32 block tables pays for one transfer instead of two; each
    result is a view of the one device buffer, reinterpreted with its own dtype. Each
    array starts on a 16-byte boundary: Triton specializes pointer arguments on 16-byte
    alignment, so a view at an odd offset would compile a second variant of a kernel in
    the middle of a run (see worker/kernel_warmup.py).
    """
    layout, total = [], 0
    for a, dtype in zip(arrays, dtypes, strict=True):
        nbytes = a.size * np.dtype(dtype).itemsize
        layout.append((total, nbytes))
        total += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES

    def fill(flat: np.ndarray) -> None:
        for a, dtype, (start, nbytes) in zip(arrays, dtypes, layout):
            flat[start : start + nbytes].view(dtype)[:] = a.ravel()

    if device.type == "cuda":
        packed = pinned_pool(device).copy_to_device(total, fill)
    else:
        # Off CUDA the "device" tensors are host memory themselves: a fresh buffer each
        # time, since the views outlive the call.
        flat = np.empty(total, dtype=np.uint8)
        fill(flat)
        packed = torch.from_numpy(flat).to(device)
    # A view costs a few microseconds of host time each, and this runs for ten arrays
    # every step: a 1-D array needs no reshape.
    views = []
    for a, dtype, (start, nbytes) in zip(arrays, dtypes, layout):
        view = packed[start : start + nbytes].view(_TORCH_DTYPES[np.dtype(dtype)])
        views.append(view if a.ndim == 1 else view.view(a.shape))
    return views


_TORCH_DTYPES = {
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float32): torch.float32,
}


def cuda_context_is_broken(device: torch.device) -> bool:
    """True when ``device``'s CUDA context is unusable: after a device-side assert or an
    illegal memory access CUDA fails every later call, so the process cannot serve on.
    An error that leaves the device usable (out of memory, a bad input) answers False.
    Always False off CUDA."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        return True
    return False


# ---------------------------------------------------------------------------------------
# Operator registration: torch.library.Library define/impl, not torch.library.custom_op.
# ---------------------------------------------------------------------------------------

# One library fragment for every minivllm op (the attention ops of
# attention/backends/triton_attn.py and the layer kernels of model_executor/layers/). The
# ops live as long as this object does, hence a module-level reference.
_LIBRARY = torch.library.Library("minivllm", "FRAGMENT")


def direct_register_custom_op(
    name: str,
    schema: str | None,
    impl: Callable[..., None],
    fake_impl: Callable[..., None],
    mutates_args: Sequence[str] = (),
) -> None:
    """Register ``torch.ops.minivllm.<name>``: ``impl`` straight behind the dispatcher.

    ``@torch.library.custom_op`` wraps every eager call in Python layers (autograd
    handling, aliasing checks of the result, in-place bookkeeping) before the
    implementation runs: about ten times the host time of ``Library.define`` +
    ``Library.impl``, which is what upstream's helper of the same name uses and this
    does. A CUDA graph replay hides the difference; an eager step (``enforce_eager``, the
    CPU, a capture's warm-up pass) pays it on every call, two attention calls and four
    layer ops per decoder layer (the Benchmarks chapter's fourteenth round). The kernels
    run under the CUDA key and, for ``TRITON_INTERPRET=1`` tests, the CPU key.

    Args:
        name: Operator name in the ``minivllm`` namespace.
        schema: Arguments and result, e.g. ``"(Tensor(a!) out, Tensor x) -> ()"``;
            ``(a!)`` marks an argument the op writes, which is how ``torch.compile``
            learns about the mutation. None infers it from ``impl``'s type hints, with
            ``mutates_args`` naming the arguments it writes (as ``custom_op`` does).
        impl: The implementation (launches the kernel).
        fake_impl: Shape-only implementation used when tracing; the ops here write
            into their arguments and return nothing, so it does nothing.
        mutates_args: With ``schema`` None: the arguments ``impl`` writes.
    """
    if schema is None:
        schema = torch.library.infer_schema(impl, mutates_args=mutates_args)
    _LIBRARY.define(name + schema)
    for dispatch_key in ("CUDA", "CPU"):
        _LIBRARY.impl(name, impl, dispatch_key)
    _LIBRARY._register_fake(name, fake_impl)


def fake_noop(*args: Any) -> None:
    """The fake implementation of an op that only mutates its arguments."""
    return None
