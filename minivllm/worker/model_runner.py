"""Run one scheduled step on the model: build the flat batch, forward, sample.

Upstream counterparts: ``vllm/v1/worker/gpu_model_runner.py`` (``GPUModelRunner``:
``_prepare_inputs``, ``execute_model``, ``profile_run``, ``initialize_kv_cache``) and
the leaner Model Runner V2 in ``vllm/v1/worker/gpu/model_runner.py``.

The model never sees a "batch" in the padded ``[batch, seq]`` sense. Every scheduled
token of every request is laid end to end in one flat ``[num_tokens]`` tensor; a
prefill chunk contributes many tokens, a decode one. Side tensors say where each token
belongs: its position, its KV cache slot, and which sequence it is part of.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.attention.selector import get_attn_backend
from minivllm.config import ModelConfig, VllmConfig
from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.distributed.parallel_state import get_tensor_model_parallel_world_size
from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.model_executor.loader import get_model
from minivllm.runner_outputs import ModelRunnerOutput, SamplerOutput
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.prompt_logprobs import compute_prompt_logprobs
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingType
from minivllm.spec_decode.draft_graph import DraftProposalGraphs, proposal_graphs_enabled
from minivllm.spec_decode.draft_model import DraftModelProposer, TargetBatch
from minivllm.spec_decode.metadata import SpecDecodeMetadata
from minivllm.utils.torch_utils import copy_arrays_to_device, copy_to_device
from minivllm.worker.async_spec import PrevStep, fill_drafts_in_flight, slots_on_device
from minivllm.worker.async_utils import AsyncOutput
from minivllm.worker.cuda_graph import CUDAGraphRunner
from minivllm.worker.kernel_warmup import kernel_warmup
from minivllm.worker.kv_cache import (
    KVCacheSpec,
    allocate_kv_caches,
    bind_kv_cache,
    cpu_default_num_blocks,
    kv_spec_for,
)
from minivllm.worker.mem_utils import profile_num_blocks

logger = logging.getLogger(__name__)


@dataclass
class ModelInputs:
    """The flat batch of one step, on the device."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    # Index (into the flat token axis) of each sampling request's last token.
    logits_indices: torch.Tensor
    # Requests whose last input token is a placeholder for the step still in flight.
    placeholder_req_ids: list[str] = field(default_factory=list)
    # Where the drafts and the rows that verify them are, when any request has drafts.
    spec_decode_metadata: SpecDecodeMetadata | None = None
    # The host-side layout, for a draft model's catch-up pass.
    batch: TargetBatch | None = None


