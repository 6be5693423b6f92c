"""A step's output that is still being computed: the handle async scheduling waits on.

Upstream counterparts: ``AsyncOutput`` in ``vllm/v1/worker/gpu/async_utils.py`` (Model
Runner V2) and ``AsyncGPUModelRunnerOutput`` in ``vllm/v1/worker/gpu_model_runner.py``,
both implementations of ``AsyncModelRunnerOutput`` (``vllm/v1/outputs.py``; here
``minivllm/runner_outputs.py``), the interface the executor and the engine see.

``ModelRunner.execute_model_async`` only *queues* a step on the GPU: the forward pass,
the sampler, and a copy of the sampled ids into page-locked host memory. It returns at
once with this handle, so the engine can schedule and queue the next step while the GPU
works. ``get_output`` is the one place the host waits for the device: it blocks on a
CUDA event recorded after the copy, and only then turns the ids into Python ints.

The copy also carries which rows failed: a row whose logits were not finite travels
as token id -1 (the device-side ids the next step reads keep a valid token), so the
check costs no second copy and no second wait.
"""

from __future__ import annotations

import threading

import torch

from minivllm.runner_outputs import (
    NONFINITE_LOGITS_ERROR,
    AsyncModelRunnerOutput,
    LogprobsTensors,
    ModelRunnerOutput,
)


class AsyncOutput(AsyncModelRunnerOutput):
    """The sampled tokens of one queued step, readable once the device has them.

    Args:
        output: The step's output with everything but ``sampled_token_ids`` and
            ``logprobs`` filled in (those are still on the device).
        sampled_token_ids: ``[num_sampling_reqs]`` int64 on the device.
        logprobs_tensors: The sampler's logprobs on the device, or None.
        logits_finite: ``[num_sampling_reqs]`` bool on the device (False: that row's
            request failed), or None.
        num_accepted: ``[num_sampling_reqs]`` drafts each request accepted (speculative
            decoding), or None.
        draft_token_ids: ``[num_sampling_reqs, k]`` the draft model's proposals for
            the next step, or None.
    """

    def __init__(
        self,
        output: ModelRunnerOutput,
        sampled_token_ids: torch.Tensor | None,
        logprobs_tensors: LogprobsTensors | None = None,
        logits_finite: torch.Tensor | None = None,
        num_accepted: torch.Tensor | None = None,
        draft_token_ids: torch.Tensor | None = None,
    ) -> None:
        self._output = output
        self._logprobs_tensors = logprobs_tensors
        self._ready = sampled_token_ids is None and draft_token_ids is None
        self._event: torch.cuda.Event | None = None
        self._sampled_cpu: torch.Tensor | None = None
        # Speculative decoding's counts and drafts travel the same way as the tokens,
        # so the host never waits for them before get_output().
        self._accepted_cpu = _to_host(num_accepted)
        self._drafts_cpu = _to_host(draft_token_ids)
        # A TP worker's reply thread and its main thread (reading the tokens in flight
        # for the penalties) may both ask.
        self._lock = threading.Lock()
        if sampled_token_ids is not None:
            if logits_finite is not None:
                sampled_token_ids = torch.where(logits_finite, sampled_token_ids, -1)
            self._sampled_cpu = _to_host(sampled_token_ids)
        if self._ready:
            return
        if (draft_token_ids if sampled_token_ids is None else sampled_token_ids).is_cuda:
            # The event marks when every copy queued above has really arrived.
            self._event = torch.cuda.Event()
            self._event.record()

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the step to finish on the device and return its output (idempotent,
        thread-safe)."""
        with self._lock:
            if not self._ready:
                self._resolve()
        return self._output

    def _resolve(self) -> None:
        if self._event is not None:
            self._event.synchronize()
        if self._accepted_cpu is not None:
            self._output.num_accepted_tokens = self._accepted_cpu.tolist()
        if self._drafts_cpu is not None:
            self._output.draft_token_ids = self._drafts_cpu.tolist()
        self._accepted_cpu = self._drafts_cpu = None
        if self._sampled_cpu is None:  # a step of prefill chunks only: drafts, no token
            self._ready = True
            return
        ids = self._sampled_cpu.tolist()
        self._output.sampled_token_ids = ids
        if -1 in ids:  # a C-level scan; a failed row is rare
            req_ids = self._output.req_ids
            for row, token in enumerate(ids):
                if token == -1:
                    self._output.errors[req_ids[row]] = NONFINITE_LOGITS_ERROR
        if self._logprobs_tensors is not None:
            self._output.logprobs = self._logprobs_tensors.tolists()
        self._ready = True
        self._sampled_cpu = self._logprobs_tensors = None


def _to_host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Queue a copy to the host: with non_blocking=True a device tensor lands in pinned
    memory without making the host wait (read it only after the step's event)."""
    return None if tensor is None else tensor.to("cpu", non_blocking=True)
