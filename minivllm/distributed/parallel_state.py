"""Tensor-parallel group state: this process's rank and the group size.

Upstream counterpart: ``vllm/distributed/parallel_state.py``
(``get_tensor_model_parallel_world_size``, ``get_tensor_model_parallel_rank``).
Without an initialized group minivllm runs as rank 0 of a group of one, so every
layer can be written once, tensor-parallel aware, and still run in a single process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minivllm.distributed.symm_mem import MAX_SIZE, SymmMemCommunicator

_TP_GROUP: dist.ProcessGroup | None = None
# The tensor-parallel group's symmetric-memory all-reduce (upstream keeps it on the
# GroupCoordinator's device communicator); None until a worker creates it.
_SYMM_MEM_COMM: SymmMemCommunicator | None = None


def init_tensor_parallel_group(group: dist.ProcessGroup | None) -> None:
    """Record the process group layers shard over (None: the default world group)."""
    global _TP_GROUP
    _TP_GROUP = group


def model_parallel_is_initialized() -> bool:
    """True when torch.distributed is up, so layers should shard."""
    return dist.is_available() and dist.is_initialized()


def get_tensor_model_parallel_world_size() -> int:
    """Number of ranks a tensor-parallel layer is split across (1 when single-process)."""
    if not model_parallel_is_initialized():
        return 1
    return dist.get_world_size(_TP_GROUP)


def get_tensor_model_parallel_rank() -> int:
    """This process's rank within the tensor-parallel group (0 when single-process)."""
    if not model_parallel_is_initialized():
        return 0
    return dist.get_rank(_TP_GROUP)


def get_tp_group() -> dist.ProcessGroup | None:
    """The tensor-parallel process group (None means the default group)."""
    return _TP_GROUP


def init_symm_mem_communicator(
    device: torch.device, max_size: int = MAX_SIZE
) -> SymmMemCommunicator:
    """Create the tensor-parallel group's symmetric-memory all-reduce (a collective: every
    rank calls it, after ``init_distributed_environment`` and before capturing graphs).

    The communicator may come back disabled (one rank, CPU/gloo, ``MINIVLLM_SYMM_MEM=0``,
    no driver support); ``tensor_model_parallel_all_reduce`` then uses NCCL/gloo alone.
    """
    global _SYMM_MEM_COMM
    _SYMM_MEM_COMM = SymmMemCommunicator(_TP_GROUP, device, max_size)
    return _SYMM_MEM_COMM


def get_symm_mem_communicator() -> SymmMemCommunicator | None:
    """The communicator ``init_symm_mem_communicator`` made (None before, or after
    ``destroy_distributed_environment``)."""
    return _SYMM_MEM_COMM


def init_distributed_environment(
    world_size: int, rank: int, distributed_init_method: str, backend: str
) -> None:
    """Join the process group of ``world_size`` ranks and make it the tensor-parallel group.

    Every rank calls this with the same ``distributed_init_method`` (a ``tcp://host:port``
    rendezvous address chosen by the executor); the call returns once all ranks have
    joined. ``backend`` is ``"nccl"`` on CUDA and ``"gloo"`` on the CPU. minivllm has
    only tensor parallelism, so the world *is* the TP group; vLLM's
    ``initialize_model_parallel`` carves TP, PP, DP and EP groups out of the world.
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(
                f"torch.distributed is already initialized as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, not rank {rank} of {world_size}"
            )
    else:
        dist.init_process_group(
            backend, init_method=distributed_init_method, world_size=world_size, rank=rank
        )
    init_tensor_parallel_group(None)


def destroy_distributed_environment() -> None:
    """Leave the process group (a no-op when none was joined)."""
    global _SYMM_MEM_COMM
    _SYMM_MEM_COMM = None
    init_tensor_parallel_group(None)
    if model_parallel_is_initialized():
        dist.destroy_process_group()
