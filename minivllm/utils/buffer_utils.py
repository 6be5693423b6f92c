"""Page-locked staging buffers, allocated once and reused for every host-to-device copy.

Upstream counterpart: ``UvaBufferPool`` in ``vllm/v1/worker/gpu/buffer_utils.py`` (Model
Runner V2), which keeps a few pinned buffers per input and fills them round robin through
a numpy view, and whose ``async_copy_to_gpu`` notes that an explicit ``pin_memory()`` per
copy "causes sporadic stalls". minivllm found its own reason on the H200 machine: each
``pin_memory()`` of a step's packed inputs was a torch CPU copy, large enough that torch
ran it on its OpenMP pool, whose threads then spun on every core through the whole run,
beside the one thread that schedules and launches the steps (Benchmarks, eighth round).

Here a step's bytes go into one of a ring of pinned buffers by numpy (one thread, no torch
op), and one non-blocking copy sends them. A buffer is written again only after the copy
that last read it has run: each keeps a CUDA event recorded after its copy, and the ring
waits on it before reuse. With async scheduling at most two steps are queued, so by the
time the ring comes round (``num_buffers`` copies later) the event has long completed and
the wait costs nothing; the event makes that a guarantee rather than an assumption
(upstream relies on the ring size alone).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

#: Smallest buffer allocated (a decode step of 256 requests packs ~100 KB).
MIN_BUFFER_BYTES = 1 << 20


class PinnedBufferPool:
    """A ring of page-locked host buffers for non-blocking copies to one CUDA device.

    Args:
        device: The CUDA device the copies go to.
        num_buffers: Buffers in the ring (copies in flight before a reuse would wait).
    """

    def __init__(self, device: torch.device, num_buffers: int = 8) -> None:
        if device.type != "cuda":
            raise ValueError(f"PinnedBufferPool needs a CUDA device, got {device}")
        if num_buffers < 2:
            raise ValueError(f"num_buffers must be >= 2, got {num_buffers}")
        self.device = device
        self._buffers: list[torch.Tensor | None] = [None] * num_buffers
        self._events = [torch.cuda.Event() for _ in range(num_buffers)]
        self._recorded = [False] * num_buffers
        self._next = 0
        # The engine core's thread fills inputs; a TP worker's reply thread may copy too.
        self._lock = threading.Lock()

    def copy_to_device(self, nbytes: int, fill: Callable[[np.ndarray], None]) -> torch.Tensor:
        """Let ``fill`` write ``nbytes`` bytes into the next pinned buffer (a uint8 numpy
        view), queue one non-blocking copy of them, and return the device's uint8 tensor.
        """
        with self._lock:
            i = self._next
            self._next = (i + 1) % len(self._buffers)
            if self._recorded[i]:
                # Normally long complete; only a ring lapping queued copies waits here.
                self._events[i].synchronize()
            buf = self._buffers[i]
            if buf is None or buf.numel() < nbytes:
                size = max(MIN_BUFFER_BYTES, 1 << max(0, nbytes - 1).bit_length())
                buf = self._buffers[i] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            fill(buf.numpy()[:nbytes])
            out = buf[:nbytes].to(self.device, non_blocking=True)
            self._events[i].record(torch.cuda.current_stream(self.device))
            self._recorded[i] = True
            return out


_POOLS: dict[torch.device, PinnedBufferPool] = {}
_POOLS_LOCK = threading.Lock()


def pinned_pool(device: torch.device) -> PinnedBufferPool:
    """The process's staging pool for ``device`` (created on first use)."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    pool = _POOLS.get(device)
    if pool is None:
        with _POOLS_LOCK:
            pool = _POOLS.setdefault(device, PinnedBufferPool(device))
    return pool
