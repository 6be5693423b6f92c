"""Torch helpers used by more than one package.

Upstream counterpart: ``vllm/utils/torch_utils.py`` (its pinned-memory and
``async_tensor_h2d`` helpers); the packing into one page-locked buffer follows Model
Runner V2 (``vllm/v1/worker/gpu/``). The sampler's metadata (``sample/``) and the model
runner (``worker/``) both use it, so it lives below both.
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN_BYTES = 16


def copy_to_device(
    arrays: list[np.ndarray], dtype: type, device: torch.device
) -> list[torch.Tensor]:
    """Send several host arrays to ``device`` in one copy that never makes the host wait.

    From ordinary (pageable) memory, CUDA may stage a host-to-device copy synchronously,
    stalling the host until the device has caught up with everything queued before it,
    which is exactly the wait async scheduling is meant to remove. So the arrays are
    packed into one temporary page-locked buffer (Model Runner V2's approach; torch's
    caching host allocator keeps it alive until the copy has run) and copied at once;
    the results are views of one device buffer, each with its array's shape.
    """
    itemsize = np.dtype(dtype).itemsize
    # Each array starts on a 16-byte boundary: Triton specializes pointer arguments on
    # 16-byte alignment, so a view at an odd offset would compile a second variant of a
    # kernel in the middle of a run (see worker/kernel_warmup.py).
    step = max(1, ALIGN_BYTES // itemsize)
    starts, total = [], 0
    for a in arrays:
        starts.append(total)
        total += -(-a.size // step) * step
    flat = np.zeros(total, dtype=dtype)
    for a, start in zip(arrays, starts):
        flat[start : start + a.size] = a.ravel()
    host = torch.from_numpy(flat)
    if device.type == "cuda":
        packed = host.pin_memory().to(device, non_blocking=True)
    else:
        packed = host.to(device)
    return [packed[start : start + a.size].view(a.shape) for a, start in zip(arrays, starts)]


def copy_arrays_to_device(
    arrays: list[np.ndarray], dtypes: list[type], device: torch.device
) -> list[torch.Tensor]:
    """``copy_to_device`` for arrays of different integer widths: array ``i`` arrives as
    ``dtypes[i]``, all of them in one copy.

    The arrays are laid out as bytes in one buffer (each on a 16-byte boundary, as in
    ``copy_to_device``), so a step whose host work ends in int64 positions and int32
    block tables pays for one page-locked buffer and one transfer instead of two; each
    result is a view of the one device buffer, reinterpreted with its own dtype.
    """
    layout, total = [], 0
    for a, dtype in zip(arrays, dtypes, strict=True):
        nbytes = a.size * np.dtype(dtype).itemsize
        layout.append((total, nbytes))
        total += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
    flat = np.zeros(total, dtype=np.uint8)
    for a, dtype, (start, nbytes) in zip(arrays, dtypes, layout):
        flat[start : start + nbytes].view(dtype)[:] = a.ravel()
    host = torch.from_numpy(flat)
    if device.type == "cuda":
        packed = host.pin_memory().to(device, non_blocking=True)
    else:
        packed = host.to(device)
    return [
        packed[start : start + nbytes].view(_TORCH_DTYPES[np.dtype(dtype)]).view(a.shape)
        for a, dtype, (start, nbytes) in zip(arrays, dtypes, layout)
    ]


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
