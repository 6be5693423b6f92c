"""The benchmark workloads, generated exactly as published so numbers are comparable.

The throughput workload is the one nano-vllm and others publish: 256 requests; with
``random.seed(0)``, each prompt is ``randint(100, 1024)`` tokens drawn by
``randint(0, 10000)``, then each output length is ``randint(100, 1024)``; EOS ignored.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Workload:
    """Token-id prompts and the number of tokens to generate for each."""

    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        """Sum of prompt lengths."""
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        """Sum of output lengths."""
        return sum(self.output_lens)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests."""
        return Workload(self.prompts[:n], self.output_lens[:n])


def throughput_workload(
    num_requests: int = 256, seed: int = 0,
    input_len_range: tuple[int, int] = (100, 1024),
    output_len_range: tuple[int, int] = (100, 1024),
) -> Workload:
    """The community throughput workload (prompts drawn first, then output lengths).

    The length ranges only change for smoke tests; the published workload is the
    default.
    """
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(*input_len_range))]
        for _ in range(num_requests)
    ]
    output_lens = [rng.randint(*output_len_range) for _ in range(num_requests)]
    return Workload(prompts, output_lens)


def shared_prefix_workload(
    num_requests: int = 64, prefix_len: int = 4096, suffix_len: int = 32,
    output_len: int = 16, seed: int = 0,
) -> Workload:
    """Requests that share one long prefix (a system prompt, a document) and differ in a
    short suffix: the case prefix caching exists for."""
    rng = random.Random(seed)
    prefix = [rng.randint(0, 10000) for _ in range(prefix_len)]
    prompts = [
        prefix + [rng.randint(0, 10000) for _ in range(suffix_len)] for _ in range(num_requests)
    ]
    return Workload(prompts, [output_len] * num_requests)
