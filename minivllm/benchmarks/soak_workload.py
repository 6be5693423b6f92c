"""The soak test's random workload: prompts, sampling parameters and abort points.

Everything is drawn from one ``random.Random(seed)``, so a seed names a workload: a
failing soak run is reproduced by running it again with the same ``--seed``.

What the workload mixes, and why each part is there:

- prompt lengths from 1 token up to what ``max_model_len`` leaves after the output, so
  the shortest and the longest requests meet the scheduler's edge cases (a one-token
  prefill; a prompt that fills most of the pool and preempts the others);
- shared prefixes of several blocks, so the prefix cache hits, and evicts, while
  requests that hold those blocks are preempted or aborted;
- greedy and seeded random sampling with temperature, top-p, top-k, min-p, the three
  penalties, logprobs, stop strings, stop token ids, ``n`` up to 3, ``max_tokens`` from
  1, ``ignore_eos`` and ``min_tokens``: each is a separate stage of the sampler or the
  output processor, with its own per-request state that a batch must keep apart;
- all three output kinds (``FINAL_ONLY``, ``CUMULATIVE``, ``DELTA``);
- random aborts at a random point of the request's life (before it is scheduled, in
  its prefill, in its decode).

A few requests are random without a seed: they cannot be compared with a reference run,
but they still share batches with the others and must not leak.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from minivllm.sampling_params import RequestOutputKind, SamplingParams

# Stop strings: short ones end requests early and often (so the stop-string path and
# the abort of a request the core still runs are exercised), long ones rarely.
STOP_WORDS = (" ", "e", "th", ",", ".", "\n", " the", " and", "LORD", "unto", "zq#never")


@dataclass
class SoakRequest:
    """One request of the workload.

    Attributes:
        index: Position in the workload (request ids are built from it).
        prompt_token_ids: The prompt, as token ids.
        params: Its sampling parameters (``output_kind`` included).
        abort_after: None to let it finish; else how far it gets before it is aborted:
            engine steps since it was added (offline engine) or outputs received
            (AsyncLLM, server); 0 aborts it before it is ever scheduled.
        arrival_delay_s: Pause before the request is sent (AsyncLLM, server).
    """

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    abort_after: int | None
    arrival_delay_s: float = 0.0

    @property
    def comparable(self) -> bool:
        """Whether a reference run must reproduce it: greedy, or random with a seed."""
        return self.params.temperature == 0.0 or self.params.seed is not None


@dataclass
class WorkloadShape:
    """The bounds the workload is drawn within.

    Attributes:
        vocab_size: Token ids are drawn from ``[first_token_id, vocab_size)``.
        max_model_len: Prompt plus output never exceeds it.
        block_size: Shared prefixes are whole numbers of blocks, so they can be cached.
        max_output_tokens: Upper bound of ``max_tokens``.
        first_token_id: Skips the special tokens at the bottom of the vocabulary.
        stop_token_ids: Ids a request may stop on (common tokens, so they do stop).
        abort_rate: Fraction of requests aborted.
        mean_arrival_s: Mean pause between two arrivals (exponential).
    """

    vocab_size: int
    max_model_len: int
    block_size: int = 16
    max_output_tokens: int = 48
    first_token_id: int = 3
    stop_token_ids: tuple[int, ...] = ()
    abort_rate: float = 0.1
    mean_arrival_s: float = 0.002


def make_workload(num_requests: int, seed: int, shape: WorkloadShape) -> list[SoakRequest]:
    """Draw ``num_requests`` requests from ``seed`` (see the module docstring)."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not 0.0 <= shape.abort_rate <= 1.0:
        raise ValueError(f"abort_rate must be in [0, 1], got {shape.abort_rate}")
    rng = random.Random(seed)
    prefixes = [_random_ids(rng, shape, shape.block_size * rng.randint(1, 4)) for _ in range(8)]
    return [_make_request(i, rng, shape, prefixes) for i in range(num_requests)]


def _random_ids(rng: random.Random, shape: WorkloadShape, n: int) -> list[int]:
    return [rng.randrange(shape.first_token_id, shape.vocab_size) for _ in range(n)]


def _make_request(
    index: int, rng: random.Random, shape: WorkloadShape, prefixes: list[list[int]]
) -> SoakRequest:
    params = _random_params(rng, shape)
    room = shape.max_model_len - params.max_tokens
    kind = rng.random()
    if kind < 0.1:
        prompt = _random_ids(rng, shape, 1)
    elif kind < 0.2:
        # Near the longest prompt that still fits the context.
        prompt = _random_ids(rng, shape, rng.randint(max(1, room - 8), room))
    else:
        prompt = []
        if kind < 0.7:
            prompt = list(rng.choice(prefixes))
        suffix = rng.randint(1, 48)
        prompt = (prompt + _random_ids(rng, shape, suffix))[:room]
    abort_after = None
    if rng.random() < shape.abort_rate:
        abort_after = rng.choice([0, 1, 2, rng.randint(3, 40)])
    delay = rng.expovariate(1.0 / shape.mean_arrival_s) if shape.mean_arrival_s > 0 else 0.0
    return SoakRequest(index, prompt, params, abort_after, delay)


def _random_params(rng: random.Random, shape: WorkloadShape) -> SamplingParams:
    kw: dict[str, Any] = {}
    draw = rng.random()
    if draw < 0.5:
        kw["temperature"] = 0.0
    else:
        kw["temperature"] = rng.choice([0.3, 0.7, 1.0, 1.5])
        kw["top_p"] = rng.choice([1.0, 1.0, 0.9, 0.5])
        kw["top_k"] = rng.choice([0, 0, 1, 5, 50])
        kw["min_p"] = rng.choice([0.0, 0.0, 0.05, 0.2])
        if draw >= 0.55:  # 5% stay unseeded: run, never compared
            kw["seed"] = rng.randrange(2**31)
    if rng.random() < 0.3:
        kw["presence_penalty"] = rng.choice([0.0, 0.5, -0.5, 1.0])
        kw["frequency_penalty"] = rng.choice([0.0, 0.3, -0.3])
        kw["repetition_penalty"] = rng.choice([1.0, 1.2, 0.9])
    # n > 1 needs random sampling (greedy samples would all be equal).
    kw["n"] = 1 if kw["temperature"] == 0.0 else rng.choice([1, 1, 2, 3])
    kw["max_tokens"] = 1 if rng.random() < 0.1 else rng.randint(2, shape.max_output_tokens)
    if rng.random() < 0.2:
        kw["min_tokens"] = rng.randint(0, kw["max_tokens"])
    kw["ignore_eos"] = rng.random() < 0.2
    if rng.random() < 0.25:
        kw["stop"] = rng.sample(STOP_WORDS, rng.randint(1, 2))
        kw["include_stop_str_in_output"] = rng.random() < 0.3
    if shape.stop_token_ids and rng.random() < 0.15:
        kw["stop_token_ids"] = rng.sample(list(shape.stop_token_ids), 1)
    if rng.random() < 0.2:
        kw["logprobs"] = rng.choice([0, 1, 5])
    kw["output_kind"] = rng.choice(list(RequestOutputKind))
    return SamplingParams(**kw)
