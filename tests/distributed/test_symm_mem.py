"""The symmetric-memory all-reduce's choices, checkable without a GPU: which messages it
takes, when it stays off, and that a gloo group still reduces through torch.distributed.
``test_symm_mem_gpu.py`` checks the reduction itself on two GPUs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_symm_mem_communicator,
    init_distributed_environment,
    init_symm_mem_communicator,
)
from minivllm.distributed.symm_mem import (
    MAX_SIZE,
    SYMM_MEM_ENV,
    SymmMemCommunicator,
    pick_algorithm,
    symm_mem_enabled,
    unavailable_reason,
)
from minivllm.distributed.utils import get_distributed_init_method, get_open_port

KiB, MiB = 1024, 1024 * 1024
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "nbytes, world, expected",
    [
        (8 * KiB, 2, "one_shot"),  # a batch-1 decode step of hidden 4096 in bf16
        (512 * KiB, 2, "one_shot"),  # 64 tokens: where the two kernels tie on an H200
        (2 * MiB, 2, "two_shot"),  # batch 256
        (MAX_SIZE, 2, "two_shot"),
        (MAX_SIZE + 16, 2, None),  # too large for the buffer: NCCL
        (512 * KiB, 4, "one_shot"),
        (512 * KiB + 16, 4, "two_shot"),  # more ranks: one-shot's traffic grows, two-shot
        (256 * KiB, 8, "one_shot"),
        (2 * MiB, 8, "two_shot"),
        (8 * KiB, 3, None),  # world sizes the kernels are not specialized for
        (8 * KiB, 6, None),
        (8 * KiB, 16, None),
    ],
)
def test_pick_algorithm_by_size_and_world(nbytes: int, world: int, expected: str | None) -> None:
    assert pick_algorithm(nbytes, world, MAX_SIZE) == expected


def test_a_smaller_buffer_lowers_the_limit() -> None:
    assert pick_algorithm(64 * KiB, 2, 32 * KiB) is None
    assert pick_algorithm(32 * KiB, 2, 32 * KiB) == "one_shot"


def test_env_var_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv(SYMM_MEM_ENV, raising=False)
    assert symm_mem_enabled()
    monkeypatch.setenv(SYMM_MEM_ENV, "0")
    assert not symm_mem_enabled()
    assert unavailable_reason(None, torch.device("cuda", 0), MAX_SIZE) == f"{SYMM_MEM_ENV}=0"
    monkeypatch.setenv(SYMM_MEM_ENV, "1")
    assert symm_mem_enabled()


def test_off_without_a_process_group(monkeypatch) -> None:
    monkeypatch.delenv(SYMM_MEM_ENV, raising=False)
    comm = SymmMemCommunicator(None, torch.device("cuda", 0))
    assert comm.disabled and "not initialized" in comm.reason
    x = torch.zeros(4, 4096, dtype=torch.bfloat16)
    assert not comm.should_use_symm_mem(x)
    with pytest.raises(ValueError, match="inp"):
        comm.all_reduce(x)


class _Enabled(SymmMemCommunicator):
    """The selection logic of an enabled communicator, without allocating a buffer."""

    def __init__(self, world_size: int, force_algorithm: str | None = None) -> None:
        self.disabled, self.world_size, self.max_size = False, world_size, MAX_SIZE
        self.force_algorithm = force_algorithm


def test_which_tensors_are_taken() -> None:
    comm = _Enabled(2)
    bf16 = torch.zeros(256, 4096, dtype=torch.bfloat16)
    assert comm.algorithm(bf16) == "two_shot"  # 2 MiB
    assert comm.algorithm(bf16[:8]) == "one_shot"
    assert comm.algorithm(bf16.float()) == "two_shot"
    assert comm.algorithm(bf16.half()) is None  # torch's kernels: bf16 and fp32 only
    assert comm.algorithm(bf16.t()) is None  # not contiguous
    assert comm.algorithm(bf16[:0]) is None  # empty
    assert comm.algorithm(torch.zeros(3, dtype=torch.bfloat16)) is None  # 6 bytes
    # A row slice keeps 16-byte alignment; an odd element offset does not.
    assert comm.algorithm(bf16[1:]) == "two_shot"
    assert comm.algorithm(bf16.view(-1)[1:4097]) is None
    assert comm.algorithm(torch.zeros(1025, 4096, dtype=torch.bfloat16)) is None  # > 8 MiB
    assert _Enabled(8).algorithm(bf16) == "two_shot"
    # A forced algorithm applies only to messages the buffer takes at all.
    assert _Enabled(2, "one_shot").algorithm(bf16) == "one_shot"
    assert _Enabled(2, "two_shot").algorithm(bf16.half()) is None


def test_force_algorithm_is_checked() -> None:
    with pytest.raises(ValueError, match="force_algorithm"):
        SymmMemCommunicator(None, CPU, force_algorithm="multimem")


def _gloo_rank(rank: int, world: int, init: str, results) -> None:
    torch.manual_seed(rank)
    init_distributed_environment(world, rank, init, "gloo")
    try:
        comm = init_symm_mem_communicator(CPU)
        assert get_symm_mem_communicator() is comm
        x = torch.randn(8, 64)
        local = x.clone()
        out = tensor_model_parallel_all_reduce(x)
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        results[rank] = (comm.disabled, comm.reason, out is x, torch.equal(out, sum(gathered)))
    finally:
        destroy_distributed_environment()
        results[f"{rank}_after"] = get_symm_mem_communicator() is None


def test_gloo_group_falls_back_to_torch_distributed(monkeypatch) -> None:
    monkeypatch.delenv(SYMM_MEM_ENV, raising=False)
    init = get_distributed_init_method("127.0.0.1", get_open_port())
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_gloo_rank, args=(2, init, results), nprocs=2, start_method="spawn")
        results = dict(results)
    for rank in (0, 1):
        disabled, reason, in_place, equal = results[rank]
        assert disabled and reason == "device cpu is not CUDA"
        assert in_place and equal
        assert results[f"{rank}_after"]
