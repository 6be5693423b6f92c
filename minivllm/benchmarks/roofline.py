"""The physical ceiling of a decode-heavy workload: bytes that must move, over the
measured copy bandwidth.

Every decode step must read all weights once, and every generated token must read the
K/V of every earlier token of its sequence. With all requests running together, the
fewest steps is the longest output. So the least time any engine can take is::

    (max_output_len * weight_bytes + sum over tokens of context_len * kv_bytes_per_token)
        / copy_bandwidth

Prefill compute and writes are left out (small next to decode here), which makes the
ceiling optimistic: an engine can approach it but not reach it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.benchmarks.workloads import Workload


@dataclass
class Roofline:
    """The ceiling and how it is built."""

    weight_bytes: int
    kv_bytes_per_token: int
    total_weight_read: float
    total_kv_read: float
    copy_bandwidth: float
    min_seconds: float
    max_output_tokens_per_s: float


def decode_roofline(
    workload: Workload, weight_bytes: int, kv_bytes_per_token: int, copy_bandwidth: float
) -> Roofline:
    """Ceiling throughput (output tokens/s) of ``workload`` at ``copy_bandwidth`` bytes/s."""
    steps = max(workload.output_lens)
    weights = float(steps) * weight_bytes
    token_reads = 0
    for prompt, out in zip(workload.prompts, workload.output_lens):
        p = len(prompt)
        # Output token j (0-based) attends over p + j earlier tokens plus itself.
        token_reads += out * (p + 1) + out * (out - 1) // 2
    kv = float(token_reads) * kv_bytes_per_token
    seconds = (weights + kv) / copy_bandwidth
    return Roofline(
        weight_bytes, kv_bytes_per_token, weights, kv, copy_bandwidth, seconds,
        workload.num_output_tokens / seconds,
    )
