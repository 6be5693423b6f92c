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

import gc
import logging

import torch

from minivllm.attention.selector import get_attn_backend
from minivllm.config import ModelConfig, VllmConfig
from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from minivllm.forward_context import set_forward_context
from minivllm.model_executor.loader import get_model
from minivllm.runner_outputs import ModelRunnerOutput, SamplerOutput
from minivllm.sample.metadata import SamplingMetadata, SamplingMetadataCache
from minivllm.sample.prompt_logprobs import compute_prompt_logprobs
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingType
from minivllm.spec_decode.draft_graph import DraftProposalGraphs, proposal_graphs_enabled
from minivllm.spec_decode.draft_model import DraftModelProposer
from minivllm.utils.math_utils import cdiv
from minivllm.worker.async_spec import PrevStep
from minivllm.worker.async_utils import AsyncOutput
from minivllm.worker.block_table import BlockTable
from minivllm.worker.cuda_graph import CUDAGraphRunner, release_cached_blocks
from minivllm.worker.input_batch import ModelInputs, prepare_inputs
from minivllm.worker.kernel_warmup import kernel_warmup
from minivllm.worker.kv_cache import (
    KVCacheSpec,
    allocate_kv_caches,
    bind_kv_cache,
    cpu_default_num_blocks,
    kv_spec_for,
)
from minivllm.worker.mem_utils import profile_num_blocks
from minivllm.worker.profiler import TorchProfilerWrapper

