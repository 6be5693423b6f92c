"""The sampler's host work per step, for ``minivllm bench sampler``: what async scheduling
must hide behind the GPU's step, apart from the device time the rest of the benchmark
measures.

Each figure is the median host time of one call, timed between two device
synchronizations so no queue of earlier work is in it (the call itself only queues
kernels and copies):

- ``metadata_build``: ``SamplingMetadata.from_requests`` for the rows (temperature, and
  greedy for comparison): a Python walk over the requests and a copy to the device.
- ``metadata_reused``: ``SamplingMetadataCache.get`` for the same requests again, what a
  decode step whose batch did not change pays instead.
- ``sample_row_keys``: the one-pass sampler with one seeded row, so every row gets its
  own Philox key and position, built on the host and copied (what every temperature
  step paid before batch keys).
- ``sample_batch_key``: the same rows unseeded, one key for the batch as an argument.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from minivllm.request import Request
from minivllm.sample.metadata import SamplingMetadata, SamplingMetadataCache
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def host_us(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Median host microseconds of ``fn()``, each call started on an idle device."""
    times = []
    for _ in range(calls):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def make_requests(n: int, temperature: float, seeded_rows: int = 0) -> list[Request]:
    """``n`` one-token-prompt requests at ``temperature``, the first ``seeded_rows`` seeded."""
    return [
        Request(str(i), [1], SamplingParams(temperature=temperature,
                                            seed=i if i < seeded_rows else None))
        for i in range(n)
    ]  # fmt: skip


def sampler_host_costs(
    logits: torch.Tensor, temperature: float, gen: torch.Generator, calls: int
) -> dict[str, Any]:
    """Host microseconds per step of the sampling metadata and the one-pass sampler at
    ``logits``' shape (see the module docstring)."""
    rows, vocab = logits.shape
    device = logits.device
    sampled, greedy = make_requests(rows, temperature), make_requests(rows, 0.0)

    def build(requests: list[Request]) -> SamplingMetadata:
        return SamplingMetadata.from_requests(requests, device, {}, vocab)

    cache = SamplingMetadataCache()
    cache.get(sampled, lambda: build(sampled))
    seeded = make_requests(rows, temperature, seeded_rows=1)
    seeded_md = SamplingMetadata.from_requests(
        seeded, device, {"0": torch.Generator(device=device).manual_seed(0)}, vocab
    )
    plain_md = build(sampled)
    sampler = Sampler(gen, use_gumbel_kernel=True)
    sampler(logits, seeded_md)  # compile both key modes before timing
    sampler(logits, plain_md)
    return {
        "calls": calls,
        "metadata_build_us": host_us(lambda: build(sampled), device, calls),
        "metadata_build_greedy_us": host_us(lambda: build(greedy), device, calls),
        "metadata_reused_us": host_us(
            lambda: cache.get(sampled, lambda: build(sampled)), device, calls
        ),  # fmt: skip
        "sample_row_keys_us": host_us(lambda: sampler(logits, seeded_md), device, calls),
        "sample_batch_key_us": host_us(lambda: sampler(logits, plain_md), device, calls),
    }
