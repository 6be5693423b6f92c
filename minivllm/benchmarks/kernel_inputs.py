"""What the attention benchmarks feed the kernel: Qwen3-0.6B's attention shapes, a random
paged KV cache with shuffled blocks, the same keys laid out for SDPA, a prefill step's
q/k/v, the FLOPs of causal attention, and the variant sweep's cases (one shape's launcher
arguments with SDPA's output on the same keys to check against).

Upstream counterpart: ``create_kv_caches_with_random_flash`` in
``vllm/utils/torch_utils.py`` and the input setup of
``benchmarks/kernels/benchmark_paged_attention.py``. ``bench kernel`` (``kernel.py``), the
variant sweep (``kernel_variants.py``) and the tile sweep (``kernel_sweep.py``) all time
the kernel on these inputs, so their figures compare.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.utils.math_utils import cdiv

# Qwen3-0.6B attention: 16 query heads, 8 KV heads, head size 128; vLLM's block size 16.
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 16, 8, 128, 16
DTYPE = torch.bfloat16


def make_paged_kv(num_seqs: int, seq_len: int, gen: torch.Generator, device: str = "cuda") -> dict:
    """Random paged K/V for ``num_seqs`` sequences of ``seq_len`` tokens, shuffled blocks.

    The block table is a random permutation of the pool, so every logical block lands at
    a random place in memory, as in a long-running server.
    """
    blocks_per_seq = cdiv(seq_len, BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    k = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    v = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    return {"key_cache": k, "value_cache": v, "block_table": perm.view(num_seqs, blocks_per_seq)}


def contiguous_kv(paged: dict, num_seqs: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    """The same keys/values as ``[seqs, kv_heads, seq_len, head]`` (SDPA's layout)."""
    idx = paged["block_table"].long()
    out = []
    for name in ("key_cache", "value_cache"):
        t = paged[name][idx].view(num_seqs, -1, NUM_KV_HEADS, HEAD_SIZE)[:, :seq_len]
        out.append(t.transpose(1, 2).contiguous())
    return tuple(out)


def step_qkv(
    paged: dict, batch: int, prefix: int, new: int, gen: torch.Generator, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prefill step's q, k, v as the model hands them to attention: views of one fused
    projection output, the chunk's keys/values equal to the cache's positions
    ``prefix .. prefix + new - 1`` of each sequence (already written)."""
    width = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE
    qkv = torch.empty(batch * new, width, dtype=DTYPE, device=device)
    q = qkv[:, : NUM_HEADS * HEAD_SIZE].view(-1, NUM_HEADS, HEAD_SIZE)
    q.copy_(torch.randn(q.shape, dtype=DTYPE, device=device, generator=gen))
    idx = paged["block_table"].long()
    kv = []
    for i, name in enumerate(("key_cache", "value_cache")):
        lo = (NUM_HEADS + i * NUM_KV_HEADS) * HEAD_SIZE
        view = qkv[:, lo : lo + NUM_KV_HEADS * HEAD_SIZE].view(-1, NUM_KV_HEADS, HEAD_SIZE)
        rows = paged[name][idx].view(batch, -1, NUM_KV_HEADS, HEAD_SIZE)[:, prefix : prefix + new]
        view.copy_(rows.reshape(view.shape))
        kv.append(view)
    return q, kv[0], kv[1]


def causal_flops(batch: int, prefix: int, new: int) -> float:
    """FLOPs of causal attention for ``batch`` chunks of ``new`` queries over ``prefix``
    cached keys each."""
    # Query t (0-based) of a chunk sees prefix + t + 1 keys; QK^T and PV are 2 FLOPs per
    # multiply-add each, so 4 * head_size FLOPs per (query head, visible key).
    visible = batch * (new * prefix + new * (new + 1) / 2)
    return 4.0 * NUM_HEADS * HEAD_SIZE * visible


def launcher_args(q: torch.Tensor, paged: dict, lens: torch.Tensor, starts: torch.Tensor) -> tuple:
    """``launch_unified_attention``'s positional arguments for ``q`` over ``paged`` (a fresh
    output, the model's softmax scale)."""
    return (q, paged["key_cache"], paged["value_cache"], paged["block_table"], lens, starts,
            torch.empty_like(q), HEAD_SIZE**-0.5)


def prefill_case(batch: int, prefix: int, new: int, device: str = "cuda") -> dict:
    """One prefill shape as the variant sweep runs it: the launcher's arguments (``out``
    the seventh), this step's key/value, SDPA on the same keys and its output, the FLOPs."""
    from torch.nn.attention.bias import causal_lower_right

    seq_len = prefix + new
    gen = torch.Generator(device=device).manual_seed(seq_len * 7 + batch)
    paged = make_paged_kv(batch, seq_len, gen, device)
    q, key, value = step_qkv(paged, batch, prefix, new, gen, device)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    starts = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=device)
    args = launcher_args(q, paged, lens, starts)
    group = NUM_HEADS // NUM_KV_HEADS
    k_c, v_c = (t.repeat_interleave(group, 1) for t in contiguous_kv(paged, batch, seq_len))
    q_sdpa = q.view(batch, new, NUM_HEADS, HEAD_SIZE).transpose(1, 2)
    mask = None if prefix == 0 else causal_lower_right(new, seq_len)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_sdpa, k_c, v_c, attn_mask=mask, is_causal=prefix == 0, scale=HEAD_SIZE**-0.5
        )

    expected = sdpa().transpose(1, 2).reshape_as(q)
    return {
        "args": args,
        "new_kv": {"key": key, "value": value},
        "hints": {"max_query_len": new, "max_seq_len": seq_len},
        "sdpa": sdpa,
        "expected": expected.reshape(q.shape),
        "flops": causal_flops(batch, prefix, new),
        "name": f"B{batch} prefix {prefix} new {new}",
    }


def decode_case(batch: int, context: int, device: str = "cuda") -> dict:
    """One decode shape as the variant sweep runs it: the launcher's arguments (``out`` the
    seventh), SDPA on the same keys laid out contiguously and its output, the bytes moved."""
    gen = torch.Generator(device=device).manual_seed(batch * 100003 + context)
    paged = make_paged_kv(batch, context, gen, device)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device=device, generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
    args = launcher_args(q, paged, lens, starts)
    k_c, v_c = contiguous_kv(paged, batch, context)
    # GQA packed as the kernel packs it: a KV head's query heads act as its query rows.
    q_sdpa = q.view(batch, NUM_KV_HEADS, NUM_HEADS // NUM_KV_HEADS, HEAD_SIZE)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q_sdpa, k_c, v_c, scale=HEAD_SIZE**-0.5)

    nbytes = 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * DTYPE.itemsize
    return {
        "args": args,
        "new_kv": {},
        "hints": {"max_query_len": 1, "max_seq_len": context},
        "sdpa": sdpa,
        "expected": sdpa().reshape_as(q),
        "bytes": nbytes + 2 * q.numel() * q.element_size(),
        "batch": batch,
        "context": context,
        "name": f"B{batch} C{context}",
    }
