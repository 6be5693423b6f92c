"""Torch helpers used by more than one package.

Upstream counterpart: ``vllm/utils/torch_utils.py`` (its pinned-memory and
``async_tensor_h2d`` helpers); the packing into one page-locked buffer, reused from a
ring, follows Model Runner V2 (``vllm/v1/worker/gpu/buffer_utils.py``). The sampler's
metadata (``sample/``) and the model runner (``worker/``) both use it, so it lives below
both.
"""

from __future__ import annotations

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
