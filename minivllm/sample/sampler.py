"""Turn one step's logits into one token per request, each with its own parameters.

Upstream counterparts: ``vllm/v1/sample/sampler.py`` (``Sampler``) and, for the same
pipeline as Triton kernels over GPU-resident state, Model Runner V2's
``vllm/v1/worker/gpu/sample/sampler.py``.

The order is vLLM's, and it matters:

1. raw logprobs (if any row wants logprobs), from the logits as the model gave them;
2. float32 copy;
3. min_tokens: forbid stop tokens (may change the argmax, so before greedy);
4. penalties: repetition, frequency, presence (also before greedy);
5. greedy argmax (rows with temperature 0 are done here);
6. temperature;
7. min_p (relative to the *tempered* top probability);
8. top-k, then top-p on what top-k kept;
9. the exponential race, per-row generators for seeded requests;
10. pick greedy or random per row; gather logprobs of the sampled tokens.

Steps 2 and 5 to 10 cost a full pass over a ``[rows, vocab]`` float32 tensor each (six
or more at Qwen3's 151,936 tokens); for the common request, temperature alone, one
Triton kernel does them in a single read of the logits (``gumbel.py``, the Gumbel-max
form of the same race). Rows that need more take the path above; in a mixed batch both
run and each row keeps its own path's token.

Beside the tokens, every row's raw logits are checked for being finite (their maximum
is a finite number: no NaN, no +inf, not all -inf). A row that fails, say an overflow
in one sequence, has no meaningful token; the runner reports that request failed and
the rest of the batch is unaffected, since every stage here works row by row. On the
all-greedy fast path the check is free: ``max`` returns the values with the argmax.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.runner_outputs import SamplerOutput
from minivllm.sample.logits_processors import apply_min_p, apply_min_tokens
from minivllm.sample.logprobs import compute_logprobs, gather_logprobs
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.penalties import apply_penalties
from minivllm.sample.topk_topp_sampler import apply_top_k_top_p, random_sample
from minivllm.utils.torch_utils import copy_to_device

_INT64 = np.iinfo(np.int64)


class Sampler(nn.Module):
    """One batched pass over all rows, every optional stage skipped when unused.

    Args:
        generator: The engine-wide generator for requests without a seed.
        use_gumbel_kernel: Sample temperature-only rows with the one-pass Triton kernel.
            None (the default): on a GPU only; on the CPU the kernel runs in Triton's
            interpreter (``TRITON_INTERPRET=1``), correct but slow, so only when asked.
    """

    def __init__(
        self, generator: torch.Generator | None = None, use_gumbel_kernel: bool | None = None
    ) -> None:
        super().__init__()
        self.generator = generator
        self.use_gumbel_kernel = use_gumbel_kernel
        # Unseeded rows get a fresh Philox key per step from here: a host generator, so
        # the keys travel to the device in the one copy that carries the seeded rows'.
        seed = generator.initial_seed() if generator is not None else torch.initial_seed()
        self._key_rng = np.random.default_rng(seed)

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of ``logits [num_reqs, vocab]``."""
        if (
            metadata.all_greedy
            and metadata.max_num_logprobs is None
            and metadata.min_tokens_rows is None
            and metadata.no_penalties
        ):
            # Nothing changes the logits: the argmax of the model's own dtype is the
            # argmax of its float32 copy (the cast is exact), so skip the copy, which
            # at 256 rows x 151,936 tokens costs more than the argmax itself. max()
            # is the argmax (first maximum, as argmax) with the values for the check.
            top, sampled = logits.max(dim=-1)
            return SamplerOutput(sampled, logits_finite=top.isfinite())
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            # vLLM's default "raw_logprobs": before any of the steps below.
            raw_logprobs = compute_logprobs(logits)
        one_pass = metadata.one_pass if self._gumbel_kernel_on(logits) else None
        if one_pass is not None and one_pass.all():
            sampled, logits_finite = self.gumbel_sample(logits, metadata)
        else:
            # One read of the raw logits; max() propagates NaN, so one value per row says it.
            logits_finite = logits.amax(dim=-1).isfinite()
            generators = metadata.generators
            if one_pass is not None and one_pass.any():
                # The one-pass rows' generators stay untouched: their draws come from
                # the kernel, as they would in a batch of their own kind.
                generators = {i: g for i, g in generators.items() if not one_pass[i]}
            # A float32 copy: the steps below work in place, the caller's logits stay intact.
            processed = logits.to(torch.float32, copy=True)
            processed = self.apply_logits_processors(processed, metadata)
            sampled = self.sample(processed, metadata, generators)
            if one_pass is not None and one_pass.any():
                fast, _ = self.gumbel_sample(logits, metadata, one_pass)
                sampled = torch.where(fast == -1, sampled, fast)
        logprobs_tensors = None
        if raw_logprobs is not None:
            assert metadata.max_num_logprobs is not None
            logprobs_tensors = gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled, logprobs_tensors, logits_finite)

    @staticmethod
    def apply_logits_processors(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The stages that may change the argmax: min_tokens, then penalties."""
        if metadata.min_tokens_rows is not None:
            assert metadata.min_tokens_token_ids is not None
            apply_min_tokens(logits, metadata.min_tokens_rows, metadata.min_tokens_token_ids)
        if not metadata.no_penalties:
            apply_penalties(
                logits,
                metadata.prompt_token_ids,
                metadata.output_token_ids,
                metadata.presence_penalties,
                metadata.frequency_penalties,
                metadata.repetition_penalties,
            )
        return logits

    @staticmethod
    def apply_temperature(
        logits: torch.Tensor, temperature: torch.Tensor, all_random: bool
    ) -> torch.Tensor:
        """Divide each row by its temperature, in place (greedy rows by 1)."""
        if not all_random:
            # Greedy rows carry 0; their random draw is discarded, but must not be NaN.
            temperature = torch.where(temperature == 0.0, 1.0, temperature)
        return logits.div_(temperature.unsqueeze(1))

    def sample(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        generators: dict[int, torch.Generator] | None = None,
    ) -> torch.Tensor:
        """Greedy rows take the argmax; the others draw from their filtered distribution
        (seeded rows from ``generators``, by default ``metadata.generators``)."""
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            assert greedy is not None
            return greedy
        assert metadata.temperature is not None
        probs = self.compute_probs(logits, metadata)
        if generators is None:
            generators = metadata.generators
        sampled = random_sample(probs, generators, self.generator)
        if greedy is None:
            return sampled
        return torch.where(metadata.temperature == 0.0, greedy, sampled)

    def compute_probs(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The distribution random rows draw from: temperature, min_p, top-k, top-p.

        ``logits`` (penalties already applied) is modified in place.
        """
        assert metadata.temperature is not None
        logits = self.apply_temperature(logits, metadata.temperature, metadata.all_random)
        if metadata.min_p is not None:
            logits = apply_min_p(logits, metadata.min_p)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        return logits.softmax(dim=-1)

    def _gumbel_kernel_on(self, logits: torch.Tensor) -> bool:
        if self.use_gumbel_kernel is None:
            return logits.is_cuda
        return self.use_gumbel_kernel

    def gumbel_sample(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        rows: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample every row with the one-pass kernel (``gumbel.py``).

        Each row's Philox key is its request's seed (counter: the token's position), or
        a fresh draw from the engine's seed for unseeded rows, so a seeded request's
        tokens depend on nothing else in the batch. A batch with no seeded row and no
        row left out gets one key for all its rows (``gumbel_sample``'s batch key), which
        saves building and copying two arrays per step: at 256 rows this call's host
        time went from 164 to 80 us and from 249 to 128 us on two H200 leases' hosts
        (docs/benchmarks/perf9/sampler*.json).

        Args:
            logits: ``[num_reqs, vocab]`` raw logits (read only).
            metadata: Temperatures (0 on greedy rows) and the seeded rows' keys.
            rows: Host bool mask of the rows wanted; the others come back as -1.

        Returns:
            Token ids and the per-row finiteness flags.
        """
        from minivllm.sample.gumbel import gumbel_sample  # Triton: loaded on first use

        assert metadata.temperature is not None
        if not metadata.seeds and rows is None:
            # Every row unseeded: one fresh key for the batch, passed as an argument.
            key = int(self._key_rng.integers(0, _INT64.max))
            return gumbel_sample(logits, metadata.temperature, key, None)
        n = logits.shape[0]
        keys = self._key_rng.integers(_INT64.min, _INT64.max, size=n, dtype=np.int64)
        positions = np.zeros(n, dtype=np.int64)
        for row, (seed, position) in metadata.seeds.items():
            keys[row], positions[row] = seed, position
        arrays = [keys, positions] if rows is None else [keys, positions, rows.astype(np.int64)]
        on_device = copy_to_device(arrays, np.int64, logits.device)
        sampled, finite = gumbel_sample(logits, metadata.temperature, *on_device[:2])
        if rows is not None:
            sampled = sampled.masked_fill_(on_device[2] == 0, -1)
        return sampled, finite
