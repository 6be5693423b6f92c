"""The attention backend selector: which implementation of the two paged-attention ops runs.

Upstream counterpart: ``vllm/v1/attention/selector.py`` picks one of many backend
classes (FlashAttention, FlashInfer, Triton, ...). minivllm has two, with identical
signatures: the torch oracle in ``reference.py`` and the Triton kernels in
``backends/triton_attn.py``. ``"auto"`` picks Triton on CUDA and the torch backend on
the CPU, where interpreted Triton would be correct but slow.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Protocol

import torch

BACKEND_NAMES = ("auto", "torch", "triton")


class ReshapeAndCache(Protocol):
    """Signature of the cache-write op."""

    def __call__(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...


class PagedAttention(Protocol):
    """Signature of the attention op.

    The keyword-only hints are host-side facts the engine already knows; a backend may
    use them to pick a launch configuration without reading the device, or ignore them.
    ``key``/``value`` are this step's keys and values, already written to the cache: a
    backend may read the query chunk's own keys from them instead of the cache.
    ``seq_order`` is a device-side permutation of the sequences (longest context first)
    that a backend may run them in; it never changes the result. ``out``, when given, is
    where the result is written (and what is returned).
    """

    def __call__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        *,
        out: torch.Tensor | None = None,
        max_query_len: int | None = None,
        max_seq_len: int | None = None,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        seq_order: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionBackend:
    """A named pair of ops: write K/V into the paged cache, attend over it.

    ``fused_kv_cache_write``: whether an op fused before attention may write the cache in
    this backend's place (``Attention.fusable_kv_cache_update``); upstream asks the same of
    a backend's ``fused_rope_kvcache_supported``. Off for the torch backend, the oracle the
    kernels are checked against, which keeps its own write.

    ``takes_seq_order``: whether ``paged_attention`` uses a decode batch's
    ``AttentionMetadata.seq_order``; the layer asks the metadata for it only for such a
    backend (a batch built without a host-sorted order then sorts on the device).

    ``splits_decodes``: whether the layer attends a mixed batch's decodes and prompt
    chunks in two calls (``AttentionMetadata.decode_split``): worth it where one call
    gives every row of the batch the same tiles (the Triton kernel); the oracle takes the
    batch whole.
    """

    name: str
    reshape_and_cache: ReshapeAndCache
    paged_attention: PagedAttention
    fused_kv_cache_write: bool = False
    takes_seq_order: bool = False
    splits_decodes: bool = False


def triton_available() -> tuple[bool, str]:
    """Whether the Triton backend can run here, and why not when it cannot."""
    if not sys.platform.startswith("linux"):
        return False, "Triton is a Linux-only dependency"
    try:
        importlib.import_module("triton")
    except ImportError as exc:  # pragma: no cover - depends on the install
        return False, f"triton is not installed ({exc})"
    return True, ""


def check_attn_backend(name: str, device: torch.device) -> None:
    """Refuse a backend name that cannot run on ``device``, saying how to fix it.

    Triton compiles its kernels for a GPU. On the CPU they run only in Triton's
    interpreter, which Triton turns on when ``TRITON_INTERPRET=1`` is set as it is first
    imported; without it the first launch fails deep inside Triton ("0 active drivers").
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention_backend must be one of {BACKEND_NAMES}, got {name!r}")
    if name != "triton":
        return
    ok, why = triton_available()
    if not ok:
        raise ValueError(f"attention_backend='triton' is unavailable: {why}")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"attention_backend='triton' needs a CUDA GPU, but the device is {device.type!r}: "
            "use attention_backend='torch' (or 'auto', which picks it there), or set "
            "TRITON_INTERPRET=1 in the environment before Python starts to run the Triton "
            "kernels in Triton's interpreter (correct, but slow)"
        )


def get_attn_backend(name: str, device: torch.device) -> AttentionBackend:
    """Resolve a backend name (``"auto"``, ``"torch"`` or ``"triton"``) for a device."""
    check_attn_backend(name, device)
    if name == "auto":
        ok, _ = triton_available()
        name = "triton" if device.type == "cuda" and ok else "torch"
    if name == "triton":
        from minivllm.attention.backends import triton_attn

        return AttentionBackend(
            "triton", triton_attn.reshape_and_cache, triton_attn.paged_attention,
            fused_kv_cache_write=True, takes_seq_order=True, splits_decodes=True,
        )  # fmt: skip
    from minivllm.attention import reference

    return AttentionBackend("torch", reference.reshape_and_cache, _reference_paged_attention)


def _reference_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch oracle behind the backend signature (it needs no launch hints, and reads
    every key from the cache)."""
    from minivllm.attention import reference

    result = reference.paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale
    )
    return result if out is None else out.copy_(result)
