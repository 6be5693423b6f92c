"""Rotary position embedding (RoPE), neox layout, with optional Llama-3 frequency scaling.

Upstream counterpart: ``vllm/model_executor/layers/rotary_embedding/`` (``get_rope`` in
``__init__.py``, ``RotaryEmbeddingBase`` / ``RotaryEmbedding`` in ``base.py``,
``Llama3RotaryEmbedding`` in ``llama3_rope.py``).

RoPE rotates each (x_i, x_{i+d/2}) pair of a query or key head by the angle
``position * inv_freq_i``, so the dot product of a query and a key depends only on
their distance. The angles depend on the position alone, so ``cos`` and ``sin`` are
computed once for every position up to ``max_position_embeddings`` and looked up by
each token's position; the batch can then be a flat list of tokens from many
sequences at different positions.

``RotaryEmbedding`` is a :class:`~minivllm.model_executor.custom_op.CustomOp`: the torch
code is ``forward_native``; on CUDA, ``forward_cuda`` rotates q and k in place with one
Triton launch (``triton_rotary.py``). Llama-3 scaling only changes the cos/sin cache, so
both paths serve it unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from minivllm.model_executor.custom_op import CustomOp

_ROPE_CACHE: dict[tuple[Any, ...], RotaryEmbedding] = {}


class RotaryEmbedding(CustomOp):
    """Neox-style RoPE over flat ``[num_tokens, num_heads * head_size]`` tensors.

    Args:
        head_size: Size of each head (the whole head is rotated).
        max_position_embeddings: Positions covered by the precomputed cache.
        base: ``rope_theta``.
        scaling: Llama-3 scaling parameters (``factor``, ``low_freq_factor``,
            ``high_freq_factor``, ``original_max_position_embeddings``) or None.
        dtype: Dtype of the cache; the model dtype, since HF also casts cos/sin to the
            activations' dtype before rotating.
    """

    def __init__(
        self,
        head_size: int,
        max_position_embeddings: int,
        base: float,
        scaling: dict[str, Any] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if head_size % 2 != 0:
            raise ValueError(f"rotary embedding needs an even head_size, got {head_size}")
        self.head_size = head_size
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.scaling = scaling
        cache = self._compute_cos_sin_cache().to(dtype or torch.get_default_dtype())
        # Not persistent: derived from the config, never stored in a checkpoint.
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        """``base ** (-2i / d)`` for ``i < d / 2``, in float32, then Llama-3 scaled."""
        exponents = torch.arange(0, self.head_size, 2, dtype=torch.int64).float()
        inv_freq = 1.0 / (self.base ** (exponents / self.head_size))
        if self.scaling is not None:
            inv_freq = llama3_scale_inv_freq(inv_freq, **self.scaling)
        return inv_freq

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """``[max_position, head_size]``: cos of each angle, then sin (float32)."""
        inv_freq = self._compute_inv_freq()
        positions = torch.arange(self.max_position_embeddings, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        x = x.view(num_tokens, -1, self.head_size)
        x1, x2 = x.chunk(2, dim=-1)
        # Neox layout: element i pairs with element i + d/2 (not with i + 1 as in GPT-J).
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return rotated.view(num_tokens, -1)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query`` ``[T, H * D]`` and ``key`` ``[T, KVH * D]`` by ``positions`` ``[T]``.

        Returns new tensors of the same shapes (and dtypes).
        """
        # No range check here: it would cost a device sync in every layer. The engine
        # rejects requests longer than max_model_len <= max_position_embeddings.
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        # [T, D/2] -> [T, 1, D/2]: the same angles for every head of a token.
        cos = cos.unsqueeze(1).to(query.dtype)
        sin = sin.unsqueeze(1).to(query.dtype)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def forward_cuda(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_native`` as one Triton launch for q and k, rotating them in place.

        Returns ``(query, key)`` themselves. In place is safe in the models: q and k are
        slices of this step's qkv projection output, read by nothing else. The cache
        stays in its own dtype; the kernel casts each cos/sin to the query's dtype.
        """
        from minivllm.model_executor.layers import triton_rotary  # Triton is optional

        return triton_rotary.rotary_embedding(
            positions, query, key, self.head_size, self.cos_sin_cache
        )


def llama3_scale_inv_freq(
    inv_freq: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> torch.Tensor:
    """Llama-3 context extension: slow down only the low frequencies.

    Frequencies whose wavelength is short compared with the original context keep
    their value (they encode local order); those with a wavelength longer than the
    original context are divided by ``factor`` (they now have to span a longer
    context); the band in between is interpolated smoothly.
    """
    old_len = original_max_position_embeddings
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    if low_freq_factor != high_freq_factor:
        smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    else:
        smooth = torch.zeros_like(inv_freq)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, interpolated)
    return torch.where(wavelen < high_freq_wavelen, inv_freq, scaled)


def rope_parameters_from_config(hf_config: Any) -> dict[str, Any]:
    """The RoPE settings of a HF config, whichever transformers version wrote it.

    transformers 5 stores them in ``rope_parameters`` (``rope_theta`` included); older
    configs have a top-level ``rope_theta`` and an optional ``rope_scaling`` dict that
    may spell the type ``type`` instead of ``rope_type``.
    """
    params = dict(
        getattr(hf_config, "rope_parameters", None)
        or getattr(hf_config, "rope_scaling", None)
        or {}
    )
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    return params


def get_rope(
    head_size: int,
    max_position_embeddings: int,
    rope_parameters: dict[str, Any],
    dtype: torch.dtype | None = None,
) -> RotaryEmbedding:
    """Return the (shared) rotary embedding for these settings.

    Every attention layer of a model uses the same angles; sharing one module keeps a
    single cos/sin cache (for a 128K-position Llama 3 that is 64 MiB per copy).

    Raises:
        ValueError: an unsupported ``rope_type`` (minivllm has ``default`` and ``llama3``).
    """
    dtype = dtype or torch.get_default_dtype()
    rope_type = rope_parameters.get("rope_type", "default")
    scaling = None
    if rope_type == "llama3":
        scaling = {
            key: rope_parameters[key]
            for key in (
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            )
        }
    elif rope_type != "default":
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: 'default', 'llama3')"
        )
    base = float(rope_parameters.get("rope_theta", 10000.0))
    device = torch.get_default_device()
    key = (
        head_size,
        max_position_embeddings,
        base,
        tuple(sorted((scaling or {}).items())),
        dtype,
        device,
    )
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = RotaryEmbedding(head_size, max_position_embeddings, base, scaling, dtype)
    return _ROPE_CACHE[key]
