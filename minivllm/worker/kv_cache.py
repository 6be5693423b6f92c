"""The paged KV cache: its geometry, its size, and its tensors.

Upstream counterparts: ``vllm/v1/kv_cache_interface.py`` (``FullAttentionSpec`` and its
page size), ``vllm/v1/core/kv_cache_utils.py`` (``get_num_blocks``) and the allocation
in the GPU model runner (``initialize_kv_cache``).

Each decoder layer gets one K and one V tensor of shape
``[num_blocks, block_size, num_kv_heads, head_size]``. Block ``b`` of every layer
belongs to the same request: the block pool hands out block *ids*, and an id is valid
in all layers at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minivllm.attention.layer import Attention
from minivllm.attention.selector import AttentionBackend
from minivllm.config import ModelConfig
from minivllm.core.kv_cache_utils import get_num_blocks, page_size_bytes
from minivllm.utils.math_utils import cdiv

_GIB = 1 << 30


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the cache of every layer (one KV group: all layers alike)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    num_layers: int

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block takes in one layer: K and V for ``block_size`` tokens."""
        return page_size_bytes(
            self.block_size, self.num_kv_heads, self.head_size, self.dtype.itemsize
        )

    @property
    def block_bytes_all_layers(self) -> int:
        """Bytes one block id costs across the whole model."""
        return self.page_size_bytes * self.num_layers


def kv_spec_for(model_config: ModelConfig, block_size: int, tp_size: int = 1) -> KVCacheSpec:
    """The cache geometry of ``model_config``'s model on one of ``tp_size`` ranks."""
    return KVCacheSpec(
        block_size=block_size,
        num_kv_heads=model_config.get_num_kv_heads(tp_size),
        head_size=model_config.get_head_size(),
        dtype=model_config.dtype,
        num_layers=model_config.get_num_layers(),
    )


def block_bytes(spec: KVCacheSpec, draft: KVCacheSpec | None = None) -> int:
    """Bytes one block id costs: the model's cache, plus a draft model's if any."""
    return spec.block_bytes_all_layers + (draft.block_bytes_all_layers if draft else 0)


def num_blocks_from_memory(
    spec: KVCacheSpec, available_bytes: int, draft: KVCacheSpec | None = None
) -> int:
    """How many blocks of ``spec`` fit in ``available_bytes`` (see ``get_num_blocks``).

    With a draft model, one block id costs the target's bytes *and* the draft's, since
    the draft's cache is indexed by the same block ids.
    """
    if draft is None:
        return get_num_blocks(available_bytes, spec.page_size_bytes, spec.num_layers)
    return max(int(available_bytes) // block_bytes(spec, draft), 0)


def cpu_default_num_blocks(
    spec: KVCacheSpec,
    space_gib: float,
    max_num_seqs: int,
    max_model_len: int,
    draft: KVCacheSpec | None = None,
) -> int:
    """Pool size on the CPU: ``space_gib`` of cache (the draft's share included), but
    never more blocks than ``max_num_seqs`` full-length requests could ever hold (memory
    beyond that is idle)."""
    by_space = num_blocks_from_memory(spec, int(space_gib * _GIB), draft)
    useful = max_num_seqs * cdiv(max_model_len, spec.block_size)
    return max(1, min(by_space, useful))


def allocate_kv_caches(
    spec: KVCacheSpec, num_blocks: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate ``(key_cache, value_cache)`` for every layer.

    ``torch.empty``, not zeros: a slot is always written before it is read, because a
    sequence only attends to positions below its ``seq_len``.
    """
    shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    return [
        (
            torch.empty(shape, dtype=spec.dtype, device=device),
            torch.empty(shape, dtype=spec.dtype, device=device),
        )
        for _ in range(spec.num_layers)
    ]


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's Attention layers, in forward order."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def bind_kv_cache(
    model: nn.Module,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    backend: AttentionBackend,
) -> None:
    """Give each Attention layer its own slice of the cache and the backend to use."""
    layers = attention_layers(model)
    if len(layers) != len(kv_caches):
        raise ValueError(f"model has {len(layers)} attention layers, got {len(kv_caches)} caches")
    for layer, cache in zip(layers, kv_caches):
        layer.kv_cache = cache
        layer.backend = backend