class ModelRunner:
    """Owns the model, its KV cache and the sampler on one device (one TP rank)."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.device = vllm_config.device
        self.block_size = self.cache_config.block_size
        self.model = get_model(self.model_config, self.device)
        self.attn_backend = get_attn_backend(vllm_config.attention_backend, self.device)
        tp = get_tensor_model_parallel_world_size()
        self.kv_spec = kv_spec_for(self.model_config, self.block_size, tp)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        # A draft model (speculative decoding): its own weights, and its own cache
        # indexed by the target's block ids (see spec_decode/draft_model.py).
        spec = vllm_config.speculative_config
        self.drafter: DraftModelProposer | None = None
        self.draft_kv_spec: KVCacheSpec | None = None
        if spec is not None and spec.draft_model_config is not None:
            self.drafter = DraftModelProposer(
                get_model(spec.draft_model_config, self.device),
                spec.num_speculative_tokens,
                self.block_size,
                self.model_config.max_model_len,
                self.scheduler_config.max_num_seqs,
                self.device,
            )
            self.draft_kv_spec = kv_spec_for(spec.draft_model_config, self.block_size, tp)
        self.cuda_graph_runner: CUDAGraphRunner | None = None
        engine_gen = torch.Generator(device=self.device)
        engine_gen.manual_seed(vllm_config.seed)
        self.sampler = Sampler(engine_gen)
        self.rejection_sampler = RejectionSampler(self.sampler)
        # request_id -> that request's seeded generator; lives until the request ends,
        # so a seeded stream continues where it was after a preemption.
        self.generators: dict[str, torch.Generator] = {}
        # The previous step's sampled ids, kept on the device: with async scheduling the
        # next step is prepared before they reach the host, and its input ids for those
        # requests are filled in from here.
        # With a draft model also its drafts, and the drafts it rejected (async_spec.py).
        self._prev = PrevStep()
        self._prev_output: AsyncOutput | None = None

    # ---- initialization -------------------------------------------------------------

    def determine_num_blocks(self) -> int:
        """Size the KV pool: explicit, profiled (CUDA), or the CPU default."""
        if self.cache_config.num_kv_blocks is not None:
            return self.cache_config.num_kv_blocks
        if self.device.type == "cuda":
            return profile_num_blocks(self)
        return cpu_default_num_blocks(
            self.kv_spec,
            self.cache_config.cpu_kv_cache_space,
            self.scheduler_config.max_num_seqs,
            self.model_config.max_model_len,
            self.draft_kv_spec,
        )

    @torch.inference_mode()
    def profile_run(self) -> None:
        """Forward the largest batch the scheduler can build, with no KV cache.

        This is what makes peak activation memory visible to the profiler; logits for
        ``max_num_seqs`` rows are computed too, as the sampler would.
        """
        num_tokens = self.scheduler_config.max_num_batched_tokens
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens, device=self.device) % self.model_config.max_model_len
        with set_forward_context(None):
            hidden = self.model(input_ids, positions)
        rows = min(self.scheduler_config.max_num_seqs, num_tokens)
        self.model.compute_logits(hidden[:rows]).float().softmax(dim=-1)
        if self.drafter is not None:
            del hidden
            self.drafter.profile_run(num_tokens, rows)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the per-layer K/V tensors, bind them, compile every kernel variant, and
        capture the CUDA graphs."""
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, self.device)
        bind_kv_cache(self.model, self.kv_caches, self.attn_backend)
        if self.drafter is not None:
            size = num_blocks + self.drafter.num_scratch_blocks
            self.draft_kv_caches = allocate_kv_caches(self.draft_kv_spec, size, self.device)
            bind_kv_cache(self.drafter.model, self.draft_kv_caches, self.attn_backend)
            self.drafter.set_num_blocks(num_blocks)
        kernel_warmup(self)  # before the graphs: no variant may compile mid-run
        if not self.vllm_config.enforce_eager:
            spec = self.vllm_config.speculative_config  # verify steps get graphs of their own
            k = spec.num_speculative_tokens if spec else 0
            self.cuda_graph_runner = self._capture_graphs(self.model, self.model_config, k)
            if self.drafter is not None:
                # The chain's passes are decode steps; a catch-up pass after a verify
                # step has up to k + 2 tokens per request (k + 1 kept, one new).
                draft_config = spec.draft_model_config
                self.drafter.graphs = self._capture_graphs(self.drafter.model, draft_config, k + 1)
                if proposal_graphs_enabled():
                    proposals = DraftProposalGraphs(
                        self.drafter, self.drafter.graphs.capture_sizes, self.drafter.graphs.pool
                    )
                    proposals.capture()
                    self.drafter.proposal_graphs = proposals

    def _capture_graphs(
        self, model: torch.nn.Module, model_config: ModelConfig, num_speculative_tokens: int
    ) -> CUDAGraphRunner:
        graphs = CUDAGraphRunner(
            model,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_model_len=self.model_config.max_model_len,
            block_size=self.block_size,
            hidden_size=model_config.hf_config.hidden_size,
            dtype=self.model_config.dtype,
            device=self.device,
            num_speculative_tokens=num_speculative_tokens,
        )
        graphs.capture()
        return graphs

    # ---- one step --------------------------------------------------------------------

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> ModelInputs:
        """Lay every scheduled token end to end and compute its slot and sequence.

        Only the per-request facts are gathered in Python; everything per token is one
        vectorized numpy expression, since a decode step of 256 requests must cost
        microseconds here, not milliseconds. Everything then travels to the device in
        one copy (int64 and int32 arrays side by side) that never makes the host wait.
        """
        bs = self.block_size
        scheduled = scheduler_output.scheduled
        num_reqs = len(scheduled)
        num_new = np.fromiter((s.num_scheduled_tokens for s in scheduled), np.int64, num_reqs)
        starts = np.fromiter((s.num_computed_tokens for s in scheduled), np.int64, num_reqs)
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(num_new, out=query_start_loc[1:])
        seq_lens = (starts + num_new).astype(np.int32)
        num_blocks = np.fromiter((len(s.block_ids) for s in scheduled), np.int64, num_reqs)
        block_table = np.zeros((num_reqs, int(num_blocks.max())), dtype=np.int32)
        tokens: list[int] = []
        placeholders: list[tuple[int, str]] = []  # (flat index, request id)
        in_flight_rows: list[int] = []  # batch rows of those requests
        for i, s in enumerate(scheduled):
            block_table[i, : len(s.block_ids)] = s.block_ids
            known = s.token_ids
            if len(known) < s.num_scheduled_tokens:
                # Async scheduling: the first input is the token the step in flight
                # samples (with a draft model, the drafts after it are in flight too).
                placeholders.append((len(tokens), s.request_id))
                in_flight_rows.append(i)
                tokens.append(0)
            tokens.extend(known)
        # Which request each token belongs to, and its position within the sequence.
        req_idx = np.repeat(np.arange(num_reqs), num_new)
        positions = np.arange(len(tokens)) - np.repeat(query_start_loc[:-1], num_new)
        positions += np.repeat(starts, num_new)
        # Address translation, host side: position -> (block id, offset) -> slot.
        slot_mapping = block_table[req_idx, positions // bs].astype(np.int64) * bs + positions % bs
        needs_sample = np.fromiter((s.needs_sample for s in scheduled), bool, num_reqs)
        logits_indices = query_start_loc[1:][needs_sample].astype(np.int64) - 1
        spec_metadata = None
        drafts = [s.spec_token_ids for s in scheduled if s.needs_sample]
        if any(drafts):
            # Each sampling request's last len(drafts) + 1 tokens are its sampled rows.
            spec_metadata = SpecDecodeMetadata.from_draft_token_ids(
                drafts, self.device, query_start_loc[1:][needs_sample]
            )
        num_drafts = np.fromiter((len(s.spec_token_ids) for s in scheduled), np.int64, num_reqs)
        fill_dst, fill_src = self._placeholder_sources(placeholders, num_drafts[in_flight_rows])
        input_ids, positions_d, slots, logits_idx, dst, src, table, seq_lens_d, qsl = (
            copy_arrays_to_device(
                [
                    np.asarray(tokens, np.int64),
                    positions,
                    slot_mapping,
                    logits_indices,
                    fill_dst,
                    fill_src,
                    block_table,
                    seq_lens,
                    query_start_loc,
                ],
                [np.int64] * 6 + [np.int32] * 3,
                self.device,
            )
        )
        shift = None
        if placeholders:
            # Queued behind the previous step on the same stream: it reads the ids
            # after they are written, and the host never waits for them.
            input_ids[dst] = self._prev.tokens()[src]
            shift = self._prev.position_shift(placeholders, in_flight_rows, num_reqs)
        if shift is not None:
            # Drafts of the step in flight that it rejects: the scheduler counted them
            # as computed, so these requests' tokens sit lower by as many positions.
            req_idx_d = copy_to_device([req_idx], np.int64, self.device)[0]
            positions_d -= shift[req_idx_d]
            seq_lens_d -= shift.to(torch.int32)
            slots = slots_on_device(table, req_idx_d, positions_d, bs)
        if spec_metadata is not None and placeholders:
            fill_drafts_in_flight(spec_metadata, input_ids)
        attn_metadata = AttentionMetadata(
            slot_mapping=slots,
            block_table=table,
            seq_lens=seq_lens_d,
            query_start_loc=qsl,
            max_query_len=int(num_new.max()),
            max_seq_len=int(seq_lens.max()),
        )
        return ModelInputs(
            input_ids=input_ids,
            positions=positions_d,
            attn_metadata=attn_metadata,
            logits_indices=logits_idx if spec_metadata is None else spec_metadata.logits_indices,
            placeholder_req_ids=[rid for _, rid in placeholders],
            spec_decode_metadata=spec_metadata,
            batch=TargetBatch(
                query_start_loc, starts, block_table, num_blocks, needs_sample, num_drafts, shift
            ),
        )

    def _placeholder_sources(
        self, placeholders: list[tuple[int, str]], num_drafts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where each placeholder token goes and comes from (``PrevStep.sources``)."""
        return self._prev.sources(placeholders, num_drafts)

    def _update_generators(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.generators.pop(req_id, None)
        for s in scheduler_output.scheduled:
            if not s.is_new:
                continue  # a running request already has its generator (if it needs one)
            params = s.request.sampling_params
            if params.sampling_type == SamplingType.RANDOM_SEED and s.request_id not in (
                self.generators
            ):
                gen = torch.Generator(device=self.device)
                gen.manual_seed(params.seed)
                self.generators[s.request_id] = gen

    def _forward(self, inputs: ModelInputs) -> torch.Tensor:
        """Run the model: replay a captured graph when one fits the batch, else eagerly."""
        meta = inputs.attn_metadata
        graphs = self.cuda_graph_runner
        key = None if graphs is None else graphs.graph_key(meta, inputs.input_ids.shape[0])
        if key is not None:
            return graphs.run(key, inputs.input_ids, inputs.positions, meta)
        with set_forward_context(meta):
            return self.model(inputs.input_ids, inputs.positions)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and wait for its sampled tokens."""
        return self.execute_model_async(scheduler_output).get_output()

    @torch.inference_mode()
    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncOutput:
        """Queue one step on the device: forward, then sample for requests that completed
        their input (verify their drafts, with speculative decoding), then let a draft
        model propose. Returns before the device is done; ``get_output()`` waits for it."""
        self._update_generators(scheduler_output)
        if scheduler_output.is_empty:
            return AsyncOutput(ModelRunnerOutput([], []), None)
        inputs = self._prepare_inputs(scheduler_output)
        hidden = self._forward(inputs)
        prompt_logprobs = compute_prompt_logprobs(
            hidden, scheduler_output, self.model.compute_logits
        )
        sampling = scheduler_output.sampling_requests()
        output = ModelRunnerOutput([s.request_id for s in sampling], [], None, prompt_logprobs)
        if not sampling:
            self._propose_draft_tokens(inputs, inputs.input_ids[:0], None)  # catch up only
            return AsyncOutput(output, None)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        num_accepted = emitted = None
        if inputs.spec_decode_metadata is not None:
            sampler_output, emitted, num_accepted = self._verify_drafts(logits, sampling, inputs)
            sampled = sampler_output.sampled_token_ids
        else:
            sampler_output = self.sampler(logits, self._sampling_metadata(sampling, inputs, logits))
            sampled = sampler_output.sampled_token_ids
        drafts = self._propose_draft_tokens(inputs, sampled, num_accepted)
        spec = inputs.spec_decode_metadata
        self._prev = PrevStep.after_step(
            output.req_ids, sampled, drafts, emitted, num_accepted, spec and spec.num_draft_tokens
        )
        self._prev_output = AsyncOutput(
            output,
            sampled,
            sampler_output.logprobs_tensors,
            sampler_output.logits_finite,
            num_accepted,
            drafts,
        )
        return self._prev_output

    def _sampling_metadata(
        self, sampling: list[ScheduledRequest], inputs: ModelInputs, logits: torch.Tensor
    ) -> SamplingMetadata:
        """The sampler's inputs for a step without drafts."""
        if self.drafter is not None and inputs.placeholder_req_ids:
            # A request in flight may gain several tokens there (its accepted drafts).
            rows = self._prev.sampled_rows(sampling, inputs.placeholder_req_ids, False)
            return SamplingMetadata.from_requests(
                rows, self.device, self.generators, logits.shape[-1]
            )
        return SamplingMetadata.from_requests(
            [s.request for s in sampling],
            self.device,
            self.generators,
            logits.shape[-1],
            in_flight_ids=frozenset(inputs.placeholder_req_ids),
            read_in_flight=self._read_in_flight_tokens,
        )

    def _verify_drafts(
        self, logits: torch.Tensor, sampling: list[ScheduledRequest], inputs: ModelInputs
    ) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        """Speculative decoding: each request keeps its accepted drafts and one token.

        Returns the sampler output whose ``sampled_token_ids`` are the token after each
        request's accepted drafts, the grid of every token it gains, and how many drafts
        it accepted, all on the device: the scheduler, which knows the drafts, rebuilds
        the run once they reach the host.
        """
        spec_metadata = inputs.spec_decode_metadata
        assert spec_metadata is not None
        rows = self._prev.sampled_rows(sampling, inputs.placeholder_req_ids, True)
        metadata = SamplingMetadata.from_requests(
            rows, self.device, self.generators, logits.shape[-1]
        )
        result = self.rejection_sampler(spec_metadata, None, logits, metadata)
        last, num_accepted, logprobs = RejectionSampler.last_tokens(result)
        return (
            SamplerOutput(last, logprobs, result.logits_finite),
            result.sampled_token_ids,
            num_accepted,
        )

    def _propose_draft_tokens(
        self,
        inputs: ModelInputs,
        sampled: torch.Tensor,
        num_accepted: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """With a draft model: it catches up on the tokens the target kept this step and
        proposes ``k`` drafts per sampling request (``[num_sampling, k]`` on the device);
        None without one."""
        if self.drafter is None:
            return None
        assert inputs.batch is not None
        # Above disable_by_batch_size the draft's cache still follows the target (the
        # catch-up pass), but no drafts are proposed: the engine and the scheduler ask
        # the same rule.
        spec = self.vllm_config.speculative_config
        catch_up_only = not spec.speculates_at(len(inputs.batch.num_computed))
        drafts = self.drafter.propose(
            inputs.batch, inputs.input_ids, sampled, num_accepted, catch_up_only
        )
        return None if catch_up_only else drafts

    def _read_in_flight_tokens(self) -> dict[str, int]:
        """The previous step's sampled tokens by request id, for the penalties.

        Penalties count every output token, so a penalized request with a token in
        flight needs its value on the host: the host waits here for the previous step,
        but only after this step's forward pass is queued, so the device stays busy
        meanwhile. (min_tokens needs only to know the token exists, not its value.)
        """
        assert self._prev_output is not None
        sampled = self._prev_output.get_output().sampled_token_ids
        # A failed row reads -1, which must not index the vocabulary; that request's
        # token of this step is dropped anyway (it finished with an error).
        return {rid: max(sampled[row], 0) for rid, row in self._prev.rows.items()}
