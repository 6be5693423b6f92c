"""The symmetric-memory all-reduce on two GPUs: equal to NCCL's sum for every message
size it takes (one-shot and two-shot), eagerly and replayed from a CUDA graph, and the
same bits on both ranks. Multicast stays off (the env vars below)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minivllm.distributed import symm_mem
from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    init_symm_mem_communicator,
)
from minivllm.distributed.utils import get_distributed_init_method, get_open_port

HIDDEN = 4096
# Rows of a [tokens, 4096] bf16 activation: batch-1 decode (8 KB) to 1,024 tokens (8 MB,
# the buffer's limit); 2,048 tokens exceed it and go to NCCL.
TOKENS = (1, 2, 7, 64, 256, 1024, 2048)


def _check(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """``got`` equals NCCL's ``ref`` bit for bit and equals the other rank's ``got``."""
    bad = (got != ref).sum().item()
    diff = (got.float() - ref.float()).abs().max().item()
    assert bad == 0, f"{name}: {bad} of {got.numel()} elements differ from NCCL (max {diff})"
    other = [torch.empty_like(got) for _ in range(2)]
    dist.all_gather(other, got)
    assert torch.equal(other[0], other[1]), f"{name}: the ranks disagree"


def _nccl_sum(x: torch.Tensor) -> torch.Tensor:
    ref = x.clone()
    dist.all_reduce(ref)
    return ref


def _eager(comm, rank: int) -> None:
    for tokens in TOKENS:
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(tokens, HIDDEN, dtype=dtype, device="cuda") * (rank + 1)
            ref = _nccl_sum(x)
            algo = comm.algorithm(x)
            assert (algo is None) == (x.numel() * x.element_size() > comm.max_size), algo
            out = tensor_model_parallel_all_reduce(x)
            assert out is x
            _check(f"eager {algo} {dtype} x {tokens}", out, ref)


def _graphed(comm) -> None:
    """Capture the all-reduce of a static buffer per size; replay on new data twice."""
    for tokens in (1, 64, 256):
        static = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        tensor_model_parallel_all_reduce(static)  # warm-up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            tensor_model_parallel_all_reduce(static)
        for _ in range(2):
            x = torch.randn_like(static)
            static.copy_(x)
            graph.replay()
            _check(f"graph {comm.algorithm(static)} x {tokens}", static, _nccl_sum(x))


def _rank(rank: int, init: str) -> None:
    torch.cuda.set_device(rank)
    torch.manual_seed(rank)
    init_distributed_environment(2, rank, init, "nccl")
    try:
        comm = init_symm_mem_communicator(torch.device("cuda", rank))
        assert not comm.disabled, comm.reason
        _eager(comm, rank)
        _graphed(comm)
        # Two-shot: what four or more ranks use above 512 KB; forced here at two.
        comm.force_algorithm = "two_shot"
        assert comm.algorithm(torch.empty(1, HIDDEN, dtype=torch.bfloat16)) == "two_shot"
        _eager(comm, rank)
        _graphed(comm)
        torch.cuda.synchronize()
    finally:
        destroy_distributed_environment()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_symm_mem_all_reduce_equals_nccl_on_two_gpus(monkeypatch) -> None:
    # Multicast (NVLS) stays off: the ops here read peers' memory with plain loads.
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.delenv(symm_mem.SYMM_MEM_ENV, raising=False)
    init = get_distributed_init_method("127.0.0.1", get_open_port())
    mp.start_processes(_rank, args=(init,), nprocs=2, start_method="spawn")
