"""Per-batch sampling inputs, gathered once per step from the requests that sample.

Upstream counterpart: ``vllm/v1/sample/metadata.py`` (``SamplingMetadata``), filled by
``InputBatch._make_sampling_metadata`` in ``vllm/v1/worker/gpu_input_batch.py``. The
sampler works on whole-batch tensors; this is where per-request Python values become
those tensors. Each optional pass of the sampler has a tensor here that is None when no
row of the batch uses it, so a plain batch pays for none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.request import Request
from minivllm.sampling_params import SamplingType
from minivllm.utils.torch_utils import copy_to_device


@dataclass
class SamplingMetadata:
    """Sampling settings of the rows of one logits tensor (one row per request).

    Attributes:
        temperature: ``[num_reqs]`` float32, 0 on greedy rows; None when all greedy.
        all_greedy: Every row is greedy: skip temperature, filters and the random draw.
        all_random: No row is greedy: skip the greedy argmax.
        top_p: ``[num_reqs]`` float32 (1 = off), or None when no row uses top-p.
        top_k: ``[num_reqs]`` int64 (``vocab_size`` = off), or None when no row uses it.
        min_p: ``[num_reqs]`` float32 (0 = off), or None when no row uses min-p.
        generators: Row index -> that request's seeded generator.
        max_num_logprobs: Largest ``logprobs`` of any row, or None when no row wants
            logprobs.
        prompt_token_ids: ``[num_reqs, max_prompt_len]`` int64 padded with
            ``vocab_size``; None when no row uses a penalty.
        output_token_ids: Same for the tokens generated so far.
        presence_penalties: ``[num_reqs]`` float32 (None when no penalties).
        frequency_penalties: ``[num_reqs]`` float32.
        repetition_penalties: ``[num_reqs]`` float32.
        min_tokens_rows: ``[n]`` row of each (row, stop token) pair to forbid because
            the row has not generated ``min_tokens`` yet; None when there are none.
        min_tokens_token_ids: ``[n]`` the token of each pair.
        one_pass: Host ``[num_reqs]`` bool: the row's token is a draw from
            ``softmax(logits / T)`` or the argmax, nothing else changes its logits (no
            filter, penalty or min_tokens mask this step), so the one-pass Gumbel kernel
            may sample it (``sample/gumbel.py``). None when all rows are greedy.
        seeds: Row -> (request seed, position of the token the row samples), for seeded
            requests: the one-pass kernel's noise for the row comes from these alone.
    """

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None
    prompt_token_ids: torch.Tensor | None = None
    output_token_ids: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    min_tokens_rows: torch.Tensor | None = None
    min_tokens_token_ids: torch.Tensor | None = None
    one_pass: np.ndarray | None = None
    seeds: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def reusable(self) -> bool:
        """Nothing here depends on the requests' progress: no seeded rows (their
        positions move every step), no penalties (they read the tokens), no min_tokens
        masks. The same requests in the same order would get the same metadata."""
        return (
            not self.seeds
            and not self.generators
            and self.no_penalties
            and self.min_tokens_rows is None
        )

    @property
    def no_penalties(self) -> bool:
        """True when the penalty pass can be skipped."""
        return self.repetition_penalties is None

    @classmethod
    def from_requests(
        cls,
        requests: list[Request],
        device: torch.device,
        generators: dict[str, torch.Generator],
        vocab_size: int,
        in_flight_ids: Collection[str] = (),
        read_in_flight: Callable[[], dict[str, int]] | None = None,
    ) -> SamplingMetadata:
        """Gather the settings of ``requests`` (one logits row each, in order).

        Args:
            requests: The requests sampling this step.
            device: Where the logits live.
            generators: request_id -> generator for seeded requests (owned by the runner
                so that a request's random stream survives across steps and preemption).
            vocab_size: Width of the logits (pad id for token tensors, "off" for top-k).
            in_flight_ids: Requests whose latest output token was sampled by the
                previous step but is not yet appended to the request (async scheduling):
                min_tokens counts it.
            read_in_flight: Returns those tokens' values (request id -> token), waiting
                for the previous step if need be; called only when a row uses penalties,
                which read the tokens themselves.
        """
        params = [r.sampling_params for r in requests]
        temps = [p.temperature for p in params]
        all_greedy = all(t == 0.0 for t in temps)
        all_random = all(t != 0.0 for t in temps)

        def to_dev(values: list, dtype: type) -> torch.Tensor:
            return copy_to_device([np.asarray(values, dtype)], dtype, device)[0]

        md = cls(
            temperature=None if all_greedy else to_dev(temps, np.float32),
            all_greedy=all_greedy,
            all_random=all_random,
        )
        if not all_greedy:
            # Filters only matter for random rows; greedy params already carry "off".
            if any(p.top_p < 1.0 for p in params):
                md.top_p = to_dev([p.top_p for p in params], np.float32)
            if any(p.top_k > 0 for p in params):
                ks = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
                md.top_k = to_dev(ks, np.int64)
            if any(p.min_p > 0.0 for p in params):
                md.min_p = to_dev([p.min_p for p in params], np.float32)
            for i, r in enumerate(requests):
                if r.sampling_params.sampling_type == SamplingType.RANDOM_SEED:
                    md.generators[i] = generators[r.request_id]
                    # The position of the token sampled now, the same whether or not
                    # the previous token is still in flight (async scheduling).
                    num_tokens = len(r.prompt_token_ids) + r.num_output_tokens
                    in_flight = r.request_id in in_flight_ids
                    md.seeds[i] = (r.sampling_params.seed, num_tokens + in_flight)
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        md.max_num_logprobs = max(wanted) if wanted else None
        if any(_uses_penalties(p) for p in params):
            in_flight = read_in_flight() if in_flight_ids and read_in_flight else {}
            md.prompt_token_ids = to_dev_padded(
                [r.prompt_token_ids for r in requests], vocab_size, device
            )
            md.output_token_ids = to_dev_padded(
                [_output_ids(r, in_flight) for r in requests], vocab_size, device
            )
            md.presence_penalties = to_dev([p.presence_penalty for p in params], np.float32)
            md.frequency_penalties = to_dev([p.frequency_penalty for p in params], np.float32)
            md.repetition_penalties = to_dev([p.repetition_penalty for p in params], np.float32)
        min_tokens_rows = _add_min_tokens(md, requests, device, vocab_size, in_flight_ids)
        if not all_greedy:
            md.one_pass = _one_pass_rows(md, params, min_tokens_rows)
        return md


def _one_pass_rows(md: SamplingMetadata, params: list, min_tokens_rows: set[int]) -> np.ndarray:
    """Which rows need nothing but temperature (or greedy): see ``one_pass``.

    A function of each request's own parameters and progress only, never of the batch,
    so a seeded request takes the same path (and draws the same noise) in any batch.
    """
    if md.top_p is md.top_k is md.min_p is None and md.no_penalties and not min_tokens_rows:
        return np.ones(len(params), dtype=bool)
    ok = np.fromiter(
        (
            not _uses_penalties(p)
            and (p.temperature == 0.0 or (p.top_p == 1.0 and p.top_k <= 0 and p.min_p == 0.0))
            for p in params
        ),
        dtype=bool,
        count=len(params),
    )
    ok[list(min_tokens_rows)] = False
    return ok


def _output_ids(request: Request, in_flight: dict[str, int]) -> list[int]:
    token = in_flight.get(request.request_id)
    return request.output_token_ids if token is None else [*request.output_token_ids, token]


def _uses_penalties(params) -> bool:
    return (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    )


def to_dev_padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """Stack ragged id lists into one ``[len(rows), max_len]`` int64 tensor.

    Each row is copied as a whole (a C-level slice copy), never token by token; the
    padding id ``pad`` (= vocab size) falls into the penalty histogram's spare column.
    """
    out = np.full((len(rows), max(1, max(map(len, rows)))), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return copy_to_device([out], np.int64, device)[0]


def _add_min_tokens(
    md: SamplingMetadata,
    requests: list[Request],
    device: torch.device,
    vocab_size: int,
    in_flight_ids: Collection[str],
) -> set[int]:
    """Fill the (row, token) pairs that min_tokens forbids this step; return the rows."""
    rows: list[int] = []
    token_ids: list[int] = []
    for i, r in enumerate(requests):
        p = r.sampling_params
        if p.min_tokens and r.num_output_tokens + (r.request_id in in_flight_ids) < p.min_tokens:
            # An id outside the vocabulary can never be sampled, so it needs no mask.
            stop_ids = sorted(t for t in p.min_tokens_stop_ids if 0 <= t < vocab_size)
            rows += [i] * len(stop_ids)
            token_ids += stop_ids
    if rows:
        md.min_tokens_rows, md.min_tokens_token_ids = copy_to_device(
            [np.asarray(rows), np.asarray(token_ids)], np.int64, device
        )
    return set(rows)


class SamplingMetadataCache:
    """The last step's metadata, handed out again while the same requests sample in the
    same order and nothing in it moves with their progress (``SamplingMetadata.reusable``).

    Building the metadata walks every request in Python and copies the settings to the
    device: at 256 temperature-sampled rows 165 to 294 us of host time per step on the
    hosts of two H200 leases (59 to 114 us greedy; ``minivllm bench sampler``,
    docs/benchmarks/perf9/sampler*.json), in a step loop whose host work must stay
    shorter than the GPU's step for async scheduling to hide it. A decode phase samples the same
    requests step after step, so most steps need no new metadata. Upstream keeps the
    same idea in its persistent batch (``InputBatch.refresh_metadata`` in
    ``vllm/v1/worker/gpu_input_batch.py`` rebuilds the sampling metadata only when the
    batch changed).
    """

    def __init__(self) -> None:
        self._requests: list[Request] = []
        self._metadata: SamplingMetadata | None = None
        self.hits = 0

    def get(
        self, requests: list[Request], build: Callable[[], SamplingMetadata]
    ) -> SamplingMetadata:
        """The cached metadata if ``requests`` are the cached ones in the same order,
        else ``build()`` (kept for the next step when it is reusable)."""
        # List equality tests identity first, element by element, in C (Request has no
        # __eq__, so two distinct requests are never equal): a fraction of a microsecond
        # for 256 rows, where a tuple of ids as the key cost more than the rebuild it saved
        # on the greedy path.
        if self._metadata is not None and requests == self._requests:
            self.hits += 1
            return self._metadata
        metadata = build()
        if metadata.reusable:
            self._requests, self._metadata = list(requests), metadata
        else:
            self.clear()
        return metadata

    def clear(self) -> None:
        """Forget the cached metadata (and the requests it holds)."""
        self._requests, self._metadata = [], None
