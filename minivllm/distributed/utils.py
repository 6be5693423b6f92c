"""Helpers around the process group: the rendezvous address and the TP size checks.

Upstream counterparts: ``vllm/utils/network_utils.py`` (``get_open_port``,
``get_distributed_init_method``) and ``ModelConfig.verify_with_parallel_config`` in
``vllm/config/model.py``.
"""

from __future__ import annotations

import socket
from typing import Any

import torch


def get_open_port() -> int:
    """A TCP port on the loopback interface that is free right now.

    The port is released before the ranks bind it, so another program could take it in
    between; on one machine, for the second this takes, that is an accepted risk (vLLM
    picks its rendezvous port the same way).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_distributed_init_method(ip: str, port: int) -> str:
    """The ``init_method`` URL every rank passes to ``torch.distributed``."""
    return f"tcp://{ip}:{port}"


def verify_tensor_parallel_size(hf_config: Any, tp_size: int, device: torch.device) -> None:
    """Reject a ``tensor_parallel_size`` this model or machine cannot be split over.

    Checked before any process starts, so a bad value costs nothing:

    * the query heads are split evenly (each rank runs whole heads);
    * the KV heads are either split evenly or, when there are fewer KV heads than ranks,
      each is replicated on ``tp_size / num_kv_heads`` ranks, which needs that to divide;
    * the MLP's intermediate size is split evenly;
    * on CUDA, one GPU per rank.
    """
    if tp_size == 1:
        return
    heads = hf_config.num_attention_heads
    if heads % tp_size:
        raise ValueError(
            f"tensor_parallel_size={tp_size} must divide num_attention_heads={heads}"
        )
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if kv_heads % tp_size and tp_size % kv_heads:
        raise ValueError(
            f"tensor_parallel_size={tp_size} must divide num_key_value_heads={kv_heads} "
            f"or be a multiple of it (then each KV head is replicated)"
        )
    inter = getattr(hf_config, "intermediate_size", None)
    if inter is not None and inter % tp_size:
        raise ValueError(
            f"tensor_parallel_size={tp_size} must divide intermediate_size={inter}"
        )
    if device.type == "cuda" and tp_size > torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size={tp_size} needs {tp_size} GPUs, but only "
            f"{torch.cuda.device_count()} are visible"
        )
