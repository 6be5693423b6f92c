"""Collectives used by tensor-parallel layers.

Upstream counterpart: ``vllm/distributed/communication_op.py``
(``tensor_model_parallel_all_reduce``, ``tensor_model_parallel_all_gather``).
Each is the identity in a group of one, so single-process code pays nothing. An
all-reduce small enough for the symmetric-memory buffer (``symm_mem.py``) is one
NVLink kernel; anything else goes through ``torch.distributed`` (NCCL or gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minivllm.distributed.parallel_state import (
    get_symm_mem_communicator,
    get_tensor_model_parallel_world_size,
    get_tp_group,
)


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks (in place; returns ``x``)."""
    if get_tensor_model_parallel_world_size() == 1:
        return x
    comm = get_symm_mem_communicator()
    algo = None if comm is None else comm.algorithm(x)
    if algo is not None:
        return comm.all_reduce(x, algo)
    dist.all_reduce(x, group=get_tp_group())
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate each rank's ``x`` along ``dim``, in rank order."""
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=get_tp_group())
    return torch.cat(parts, dim=dim)
