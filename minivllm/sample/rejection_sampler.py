"""Verify draft tokens against the target model so that the output stays exactly its own.

Upstream counterpart: ``vllm/v1/sample/rejection_sampler.py`` (``RejectionSampler``,
``rejection_sample``, ``sample_recovered_tokens``), the algorithm of Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding"
(https://arxiv.org/abs/2211.17192). vLLM runs it as Triton kernels, one program per
request; minivllm writes it as a handful of whole-batch torch operations, which run on
any device and are the definition a kernel would be tested against.

A request brings ``n`` draft tokens ``x_1..x_n``, proposed by a draft distribution
``q`` (an n-gram proposer has no distribution: ``q`` is a point mass on its draft). The
target model scored all of them in one forward pass, so for every position ``j`` there
is a target distribution ``p_j`` (after the request's penalties, temperature, min-p,
top-k and top-p, exactly as the ordinary sampler computes it). Walking left to right:

* greedy requests accept ``x_j`` while it equals the argmax of ``p_j``; at the first
  mismatch they emit that argmax instead and stop;
* random requests accept ``x_j`` with probability ``min(1, p_j(x_j) / q_j(x_j))``; at
  the first rejection they emit a token drawn from the *residual*
  ``max(0, p_j - q_j)``, renormalized, and stop;
* a request that accepted all ``n`` drafts emits one more, the *bonus* token, drawn
  from ``p_{n+1}`` (the logits after the last draft), for free.

Why this is lossless: the first emitted token is ``x`` either because the draft was
``x`` and was accepted, probability ``q(x) min(1, p(x)/q(x)) = min(q(x), p(x))``, or
because some draft was rejected, probability ``1 - sum_y min(p(y), q(y))``, and then
the residual picked ``x``, probability ``max(0, p(x) - q(x)) / sum_y max(0, p(y) -
q(y))``. The two sums are equal (both are the mass by which ``p`` exceeds ``q``), so
the second term is ``max(0, p(x) - q(x))`` and the total is ``min(q, p) + max(0, p -
q) = p(x)``. Each later position repeats the argument given the tokens before it.

The batch is flat (see ``SpecDecodeMetadata``): each request owns ``n + 1`` *sampled
rows* of the logits, one per draft and one for the bonus. For each row this module
computes two things at once: whether the draft it verifies is accepted, and the token
the request emits if it stops at that row (argmax, residual draw, or, at the bonus row,
a draw from ``p``). The answer per request is then its accepted drafts followed by the
emitted token of its first rejected row (or its bonus row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from minivllm.request import Request
from minivllm.runner_outputs import LogprobsLists, LogprobsTensors, SamplerOutput
from minivllm.sample.logprobs import compute_logprobs, gather_logprobs
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sample.topk_topp_sampler import random_sample
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.metadata import SpecDecodeMetadata

PLACEHOLDER_TOKEN_ID = -1
"""Fills the output after a request's last emitted token (vLLM's value)."""


class RejectionSampler(nn.Module):
    """Accept or reject every request's drafts in one batched pass.

    Args:
        sampler: The ordinary sampler, whose stages (logits processors, temperature,
            min-p, top-k/top-p, the random draw) and engine-wide generator are reused,
            so every sampled row sees exactly the distribution a decode step would.
    """

    def __init__(self, sampler: Sampler) -> None:
        super().__init__()
        self.sampler = sampler

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        """Decide each request's output tokens for this step.

        Args:
            metadata: Where each request's drafts and sampled rows are.
            draft_probs: ``[num_drafts, vocab]`` the draft model's ``q`` for each draft,
                or None for proposers without one (n-gram: ``q`` is a point mass).
            logits: ``[num_sampled_rows, vocab]`` the target model's logits at the
                sampled rows; not modified.
            sampling_metadata: One row per sampled row, so that each position sees the
                drafts before it as already generated (penalties, min_tokens); built by
                ``SamplingMetadata.from_requests(requests_at_sampled_rows(...))``.

        Returns:
            ``sampled_token_ids [batch, max_spec_len + 1]`` int64: each request's
            accepted drafts, then one emitted token, then ``PLACEHOLDER_TOKEN_ID``; and,
            when a row asked for them, raw logprobs of every cell of that grid (placeholder
            cells score token 0 and are dropped by ``parse_output``); ``logits_finite``
            is ``[batch]``: False for a request with a non-finite value in any of its
            sampled rows (its tokens mean nothing).
        """
        md = sampling_metadata
        logits_finite = requests_finite(logits, metadata)
        raw_logprobs = None if md.max_num_logprobs is None else compute_logprobs(logits)
        if not (md.all_greedy and md.no_penalties and md.min_tokens_rows is None):
            # A float32 copy: the stages below work in place (as in Sampler.forward).
            logits = Sampler.apply_logits_processors(logits.to(torch.float32, copy=True), md)
        argmax = None if md.all_random else logits.argmax(dim=-1)
        if md.all_greedy:
            # The whole verdict on the grid: a cell's draft is accepted when the argmax
            # of its row equals it (a cell without a draft holds -1, equal to none).
            assert argmax is not None
            emitted = argmax[metadata.sampled_rows]
            accepted = metadata.draft_grid == emitted
        else:
            target_idx, drafts = metadata.target_logits_indices, metadata.draft_token_ids
            probs = self.sampler.compute_probs(logits, md)
            flat_accepted, flat_emitted = self._random_rows(probs, draft_probs, metadata, md)
            if argmax is not None:
                assert md.temperature is not None
                greedy = md.temperature == 0.0
                flat_accepted = torch.where(
                    greedy[target_idx], drafts == argmax[target_idx], flat_accepted
                )
                flat_emitted = torch.where(greedy, argmax, flat_emitted)
            # Cells without a draft read a False appended after the last one.
            padded = torch.cat([flat_accepted, flat_accepted.new_zeros(1)])
            accepted = padded[metadata.draft_index_grid]
            emitted = flat_emitted[metadata.sampled_rows]
        output = assemble_output(metadata, accepted, emitted)
        rows = metadata.sampled_rows
        logprobs_tensors = None
        if raw_logprobs is not None:
            assert md.max_num_logprobs is not None
            logprobs_tensors = gather_logprobs(
                raw_logprobs[rows.flatten()], md.max_num_logprobs, output.clamp(min=0).flatten()
            )
        return SamplerOutput(output, logprobs_tensors, logits_finite)

    def _random_rows(
        self,
        probs: torch.Tensor,
        draft_probs: torch.Tensor | None,
        metadata: SpecDecodeMetadata,
        md: SamplingMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Acceptance of each draft, and each sampled row's emitted token, by chance.

        The random numbers are drawn in a fixed order (the uniforms of the acceptance
        tests, then the residual draw), seeded rows from their request's generator, so a
        seeded request's tokens depend only on its own logits and drafts.
        """
        target_idx, drafts = metadata.target_logits_indices, metadata.draft_token_ids
        target_probs = probs[target_idx]
        p = target_probs.gather(1, drafts.unsqueeze(1)).squeeze(1).double()
        if draft_probs is None:
            q = torch.ones_like(p)
        else:
            q = draft_probs.gather(1, drafts.unsqueeze(1)).squeeze(1).double()
        u = uniform_per_draft(metadata, md.generators, self.sampler.generator, probs.device)
        # Accept with probability min(1, p / q): u < 1, so p >= q always accepts.
        # Written as a product so that q = 0 (a draft its own model could not have
        # proposed) rejects instead of dividing by zero.
        accepted = (q > 0) & (p >= u * q)
        residual = residual_probs(target_probs, draft_probs, drafts)
        # The race needs no division by the residual's sum: argmax(r / Exp(1)) is
        # distributed as r / sum(r) for any positive scale (random_sample's docstring).
        race_input = probs.index_copy(0, target_idx, residual)
        emitted = random_sample(race_input, md.generators, self.sampler.generator)
        return accepted, emitted

    @staticmethod
    def last_tokens(
        output: SamplerOutput,
    ) -> tuple[torch.Tensor, torch.Tensor, LogprobsTensors | None]:
        """Per request, on the device: the token after its accepted drafts, how many
        drafts it accepted, and the logprobs of every token it gains.

        With the drafts, which the scheduler already knows, this is the whole output:
        the request gains ``drafts[:num_accepted]`` and then the token. The logprobs are
        the grid's, row by row: request ``i``'s rows start at
        ``cu_num_generated_tokens[i] = i * (max_spec_len + 1)`` and its ``j``-th token's
        row is the ``j``-th, so ``LogprobsLists.slice_request(i, n)`` gives the first
        ``n`` tokens it keeps (a stop rule may keep fewer than the run). The rows after
        the run are never read; sending them costs less than asking the device where
        each run ends (upstream's ``parse_output`` compacts them on the host instead).
        """
        grid = output.sampled_token_ids
        num_accepted = (grid != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1
        last = grid.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
        logprobs = output.logprobs_tensors
        if logprobs is not None:
            batch, width = grid.shape
            starts = list(range(0, (batch + 1) * width, width))
            logprobs = dataclasses.replace(logprobs, cu_num_generated_tokens=starts)
        return last, num_accepted, logprobs

    @staticmethod
    def parse_output(
        output_token_ids: torch.Tensor, logprobs_tensors: LogprobsTensors | None = None
    ) -> tuple[list[list[int]], LogprobsLists | None]:
        """Drop the placeholders: each request's emitted tokens, one host copy.

        Returns:
            The token ids per request, and the logprobs of those tokens, request after
            request (request ``i`` owns rows ``cu_num_generated_tokens[i]:[i + 1]``).
        """
        grid = output_token_ids.cpu()
        valid = grid != PLACEHOLDER_TOKEN_ID
        tokens = [row[keep].tolist() for row, keep in zip(grid, valid)]
        if logprobs_tensors is None:
            return tokens, None
        keep = valid.flatten().to(logprobs_tensors.token_ids.device)
        cu = [0, *torch.cumsum(valid.sum(dim=1), dim=0).tolist()]
        kept = LogprobsTensors(
            logprobs_tensors.token_ids[keep],
            logprobs_tensors.logprobs[keep],
            logprobs_tensors.ranks[keep],
            cu,
        )
        return tokens, kept.tolists()


def requests_finite(logits: torch.Tensor, metadata: SpecDecodeMetadata) -> torch.Tensor:
    """``[batch]`` bool: all of the request's sampled rows are finite (as the Sampler's
    check: the row's maximum is a finite number). A request's cells in
    ``metadata.sampled_rows`` name exactly its rows (the bonus row repeated)."""
    return logits.amax(dim=-1).isfinite()[metadata.sampled_rows].all(dim=1)


def residual_probs(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    """``max(0, p - q)`` per draft row, unnormalized: what a rejection resamples from.

    Without draft probabilities ``q`` is a point mass on the draft, so the residual is
    ``p`` with the draft token removed. A rejection implies a positive residual (the
    draft had ``p(x) < q(x)``, so some other token has ``p > q``); an all-zero row can
    only come from a draft that is accepted for sure, and keeps ``p`` so the draw on it
    stays well defined even though it is never used.
    """
    if draft_probs is None:
        residual = target_probs.scatter(1, draft_token_ids.unsqueeze(1), 0.0)
    else:
        residual = (target_probs - draft_probs).clamp_(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0.0
    return torch.where(empty, target_probs, residual)


def uniform_per_draft(
    metadata: SpecDecodeMetadata,
    generators: dict[int, torch.Generator],
    default_generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """One ``U[0, 1)`` number per draft, from its request's generator when seeded.

    float64, as upstream: a float32 uniform is exactly 0 often enough to matter, and a
    draft with ``p = 0`` must never pass ``p >= u * q``.
    """
    num_drafts = int(metadata.draft_token_ids.shape[0])
    u = torch.empty(num_drafts, dtype=torch.float64, device=device)
    u.uniform_(generator=default_generator)
    if generators:
        # generators are keyed by sampled row; draft d is verified by sampled row
        # target_logits_indices[d], which the host knows from num_draft_tokens.
        draft, row = 0, 0
        for n in metadata.num_draft_tokens:
            for j in range(n):
                generator = generators.get(row + j)
                if generator is not None:
                    u[draft + j].uniform_(generator=generator)
            draft, row = draft + n, row + n + 1
    return u


def assemble_output(
    metadata: SpecDecodeMetadata, accepted: torch.Tensor, emitted: torch.Tensor
) -> torch.Tensor:
    """Each request's accepted run of drafts and the one token after it, as a grid.

    Args:
        metadata: The batch layout.
        accepted: ``[batch, max_spec_len + 1]`` bool, each cell's draft judged on its
            own (False where the cell holds no draft).
        emitted: ``[batch, max_spec_len + 1]`` the token the request emits if it stops
            at the cell (the cell's sampled row's).

    Returns:
        ``[batch, max_spec_len + 1]`` int64 tokens, ``PLACEHOLDER_TOKEN_ID`` after the
        last. Every index here was laid out on the host (``SpecDecodeMetadata``), so
        this is five whole-grid operations.
    """
    # Accepted drafts count only up to the first rejection; the last column never
    # holds a draft, so every request stops somewhere.
    num_accepted = accepted.cumprod(dim=1).sum(dim=1, keepdim=True)
    cols = metadata.grid_cols
    output = torch.where(cols == num_accepted, emitted, PLACEHOLDER_TOKEN_ID)
    return torch.where(cols < num_accepted, metadata.draft_grid, output)


class RequestAtRow:
    """A request as one of its sampled rows sees it: the drafts before the row count as
    already generated, so penalties and min_tokens treat position ``j`` exactly as a
    decode step would after the first ``j`` drafts were accepted.

    Duck-types the attributes ``SamplingMetadata.from_requests`` reads; the output list
    is built only if a penalty asks for it.
    """

    __slots__ = ("_request", "_drafts")

    def __init__(self, request: Request, drafts_before: list[int]) -> None:
        self._request = request
        self._drafts = drafts_before

    @property
    def request_id(self) -> str:
        """The underlying request's id (its seeded generator is shared by its rows)."""
        return self._request.request_id

    @property
    def sampling_params(self) -> SamplingParams:
        """The underlying request's parameters."""
        return self._request.sampling_params

    @property
    def prompt_token_ids(self) -> list[int]:
        """The underlying request's prompt."""
        return self._request.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        """Its outputs followed by the drafts before this row."""
        return [*self._request.output_token_ids, *self._drafts]

    @property
    def num_output_tokens(self) -> int:
        """Outputs plus the drafts before this row."""
        return self._request.num_output_tokens + len(self._drafts)


def requests_at_sampled_rows(
    requests: Sequence[Request], draft_token_ids: Sequence[Sequence[int]]
) -> list[RequestAtRow]:
    """One ``RequestAtRow`` per sampled row, in ``SpecDecodeMetadata``'s order."""
    return [
        RequestAtRow(request, list(drafts[:j]))
        for request, drafts in zip(requests, draft_token_ids, strict=True)
        for j in range(len(drafts) + 1)
    ]
