"""The rank's torch CPU threads: one on a GPU unless OMP_NUM_THREADS says otherwise, the
machine's cores split between the ranks on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm.worker.worker import cpu_threads

CUDA = torch.device("cuda", 0)  # only its type is read: no GPU needed


def test_a_gpu_rank_runs_one_host_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads(CUDA, 1) == 1
    assert cpu_threads(CUDA, 2) == 1


def test_omp_num_threads_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cpu_threads(CUDA, 1) == 4
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
            cpu_threads(CUDA, 1)


def test_cpu_ranks_split_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cpu_threads(torch.device("cpu"), 1) == 16
    assert cpu_threads(torch.device("cpu"), 4) == 4
    assert cpu_threads(torch.device("cpu"), 32) == 1
