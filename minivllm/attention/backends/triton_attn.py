"""The Triton attention backend: two torch custom ops, ``minivllm::reshape_and_cache`` and
``minivllm::paged_attention``, with the same signatures and meaning as ``reference.py``.

Why custom ops rather than plain Python functions calling Triton: a registered op is one
opaque node to the dispatcher, so ``torch.compile`` traces *around* it (using the fake
implementation below to learn output shapes without running it), CUDA-graph capture
records its kernels like any other op, and profilers show it by name. The "Attention
backends and operator dispatch" chapter compares this with vLLM's
``direct_register_custom_op`` and ``unified_attention_with_output``.

The kernels themselves live in ``triton_reshape_and_cache.py``,
``triton_unified_attention.py`` and ``triton_decode_split.py``.
"""

from __future__ import annotations

import torch

from minivllm.attention.triton_launch_config import launch_configs, select_config
from minivllm.attention.triton_reshape_and_cache import launch_reshape_and_cache
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.utils.torch_utils import direct_register_custom_op

# ---------------------------------------------------------------------------------------
# Argument checks (host-side metadata only: they never read device memory, so no sync).
# ---------------------------------------------------------------------------------------


def _check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_size], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        raise ValueError(
            f"value_cache {tuple(value_cache.shape)}/{value_cache.dtype} must match "
            f"key_cache {tuple(key_cache.shape)}/{key_cache.dtype}"
        )
    if value_cache.stride() != key_cache.stride() or key_cache.stride(3) != 1:
        raise ValueError(
            "key_cache and value_cache must share one layout with a contiguous last dim, "
            f"got strides {key_cache.stride()} and {value_cache.stride()}"
        )


def _check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_reshape_and_cache_args(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Raise ``ValueError`` naming the bad argument if the cache write is ill-formed."""
    _check_cache(key_cache, value_cache)
    _check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                       slot_mapping=slot_mapping)
    expected = (key.shape[0], *key_cache.shape[2:])
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
        if t.stride(2) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension")
    if slot_mapping.shape != (key.shape[0],) or slot_mapping.is_floating_point():
        raise ValueError(
            f"slot_mapping must be an integer tensor of shape ({key.shape[0]},), got "
            f"{tuple(slot_mapping.shape)}/{slot_mapping.dtype}"
        )


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the bad argument if the attention call is ill-formed."""
    _check_cache(key_cache, value_cache)
    _check_same_device(query=query, key_cache=key_cache, block_table=block_table,
                       seq_lens=seq_lens, query_start_loc=query_start_loc)
    if query.dim() != 3 or query.shape[2] != key_cache.shape[3] or query.stride(2) != 1:
        raise ValueError(
            f"query must be [num_tokens, num_heads, {key_cache.shape[3]}] with a contiguous "
            f"last dim, got {tuple(query.shape)}"
        )
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} must match the cache's {key_cache.dtype}")
    if query.shape[1] % key_cache.shape[2] != 0:
        raise ValueError(
            f"num_heads={query.shape[1]} must be a multiple of num_kv_heads={key_cache.shape[2]}"
        )
    num_seqs = seq_lens.shape[0]
    for name, t, shape in (
        ("seq_lens", seq_lens, (num_seqs,)),
        ("query_start_loc", query_start_loc, (num_seqs + 1,)),
        ("block_table", block_table, (num_seqs, block_table.shape[-1])),
    ):
        if t.dtype not in (torch.int32, torch.int64) or tuple(t.shape) != shape:
            raise ValueError(f"{name} must be int32/int64 of shape {shape}, got "
                             f"{tuple(t.shape)}/{t.dtype}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table must have a contiguous last dimension")
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype
                            or out.device != query.device or out.stride(2) != 1):
        raise ValueError(
            f"out must match query ({tuple(query.shape)}, {query.dtype}, {query.device}), "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}"
        )


