"""PinnedBufferPool: a ring of page-locked buffers that never overwrites bytes a queued
copy has yet to read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.utils.buffer_utils import MIN_BUFFER_BYTES, PinnedBufferPool, pinned_pool
from minivllm.utils.torch_utils import copy_arrays_to_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_pool_rejects_a_cpu_device_and_a_ring_of_one() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        PinnedBufferPool(torch.device("cpu"))
    with pytest.raises(ValueError, match="num_buffers"):
        PinnedBufferPool(torch.device("cuda", 0), num_buffers=1)


def _fill_with(value: int):
    def fill(flat: np.ndarray) -> None:
        flat[:] = value

    return fill


@pytest.mark.gpu
@needs_cuda
def test_ring_waits_for_queued_copies_before_reusing_a_buffer() -> None:
    """Three laps of a ring of four while the stream is held up by a long kernel: every
    copy is queued behind it, so without the per-buffer event the fifth fill would
    overwrite bytes the first copy has not read yet."""
    device = torch.device("cuda", torch.cuda.current_device())
    pool = PinnedBufferPool(device, num_buffers=4)
    torch.cuda._sleep(50_000_000)  # ~tens of ms on the current stream
    outs = [pool.copy_to_device(4096, _fill_with(i)) for i in range(12)]
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert out.device == device and out.dtype == torch.uint8
        assert bool((out == i).all()), f"copy {i} was overwritten before it ran"


@pytest.mark.gpu
@needs_cuda
def test_buffers_grow_to_the_largest_copy_and_are_reused() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    pool = PinnedBufferPool(device, num_buffers=2)
    small = pool.copy_to_device(10, _fill_with(1))
    big = pool.copy_to_device(MIN_BUFFER_BYTES + 1, _fill_with(2))
    again = pool.copy_to_device(100, _fill_with(3))  # buffer 0 again, no new allocation
    torch.cuda.synchronize()
    assert small.numel() == 10 and bool((small == 1).all())
    assert big.numel() == MIN_BUFFER_BYTES + 1 and bool((big == 2).all())
    assert bool((again == 3).all())
    assert pool._buffers[1].numel() == 2 * MIN_BUFFER_BYTES
    assert pool._buffers[0].numel() == MIN_BUFFER_BYTES
    assert all(b.is_pinned() for b in pool._buffers)


@pytest.mark.gpu
@needs_cuda
def test_copies_reuse_one_pool_per_device() -> None:
    """copy_arrays_to_device goes through the device's pool: no pinned allocation per
    call, and the default device and its explicit index share one pool."""
    index = torch.cuda.current_device()
    assert pinned_pool(torch.device("cuda")) is pinned_pool(torch.device("cuda", index))
    pool = pinned_pool(torch.device("cuda", index))
    before = list(pool._buffers)
    for step in range(2 * len(before)):
        (out,) = copy_arrays_to_device([np.full(7, step)], [np.int64], torch.device("cuda"))
        assert out.tolist() == [step] * 7
    assert all(b is not None for b in pool._buffers)
    assert all(a is None or a is b for a, b in zip(before, pool._buffers))
