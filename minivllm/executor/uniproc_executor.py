"""Tensor parallelism of one: the model runner lives in the engine's process.

Upstream counterpart: ``vllm/v1/executor/uniproc_executor.py`` (``UniProcExecutor``).
No process group is created, so every tensor-parallel layer sees a world of one and
every collective is the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerOutput
from minivllm.executor.abstract import Executor
from minivllm.runner_outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from minivllm.utils.torch_utils import cuda_context_is_broken
from minivllm.worker.model_runner import ModelRunner


class UniProcExecutor(Executor):
    """Calls one in-process ``ModelRunner`` directly."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        super().__init__(vllm_config)
        self.model_runner = ModelRunner(vllm_config)
        self.kv_spec = self.model_runner.kv_spec

    def determine_num_blocks(self) -> int:
        """The runner's own answer (there is only one rank)."""
        return self.model_runner.determine_num_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the runner's KV cache."""
        self.model_runner.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step in this process."""
        return self.model_runner.execute_model(scheduler_output)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Queue the step on this process's device and return before it finishes."""
        return self.model_runner.execute_model_async(scheduler_output)

    @property
    def is_failed(self) -> bool:
        """True once the GPU's context is broken (a device-side assert, an illegal memory
        access): CUDA then fails every later call, so the engine is dead. Asked only
        after a step raised; an error that leaves the device usable (out of memory, a
        bad input) lets the engine fail that step alone."""
        return cuda_context_is_broken(self.model_runner.device)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call ``method`` on the in-process runner: a list of one result (one rank)."""
        kwargs = kwargs or {}
        if isinstance(method, str):
            return [getattr(self.model_runner, method)(*args, **kwargs)]
        return [method(self.model_runner, *args, **kwargs)]