logger = logging.getLogger(__name__)


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
        self.profiled_graph_bytes: int | None = None  # profile_cudagraph_memory's answer
        engine_gen = torch.Generator(device=self.device)
        engine_gen.manual_seed(vllm_config.seed)
        self.sampler = Sampler(engine_gen)
        self.rejection_sampler = RejectionSampler(self.sampler)
        # request_id -> that request's seeded generator; lives until the request ends,
        # so a seeded stream continues where it was after a preemption.
        self.generators: dict[str, torch.Generator] = {}
        # Requests that asked for prompt logprobs, until they end (none: no per-step scan).
        self._prompt_logprobs_req_ids: set[str] = set()
        # The sampler's inputs, rebuilt only when the sampling requests change.
        self._metadata_cache = SamplingMetadataCache()
        # The previous step's sampled ids, kept on the device: with async scheduling the
        # next step is prepared before they reach the host, and its input ids for those
        # requests are filled in from here.
        # With a draft model also its drafts, and the drafts it rejected (async_spec.py).
        self._prev = PrevStep()
        self._prev_output: AsyncOutput | None = None
        # Every live request's block ids, kept across steps: a step writes new ids only.
        self.block_tables = BlockTable(
            self.scheduler_config.max_num_seqs,
            cdiv(self.model_config.max_model_len, self.block_size),
        )
        # LLM.start_profile / stop_profile: this rank's torch profiler.
        self.profiler = TorchProfilerWrapper(get_tensor_model_parallel_rank())

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
        self._allocate_kv_caches(num_blocks)
        kernel_warmup(self)  # before the graphs: no variant may compile mid-run
        if not self.vllm_config.enforce_eager:
            self.capture_model()

    def _allocate_kv_caches(self, num_blocks: int) -> None:
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, self.device)
        bind_kv_cache(self.model, self.kv_caches, self.attn_backend)
        if self.drafter is not None:
            size = num_blocks + self.drafter.num_scratch_blocks
            self.draft_kv_caches = allocate_kv_caches(self.draft_kv_spec, size, self.device)
            bind_kv_cache(self.drafter.model, self.draft_kv_caches, self.attn_backend)
            self.drafter.set_num_blocks(num_blocks)

    def capture_model(self) -> None:
        """Capture the CUDA graphs over the bound KV caches: the model's, and with a draft
        model its own and its proposal graphs, all in one memory pool per model."""
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
                release_cached_blocks()  # their warm-ups', as after each capture

    @torch.inference_mode()
    def profile_cudagraph_memory(self) -> int:
        """The device memory the CUDA graphs will take (0 with ``enforce_eager``), for the
        KV pool's sizing: the graphs are captured once over a KV cache of one block (a
        capture's batch reads block 0 and writes no slot), measured, and dropped.

        Their pool holds the largest step's activations, and more as steps of other
        sizes fragment it; no formula predicts that, so it is measured. Upstream's
        ``GPUModelRunner.profile_cudagraph_memory`` captures the first two graphs of each
        kind and extrapolates, its capture being slower than ours.
        """
        if self.vllm_config.enforce_eager:
            return 0
        self._allocate_kv_caches(1)
        torch.cuda.synchronize(self.device)
        release_cached_blocks()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self.capture_model()
        torch.cuda.synchronize(self.device)
        graph_bytes = free_before - torch.cuda.mem_get_info(self.device)[0]
        self.profiled_graph_bytes = graph_bytes
        self.cuda_graph_runner = None
        self.kv_caches = []
        if self.drafter is not None:
            self.drafter.graphs = self.drafter.proposal_graphs = None  # (a cycle: gc)
            self.draft_kv_caches = []
        gc.collect()
        release_cached_blocks()  # the dropped graphs' pool
        return graph_bytes

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
        """The step's flat batch (``worker/input_batch.py``), the step in flight's tokens
        read on the device."""
        return prepare_inputs(
            scheduler_output, self.block_size, self.device, self._prev, self.block_tables
        )

    def _update_request_state(self, scheduler_output: SchedulerOutput) -> None:
        """Per-request state kept across steps: seeded generators, prompt-logprob askers."""
        for req_id in scheduler_output.finished_req_ids:
            self.generators.pop(req_id, None)
            self._prompt_logprobs_req_ids.discard(req_id)
        for s in scheduler_output.scheduled:
            if not s.is_new:
                continue  # a running request already has its generator (if it needs one)
            params = s.request.sampling_params
            if params.prompt_logprobs is not None:
                self._prompt_logprobs_req_ids.add(s.request_id)
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
        self._update_request_state(scheduler_output)
        # Before any row is written: a request preempted and admitted again in one step
        # keeps the row it gets now.
        self.block_tables.free(scheduler_output.finished_req_ids)
        self.block_tables.free(scheduler_output.preempted_req_ids)
        if scheduler_output.is_empty:
            return AsyncOutput(ModelRunnerOutput([], []), None)
        inputs = self._prepare_inputs(scheduler_output)
        hidden = self._forward(inputs)
        prompt_logprobs = (
            compute_prompt_logprobs(hidden, scheduler_output, self.model.compute_logits)
            if self._prompt_logprobs_req_ids
            else {}
        )
        sampling = scheduler_output.sampling_requests()
        output = ModelRunnerOutput([s.request_id for s in sampling], [], None, prompt_logprobs)
        if not sampling:
            self._propose_draft_tokens(inputs, inputs.input_ids[:0], None)  # catch up only
            return AsyncOutput(output, None)
        rows = inputs.logits_rows
        logits = self.model.compute_logits(
            hidden[inputs.logits_indices] if rows is None else hidden[:rows]
        )
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
        requests = [s.request for s in sampling]
        return self._metadata_cache.get(
            requests,
            lambda: SamplingMetadata.from_requests(
                requests,
                self.device,
                self.generators,
                logits.shape[-1],
                in_flight_ids=frozenset(inputs.placeholder_req_ids),
                read_in_flight=self._read_in_flight_tokens,
            ),
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

    def profile(self, is_start: bool, trace_dir: str = "") -> str:
        """Start (``is_start``) or stop this rank's torch profiler; on stop, the path of
        the trace it wrote into ``trace_dir`` ("" on start)."""
        if is_start:
            self.profiler.start(trace_dir)
            return ""
        return self.profiler.stop()

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
