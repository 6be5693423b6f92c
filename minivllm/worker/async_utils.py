"""A step's output that is still being computed: the handle async scheduling waits on.

Upstream counterparts: ``AsyncOutput`` in ``vllm/v1/worker/gpu/async_utils.py`` (Model
Runner V2) and ``AsyncGPUModelRunnerOutput`` in ``vllm/v1/worker/gpu_model_runner.py``.

``ModelRunner.execute_model_async`` only *queues* a step on the GPU: the forward pass,
the sampler, and a copy of the sampled ids into page-locked host memory. It returns at
once with this handle, so the engine can schedule and queue the next step while the GPU
works. ``get_output`` is the one place the host waits for the device: it blocks on a
CUDA event recorded after the copy, and only then turns the ids into Python ints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from minivllm.sample.logprobs import LogprobsTensors
    from minivllm.worker.model_runner import ModelRunnerOutput


class AsyncOutput:
    """The sampled tokens of one queued step, readable once the device has them.

    Args:
        output: The step's output with everything but ``sampled_token_ids`` and
            ``logprobs`` filled in (those are still on the device).
        sampled_token_ids: ``[num_sampling_reqs]`` int64 on the device.
        logprobs_tensors: The sampler's logprobs on the device, or None.
    """

    def __init__(
        self,
        output: ModelRunnerOutput,
        sampled_token_ids: torch.Tensor | None,
        logprobs_tensors: LogprobsTensors | None = None,
    ) -> None:
        self._output = output
        self._logprobs_tensors = logprobs_tensors
        self._ready = sampled_token_ids is None
        self._event: torch.cuda.Event | None = None
        self._sampled_cpu: torch.Tensor | None = None
        if sampled_token_ids is None:
            return
        # A device-to-host copy with non_blocking=True lands in pinned memory and does
        # not make the host wait; the event marks when it has really arrived.
        self._sampled_cpu = sampled_token_ids.to("cpu", non_blocking=True)
        if sampled_token_ids.is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the step to finish on the device and return its output (idempotent)."""
        if not self._ready:
            if self._event is not None:
                self._event.synchronize()
            assert self._sampled_cpu is not None
            self._output.sampled_token_ids = self._sampled_cpu.tolist()
            if self._logprobs_tensors is not None:
                self._output.logprobs = self._logprobs_tensors.tolists()
            self._ready = True
            self._sampled_cpu = self._logprobs_tensors = None
        return self._output


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
    flat = np.concatenate([a.ravel() for a in arrays]).astype(dtype, copy=False)
    host = torch.from_numpy(flat)
    if device.type == "cuda":
        packed = host.pin_memory().to(device, non_blocking=True)
    else:
        packed = host.to(device)
    out, offset = [], 0
    for a in arrays:
        out.append(packed[offset : offset + a.size].view(a.shape))
        offset += a.size
    return out
