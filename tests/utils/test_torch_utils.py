"""copy_to_device and copy_arrays_to_device: one packed copy, every array back intact (in
its own dtype) and 16-byte aligned."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.utils.torch_utils import ALIGN_BYTES, copy_arrays_to_device, copy_to_device


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_arrays_round_trip_aligned(dtype: type) -> None:
    # Odd sizes (and an empty one) would put later arrays at unaligned offsets if packed
    # back to back; Triton would then compile a second variant of a kernel mid-run. Every
    # shape comes back: 1-D, 2-D and 0-D.
    arrays = [np.arange(3), np.arange(5) * 7, np.zeros(0), np.arange(6).reshape(2, 3), np.array(4)]
    out = copy_to_device(arrays, dtype, torch.device("cpu"))
    for host, dev in zip(arrays, out):
        assert dev.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
        assert tuple(dev.shape) == host.shape
        assert (dev.numpy() == host).all()
        assert dev.data_ptr() % ALIGN_BYTES == 0


def test_mixed_widths_round_trip_aligned_in_one_buffer() -> None:
    # int64 and int32 side by side, odd sizes and an empty 2-D one: each comes back in its
    # own dtype, cast from whatever the host array held, aligned, all views of one buffer.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arrays = [np.arange(3), np.arange(5, dtype=np.int32) * 7, np.zeros((0, 2)), -np.arange(6)]
    arrays.append(np.arange(6).reshape(2, 3))
    dtypes = [np.int64, np.int32, np.int64, np.int32, np.int32]
    out = copy_arrays_to_device(arrays, dtypes, device)
    for host, dtype, dev in zip(arrays, dtypes, out):
        assert dev.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
        assert tuple(dev.shape) == host.shape
        assert (dev.cpu().numpy() == host).all()
        assert dev.data_ptr() % ALIGN_BYTES == 0
    assert len({t.untyped_storage().data_ptr() for t in out}) == 1
    with pytest.raises(ValueError):
        copy_arrays_to_device(arrays, dtypes[:-1], device)


def test_cuda_context_is_broken_is_false_off_cuda_and_on_a_healthy_gpu() -> None:
    """Off CUDA nothing can break a context; a GPU that just ran a kernel is healthy."""
    from minivllm.utils.torch_utils import cuda_context_is_broken

    assert cuda_context_is_broken(torch.device("cpu")) is False
    if torch.cuda.is_available():
        torch.ones(4, device="cuda").sum().item()
        assert cuda_context_is_broken(torch.device("cuda:0")) is False


def _scale_into(out: torch.Tensor, x: torch.Tensor, factor: float, bias: int | None = None) -> None:
    out.copy_(x * factor + (bias or 0))


def test_direct_register_custom_op_infers_the_schema_and_marks_what_it_writes() -> None:
    from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop

    direct_register_custom_op("_test_scale_into", None, _scale_into, fake_noop, ("out",))
    op = torch.ops.minivllm._test_scale_into
    assert str(op.default._schema) == (
        "minivllm::_test_scale_into(Tensor(a0!) out, Tensor x, float factor, "
        "SymInt? bias=None) -> ()"
    )
    out = torch.zeros(3)
    op(out, torch.arange(3.0), 2.0, 1)
    assert out.tolist() == [1.0, 3.0, 5.0]
    torch.library.opcheck(op, (torch.zeros(3), torch.ones(3), 0.5))


def test_direct_register_custom_op_takes_an_explicit_schema() -> None:
    from minivllm.utils.torch_utils import direct_register_custom_op, fake_noop

    def double(out: torch.Tensor, x: torch.Tensor) -> None:
        out.copy_(2 * x)

    direct_register_custom_op("_test_double", "(Tensor(a!) out, Tensor x) -> ()", double, fake_noop)
    out = torch.zeros(2)
    torch.ops.minivllm._test_double(out, torch.ones(2))
    assert out.tolist() == [2.0, 2.0]
