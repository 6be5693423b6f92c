"""One tensor-parallel rank: its device, its place in the process group, its model runner.

Upstream counterparts: ``vllm/v1/worker/gpu_worker.py`` (``Worker.init_device``,
``Worker.load_model``, ``Worker.determine_available_memory``,
``Worker.execute_model``, ``init_worker_distributed_environment``).

A ``Worker`` lives in its own process (started by ``MultiprocExecutor``) and is driven by
method calls that arrive over a pipe: the same calls, in the same order, reach every
rank, which is what keeps the ranks' collectives paired up.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.step_message import RequestMirror, StepMessage
from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    init_symm_mem_communicator,
)
from minivllm.distributed.symm_mem import MAX_SIZE
from minivllm.runner_outputs import AsyncModelRunnerOutput
from minivllm.worker.kv_cache import KVCacheSpec
from minivllm.worker.model_runner import ModelRunner


class Worker:
    """The per-rank half of tensor parallelism.

    Args:
        vllm_config: The engine's configuration (the device is made rank-specific here).
        rank: This process's rank, ``0 .. tensor_parallel_size - 1``.
        distributed_init_method: The ``tcp://host:port`` rendezvous all ranks share.
    """

    def __init__(self, vllm_config: VllmConfig, rank: int, distributed_init_method: str) -> None:
        self.vllm_config = vllm_config
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.model_runner: ModelRunner | None = None
        self.mirror = RequestMirror()
        # The last step raised here: the next one may read tokens it never sampled.
        self._last_step_failed = False

    def init_device(self) -> None:
        """Pick this rank's device and join the process group (NCCL on CUDA, gloo on CPU),
        then set up the symmetric-memory all-reduce (off on the CPU).

        Returns once every rank has joined: ``init_process_group`` is a rendezvous.
        """
        world = self.vllm_config.parallel_config.tensor_parallel_size
        device = self.vllm_config.device
        if device.type == "cuda":
            # One GPU per rank, by rank (a single node). Set before anything touches
            # CUDA, so this process's context lives on its own GPU, not on GPU 0.
            device = torch.device("cuda", self.rank)
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            backend = "gloo"
        torch.set_num_threads(cpu_threads(device, world))
        self.vllm_config = dataclasses.replace(self.vllm_config, device=device)
        init_distributed_environment(world, self.rank, self.distributed_init_method, backend)
        if world > 1:
            init_symm_mem_communicator(device, self._all_reduce_max_size())

    def _all_reduce_max_size(self) -> int:
        """Bytes of the symmetric all-reduce buffer: the largest activation a step can
        reduce (its token budget x hidden size), capped at ``MAX_SIZE``."""
        model = self.vllm_config.model_config
        tokens = self.vllm_config.scheduler_config.max_num_batched_tokens
        nbytes = tokens * model.hf_config.hidden_size * model.dtype.itemsize
        return min(MAX_SIZE, nbytes)

    def load_model(self) -> None:
        """Build the model runner: the model, with only this rank's weight shards."""
        self.model_runner = ModelRunner(self.vllm_config)

    def get_kv_spec(self) -> KVCacheSpec:
        """This rank's KV cache geometry (its share of the KV heads)."""
        return self._runner().kv_spec

    def determine_num_blocks(self) -> int:
        """How many KV blocks fit on this rank (the executor takes the minimum)."""
        return self._runner().determine_num_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate this rank's KV cache with the block count all ranks agreed on."""
        self._runner().initialize_kv_cache(num_blocks)

    def execute_model(self, msg: StepMessage) -> AsyncModelRunnerOutput:
        """Queue one step on this rank's device; return the handle to its output.

        The worker loop waits on the handle on its reply thread, so this thread takes
        the next step's message while the device runs this one (async scheduling). Every
        rank samples (identical logits after the all-gather, identical seeded
        generators), but the engine needs one answer: only rank 0's output is sent.
        """
        scheduler_output = self.mirror.decode(msg)
        if self._last_step_failed:
            self._last_step_failed = False
            _fill_unsampled_inputs(scheduler_output)
        try:
            return self._runner().execute_model_async(scheduler_output)
        except Exception:
            self._last_step_failed = True
            raise

    def profile(self, is_start: bool, trace_dir: str) -> str:
        """Start or stop this rank's torch profiler (``ModelRunner.profile``)."""
        return self._runner().profile(is_start, trace_dir)

    def shutdown(self) -> None:
        """Release the model and leave the process group."""
        self.model_runner = None
        destroy_distributed_environment()

    def _runner(self) -> ModelRunner:
        if self.model_runner is None:
            raise RuntimeError(f"rank {self.rank}: load_model() has not run")
        return self.model_runner


def _fill_unsampled_inputs(scheduler_output: SchedulerOutput) -> None:
    """Give a dummy input token to every request waiting for one a failed step was to
    sample.

    With async scheduling the engine sends step N+1 before it reads that step N failed,
    and N+1's decodes take N's tokens as inputs. Their requests fail with step N, so any
    token will do; without one, the runner would raise and fail step N+1 too, with the
    requests it admitted that never were in step N.
    """
    for s in scheduler_output.scheduled:
        missing = s.num_scheduled_tokens - len(s.token_ids)
        if missing > 0:
            s.request.append_output_token_ids([0] * missing)


def cpu_threads(device: torch.device, world: int) -> int:
    """Torch's intra-op threads for a rank (upstream: ``set_multiprocessing_worker_envs``
    in ``vllm/v1/executor/multiproc_executor.py``).

    On a GPU, one, unless ``OMP_NUM_THREADS`` says otherwise: the rank's compute runs on
    the device, and a pool of host threads only hurts. A torch CPU op big enough to be
    split wakes every thread of the pool, and the threads then spin between steps,
    beside the one thread that schedules and launches every step (Benchmarks, eighth
    round). On the CPU the ranks share the machine's cores: without a split each would
    start one thread per core and they would fight over them.
    """
    if device.type == "cuda":
        raw = os.environ.get("OMP_NUM_THREADS") or "1"
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a positive integer, got {raw!r}")
        return int(raw)
    return max(1, (os.cpu_count() or 1) // world)