def _check_step_kv(query: torch.Tensor, key_cache: torch.Tensor, **tensors: torch.Tensor) -> None:
    """This step's key/value must be one row per query token, one KV head per cache head."""
    expected = (query.shape[0], *key_cache.shape[2:])
    for name, t in tensors.items():
        if tuple(t.shape) != expected or t.stride(2) != 1 or t.device != query.device:
            raise ValueError(
                f"{name} must be {expected} with a contiguous last dim on {query.device}, "
                f"got {tuple(t.shape)} on {t.device}"
            )


# ---------------------------------------------------------------------------------------
# The custom ops. Each has a real implementation (launch Triton) and a fake one that
# only describes effects on shapes; both ops write into arguments and return nothing,
# which is how upstream's unified_attention_with_output is shaped too.
# ---------------------------------------------------------------------------------------


def reshape_and_cache_op(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Registered op: scatter K/V into the paged cache (see :func:`reshape_and_cache`)."""
    launch_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def _reshape_and_cache_fake(key, value, key_cache, value_cache, slot_mapping) -> None:
    # In-place on the caches: no new tensors, nothing to describe.
    return None


direct_register_custom_op(
    "reshape_and_cache", None, reshape_and_cache_op, _reshape_and_cache_fake,
    mutates_args=("key_cache", "value_cache"),
)


def paged_attention_op(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    num_kv_splits: int | None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
) -> None:
    """Registered op: paged attention into ``out`` (see :func:`paged_attention`)."""
    if max_query_len != 1:
        seq_order = None  # a sequence may span several q-blocks: the kernel finds them
    config = select_config(
        num_tokens=query.shape[0],
        num_seqs=seq_lens.shape[0],
        num_heads=query.shape[1],
        num_kv_heads=key_cache.shape[2],
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        device=query.device,
        num_kv_splits=num_kv_splits,
        head_size=query.shape[2],
        element_size=query.element_size(),
        ordered=seq_order is not None,
    )
    launch_unified_attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, scale,
        config, key=key, value=value, seq_order=seq_order,
    )


def _paged_attention_fake(query, key_cache, value_cache, block_table, seq_lens,
                          query_start_loc, out, scale, max_query_len, max_seq_len,
                          num_kv_splits, key=None, value=None, seq_order=None) -> None:
    return None


direct_register_custom_op(
    "paged_attention", None, paged_attention_op, _paged_attention_fake, mutates_args=("out",)
)


# ---------------------------------------------------------------------------------------
# The public functions the engine calls (same signatures as reference.py, plus optional
# keyword-only hints).
# ---------------------------------------------------------------------------------------


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write this step's keys and values into the paged cache, in place (Triton).

    Same contract as ``reference.reshape_and_cache``: ``key``/``value`` are
    ``[num_tokens, num_kv_heads, head_size]``, the caches
    ``[num_blocks, block_size, num_kv_heads, head_size]``, and token ``t`` goes to slot
    ``slot_mapping[t]`` (skipped when negative).
    """
    check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping)
    torch.ops.minivllm.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(
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
    num_kv_splits: int | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal paged attention of each sequence's new tokens over its cached context (Triton).

    Same contract as ``reference.paged_attention``. The keyword-only extras never change
    the result, only how it is computed:

    Args:
        out: Where to write the ``[num_tokens, num_heads, head_size]`` result (a fresh
            tensor when None). Rows of tokens that belong to no sequence are left as is.
        max_query_len: Longest query of the batch, a host int (the engine has it in
            ``AttentionMetadata``); picks decode- or prefill-sized tiles. When None it is
            bounded by ``num_tokens - num_seqs + 1`` without reading the device.
        max_seq_len: Longest context, a host int; feeds the split-KV heuristic. When None
            the block table's capacity ``max_blocks_per_seq * block_size`` stands in.
        num_kv_splits: Force the number of split-KV segments (1 = never split; a power of
            two >= 2 = always split that many ways). None = automatic (see
            ``triton_decode_split.choose_num_segments``).
        key: This step's keys, ``[num_tokens, num_kv_heads, head_size]``, as just written
            to the cache (``value`` likewise). A prefill then reads each chunk's own keys
            from these dense rows, and only the cached prefix through the block table.
        seq_order: A permutation of the sequences, ``[num_seqs]`` int32/int64 on the
            query's device: the order the kernel's programs take them in, best longest
            context first (``AttentionMetadata.seq_order``). Used for a decode batch
            (``max_query_len`` 1), ignored otherwise; it also selects the tiles measured
            for that order. Not checked to be a permutation (that would read the
            device); one that is not leaves rows unwritten.

    Returns:
        ``out``.
    """
    check_paged_attention_args(query, key_cache, value_cache, block_table, seq_lens,
                               query_start_loc, out)
    if seq_order is not None and (
        seq_order.dtype not in (torch.int32, torch.int64)
        or tuple(seq_order.shape) != tuple(seq_lens.shape)
        or seq_order.device != query.device
    ):
        raise ValueError(
            f"seq_order must be int32/int64 of shape {tuple(seq_lens.shape)} on "
            f"{query.device}, got {tuple(seq_order.shape)}/{seq_order.dtype} on "
            f"{seq_order.device}"
        )
    if (key is None) != (value is None):
        raise ValueError("key and value must be given together (or neither)")
    if key is not None:
        _check_step_kv(query, key_cache, key=key, value=value)
    if num_kv_splits is not None and (num_kv_splits < 1 or num_kv_splits & (num_kv_splits - 1)):
        raise ValueError(f"num_kv_splits must be a power of two >= 1, got {num_kv_splits}")
    num_tokens, num_seqs = query.shape[0], seq_lens.shape[0]
    if max_query_len is None:
        max_query_len = max(1, num_tokens - num_seqs + 1)
    if max_seq_len is None:
        max_seq_len = block_table.shape[1] * key_cache.shape[1]
    if out is None:
        out = torch.empty_like(query)
    torch.ops.minivllm.paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out,
        float(scale), int(max_query_len), int(max_seq_len), num_kv_splits, key, value,
        seq_order,
    )
    return out


def warm_up_attention(
    key_cache: torch.Tensor, value_cache: torch.Tensor, num_heads: int, max_model_len: int
) -> int:
    """Compile every attention kernel variant the engine can launch; return how many.

    Each configuration of :func:`launch_configs` runs once on a one-token batch (the
    decode ones twice, also in a given sequence order) that
    reads block 0 of the given cache and writes only a scratch output, so the real
    cache's dtype, layout and alignment are what Triton specializes on. The query, key
    and value are views of one fused projection row, as the model hands them over (their
    strides and alignment are specialized on too).
    """
    _check_cache(key_cache, value_cache)
    num_kv_heads, head_size = key_cache.shape[2:]
    device = key_cache.device
    qkv = torch.zeros(
        1, (num_heads + 2 * num_kv_heads) * head_size, dtype=key_cache.dtype, device=device
    )
    query, key, value = (
        t.view(1, -1, head_size)
        for t in qkv.split([num_heads * head_size, *(2 * [num_kv_heads * head_size])], dim=1)
    )
    out = torch.empty_like(query)
    i32 = dict(dtype=torch.int32, device=device)
    block_table = torch.zeros(1, 1, **i32)
    seq_lens = torch.ones(1, **i32)
    query_start_loc = torch.tensor([0, 1], **i32)
    sizes = dict(
        num_heads=num_heads,
        num_kv_heads=key_cache.shape[2],
        head_size=head_size,
        element_size=key_cache.element_size(),
        max_model_len=max_model_len,
        device=device,
    )
    # A decode batch runs its sequences in a given order (AttentionMetadata.seq_order,
    # int64 from torch.argsort): another variant of each decode configuration.
    seq_order = torch.zeros(1, dtype=torch.int64, device=device)
    launches = [(config, None) for config in launch_configs(**sizes)]
    launches += [(config, seq_order) for config in launch_configs(**sizes, ordered=True)]
    for config, order in launches:
        launch_unified_attention(
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, 1.0,
            config, key=key, value=value, seq_order=order,
        )
    return len(launches)
