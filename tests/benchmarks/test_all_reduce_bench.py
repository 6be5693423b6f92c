"""``python -m minivllm.benchmarks.all_reduce`` refuses what it cannot run before starting
any process (the sweep itself needs two GPUs; the H200 runs it)."""

from __future__ import annotations

import argparse

import pytest
import torch

from minivllm.benchmarks.all_reduce import add_args, run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_args(parser)
    return parser.parse_args(list(argv))


def test_one_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="--world-size must be at least 2"):
        run(_args("--world-size", "1"))


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has the GPUs")
def test_missing_gpus_are_named() -> None:
    with pytest.raises(ValueError, match="--world-size 8 needs as many GPUs"):
        run(_args("--world-size", "8"))
