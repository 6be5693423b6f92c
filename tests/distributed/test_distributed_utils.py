"""Tensor-parallel size checks and the process-group helpers, without any process."""

from __future__ import annotations

import pytest
import torch

from minivllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    init_distributed_environment,
)
from minivllm.distributed.utils import (
    get_distributed_init_method,
    get_open_port,
    verify_tensor_parallel_size,
)
from minivllm.engine.arg_utils import EngineArgs
from tests.tiny_models import make_hf_config, make_tiny_model

CPU = torch.device("cpu")


def test_valid_sizes_pass() -> None:
    config = make_hf_config("llama", num_attention_heads=4, num_key_value_heads=2)
    for tp in (1, 2, 4):  # tp=4 > 2 KV heads: each KV head is replicated twice
        verify_tensor_parallel_size(config, tp, CPU)


@pytest.mark.parametrize(
    "overrides, tp, match",
    [
        (dict(num_attention_heads=4, num_key_value_heads=2), 3, "num_attention_heads=4"),
        (dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3), 2,
         "num_key_value_heads=3"),
        (dict(intermediate_size=130), 4, "intermediate_size=130"),
    ],
)
def test_invalid_sizes_are_named(overrides, tp: int, match: str) -> None:
    config = make_hf_config("llama", **overrides)
    with pytest.raises(ValueError, match=match):
        verify_tensor_parallel_size(config, tp, CPU)


def test_engine_args_reject_before_starting_anything(tmp_path) -> None:
    path = make_tiny_model("llama", tmp_path / "m")
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        EngineArgs(model=str(path), tensor_parallel_size=3).create_engine_config()


def test_single_rank_group_roundtrip() -> None:
    init = get_distributed_init_method("127.0.0.1", get_open_port())
    assert init.startswith("tcp://127.0.0.1:")
    init_distributed_environment(1, 0, init, "gloo")
    try:
        assert (get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()) == (1, 0)
        with pytest.raises(RuntimeError, match="already initialized"):
            init_distributed_environment(2, 1, init, "gloo")
    finally:
        destroy_distributed_environment()
    assert get_tensor_model_parallel_world_size() == 1
