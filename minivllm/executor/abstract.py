"""The executor: what the engine calls to run the model, however many processes that takes.

Upstream counterpart: ``vllm/v1/executor/abstract.py`` (``Executor``,
``Executor.get_class``, ``Executor.collective_rpc``). The engine talks to exactly one
object with four calls (size the KV cache, allocate it, run a step, shut down); whether
the model lives in the engine's own process or is split over N worker processes is the
executor's business. A fifth call, ``collective_rpc``, runs any method on every rank: it
is how benchmarks and tests reach the model without holding the runner themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerOutput
from minivllm.runner_outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from minivllm.worker.async_utils import AsyncOutput
from minivllm.worker.kv_cache import KVCacheSpec


class Executor(ABC):
    """Runs the model for the engine.

    Attributes:
        vllm_config: The engine's configuration.
        kv_spec: The KV cache geometry of one rank (all ranks are alike).
    """

    kv_spec: KVCacheSpec

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type[Executor]:
        """The executor for this configuration: in-process for one rank, else processes."""
        if vllm_config.parallel_config.tensor_parallel_size == 1:
            from minivllm.executor.uniproc_executor import UniProcExecutor

            return UniProcExecutor
        from minivllm.executor.multiproc_executor import MultiprocExecutor

        return MultiprocExecutor

    @abstractmethod
    def determine_num_blocks(self) -> int:
        """KV blocks every rank can hold: the minimum over the ranks."""

    @abstractmethod
    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV blocks on every rank."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduled step on every rank; return the sampled tokens."""

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Queue one step and return a handle to its output.

        This default runs the step to completion first (the handle is already done);
        both executors override it: the in-process one returns while the GPU still
        works, the multiprocess one as soon as the step is sent to the workers.
        """
        return AsyncOutput(self.execute_model(scheduler_output), None)

    @abstractmethod
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``method`` on every rank and return each rank's result, in rank order.

        Args:
            method: The name of a method of the object that runs the model on a rank
                (the ``ModelRunner`` in this process, the ``Worker`` in a worker
                process), or a callable taking that object as its first argument.
            args: Positional arguments for the call.
            kwargs: Keyword arguments for the call.
        """

    @property
    def is_failed(self) -> bool:
        """True once no call can succeed any more (the workers are gone, or the GPU's
        context is broken), so the engine is dead.

        A call that merely raised leaves this False: the engine fails only that step's
        requests. Upstream counterpart: ``MultiprocExecutor.is_failed``.
        """
        return False

    def shutdown(self) -> None:  # noqa: B027 (nothing to release in one process)
        """Release the workers (idempotent)."""
