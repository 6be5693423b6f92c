"""Layers: RoPE, RMSNorm, SiluAndMul, and tensor-parallel weight sharding.

Tensor parallelism is simulated in one process: the layer modules' view of
``parallel_state`` is monkeypatched to a given (world size, rank), one layer is built
per rank, and the ranks' results are combined by hand the way the collectives would.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minivllm.model_executor.layers import linear, vocab_parallel_embedding
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from minivllm.model_executor.layers.rotary_embedding import (
    RotaryEmbedding,
    get_rope,
    rope_parameters_from_config,
)
from minivllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)


def _simulate_tp(monkeypatch, world: int, rank: int) -> None:
    for module in (linear, vocab_parallel_embedding):
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: world)
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)


def _per_rank(monkeypatch, world: int, build):
    layers = []
    for rank in range(world):
        _simulate_tp(monkeypatch, world, rank)
        layers.append(build())
    return layers


# ---------------------------------------------------------------- rotary embedding


def _rope_by_complex_numbers(x: torch.Tensor, positions, head_size, inv_freq) -> torch.Tensor:
    """Neox RoPE as a complex rotation: (x_j + i x_{j+d/2}) * exp(i * pos * f_j)."""
    half = head_size // 2
    x = x.view(x.shape[0], -1, head_size).double()
    z = torch.complex(x[..., :half], x[..., half:])
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    z = z * torch.polar(torch.ones_like(angles), angles)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1).view(x.shape[0], -1)


def test_rope_matches_complex_rotation():
    head_size, base = 16, 10000.0
    rope = RotaryEmbedding(head_size, 128, base, dtype=torch.float32)
    positions = torch.tensor([0, 1, 5, 127, 64])
    q = torch.randn(5, 3 * head_size)
    k = torch.randn(5, 1 * head_size)
    q_rot, k_rot = rope(positions, q, k)
    inv_freq = base ** (-torch.arange(0, head_size, 2).double() / head_size)
    # float32 angles (as HF computes them) vs a float64 reference: ~1e-6 apart.
    for ours, x in ((q_rot, q), (k_rot, k)):
        expected = _rope_by_complex_numbers(x, positions, head_size, inv_freq)
        torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=1e-5)
    # Position 0 is the identity; a rotation preserves each pair's norm.
    torch.testing.assert_close(q_rot[0], q[0])
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1))


def test_llama3_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_parameters=params)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    rope = get_rope(64, 256, rope_parameters_from_config(config), dtype=torch.float32)
    inv_freq = rope._compute_inv_freq()
    torch.testing.assert_close(inv_freq, expected.float())
    plain = 500000.0 ** (-torch.arange(0, 64, 2).float() / 64)
    # All three regimes occur: kept, divided by factor, and interpolated.
    ratio = plain / inv_freq
    assert torch.isclose(ratio, torch.tensor(1.0)).any()
    assert torch.isclose(ratio, torch.tensor(8.0)).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_rope_parameters_from_legacy_config():
    legacy = SimpleNamespace(
        rope_theta=1e6,
        rope_scaling={
            "type": "llama3",
            "factor": 2.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    params = rope_parameters_from_config(legacy)
    assert params["rope_type"] == "llama3" and params["rope_theta"] == 1e6
    assert rope_parameters_from_config(SimpleNamespace()) == {
        "rope_type": "default",
        "rope_theta": 10000.0,
    }


def test_get_rope_shares_modules_and_rejects_unknown_types():
    params = {"rope_type": "default", "rope_theta": 10000.0}
    assert get_rope(16, 64, params) is get_rope(16, 64, dict(params))
    assert get_rope(16, 64, params) is not get_rope(16, 128, params)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        get_rope(16, 64, {"rope_type": "yarn", "rope_theta": 1.0})


# ---------------------------------------------------------------- norms and activation


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_hf_bitwise(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hidden = 48
    ours, theirs = RMSNorm(hidden, eps=1e-5), LlamaRMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        weight = torch.randn(hidden)
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(7, hidden) * 3).to(dtype)
    residual = torch.randn(7, hidden).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        normed, new_residual = ours(x, residual)
        assert torch.equal(new_residual, x + residual)
        assert torch.equal(normed, theirs(x + residual))


def test_silu_and_mul():
    x = torch.randn(5, 2 * 12)
    expected = F.silu(x[:, :12]) * x[:, 12:]
    torch.testing.assert_close(SiluAndMul()(x), expected)


# ---------------------------------------------------------------- tensor-parallel linear


def test_column_then_row_parallel_equals_full_mlp(monkeypatch):
    """Column shards need no communication; row partial sums add up to the full result."""
    world, hidden, inter = 4, 8, 16
    w_in, w_out, b_out = torch.randn(inter, hidden), torch.randn(hidden, inter), torch.randn(hidden)
    cols = _per_rank(monkeypatch, world, lambda: ColumnParallelLinear(hidden, inter, prefix="up"))
    rows = _per_rank(
        monkeypatch, world, lambda: RowParallelLinear(inter, hidden, bias=True, prefix="down")
    )
    x = torch.randn(3, hidden)
    partial_sums = []
    for rank in range(world):
        cols[rank].weight.weight_loader(cols[rank].weight, w_in)
        rows[rank].weight.weight_loader(rows[rank].weight, w_out)
        rows[rank].bias.weight_loader(rows[rank].bias, b_out)
        shard = inter // world
        torch.testing.assert_close(cols[rank].weight, w_in[rank * shard : (rank + 1) * shard])
        torch.testing.assert_close(rows[rank].weight, w_out[:, rank * shard : (rank + 1) * shard])
        partial_sums.append(F.linear(torch.relu(cols[rank](x)), rows[rank].weight))
    # What the all-reduce computes, then the bias once.
    combined = torch.stack(partial_sums).sum(0) + b_out
    expected = F.linear(torch.relu(F.linear(x, w_in)), w_out, b_out)
    torch.testing.assert_close(combined, expected, atol=1e-5, rtol=1e-5)


def test_merged_column_parallel_places_each_shard(monkeypatch):
    world, hidden, inter = 2, 4, 6
    gate, up = torch.randn(inter, hidden), torch.randn(inter, hidden)
    layers = _per_rank(
        monkeypatch, world, lambda: MergedColumnParallelLinear(hidden, [inter, inter], prefix="m")
    )
    for rank, layer in enumerate(layers):
        layer.weight.weight_loader(layer.weight, up, 1)  # order must not matter
        layer.weight.weight_loader(layer.weight, gate, 0)
        s = slice(rank * 3, rank * 3 + 3)
        torch.testing.assert_close(layer.weight, torch.cat([gate[s], up[s]]))
        # A checkpoint that is already fused loads the same way.
        target = torch.empty_like(layer.weight)
        layer.weight_loader(target, torch.cat([gate, up]))
        torch.testing.assert_close(target, layer.weight)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_qkv_parallel_splits_and_replicates_heads(monkeypatch, world):
    """4 query heads, 2 KV heads: at tp=4 every KV head lives on two ranks."""
    head, heads, kv_heads, hidden = 3, 4, 2, 6
    q = torch.randn(heads * head, hidden)
    k = torch.randn(kv_heads * head, hidden)
    v = torch.randn(kv_heads * head, hidden)
    bias = {s: torch.randn(t.shape[0]) for s, t in zip("qkv", (q, k, v), strict=True)}
    layers = _per_rank(
        monkeypatch,
        world,
        lambda: QKVParallelLinear(hidden, head, heads, kv_heads, bias=True, prefix="attn.qkv"),
    )
    for rank, layer in enumerate(layers):
        for shard_id, tensor in zip("qkv", (q, k, v), strict=True):
            layer.weight.weight_loader(layer.weight, tensor, shard_id)
            layer.bias.weight_loader(layer.bias, bias[shard_id], shard_id)
        q_heads = heads // world
        kv_head_rank = rank // max(1, world // kv_heads)
        kv_per_rank = max(1, kv_heads // world)
        q_rows = slice(rank * q_heads * head, (rank + 1) * q_heads * head)
        kv_rows = slice(kv_head_rank * kv_per_rank * head, (kv_head_rank + 1) * kv_per_rank * head)
        torch.testing.assert_close(layer.weight, torch.cat([q[q_rows], k[kv_rows], v[kv_rows]]))
        torch.testing.assert_close(
            layer.bias, torch.cat([bias["q"][q_rows], bias["k"][kv_rows], bias["v"][kv_rows]])
        )
        assert layer.num_heads == q_heads and layer.num_kv_heads == kv_per_rank


def test_weight_loader_shape_errors_name_parameter_and_shapes():
    layer = QKVParallelLinear(8, 4, 2, 1, prefix="model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ValueError) as err:
        layer.weight.weight_loader(layer.weight, torch.randn(5, 8), "k")
    msg = str(err.value)
    assert "model.layers.0.self_attn.qkv_proj.weight" in msg and "'k'" in msg
    assert "(5, 8)" in msg and "(4, 8)" in msg
    row = RowParallelLinear(8, 6, prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match=r"down_proj\.weight.*\(6, 9\).*\(6, 8\)"):
        row.weight.weight_loader(row.weight, torch.randn(6, 9))
    with pytest.raises(ValueError, match="shard_id must be 'q', 'k' or 'v'"):
        layer.weight.weight_loader(layer.weight, torch.randn(4, 8), "x")


def test_indivisible_sizes_are_rejected(monkeypatch):
    _simulate_tp(monkeypatch, 3, 0)
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible"):
        QKVParallelLinear(8, 2, 4, 4, prefix="attn")
    with pytest.raises(ValueError, match="input_size=8 is not divisible"):
        RowParallelLinear(8, 4, prefix="down")


# ---------------------------------------------------------------- vocab-parallel embedding


def test_vocab_parallel_embedding_pads_and_masks(monkeypatch):
    world, vocab, dim = 3, 10, 4  # 10 rows over 3 ranks: 4 + 4 + 2 real rows, 2 padding
    table = torch.randn(vocab, dim)
    embeds = _per_rank(monkeypatch, world, lambda: VocabParallelEmbedding(vocab, dim, "emb"))
    ids = torch.tensor([0, 3, 4, 7, 8, 9, 9])
    # With the collectives being identities (no process group), each rank's forward
    # returns its masked partial lookup; the sum is what the all-reduce produces.
    total = torch.zeros(len(ids), dim)
    for embed in embeds:
        embed.weight.weight_loader(embed.weight, table)
        assert embed.weight.shape == (4, dim)
        total += embed(ids)
    torch.testing.assert_close(total, table[ids])
    assert torch.equal(embeds[2].weight[2:], torch.zeros(2, dim))


def test_lm_head_shards_concatenate_to_the_vocabulary(monkeypatch):
    world, vocab, dim = 2, 7, 4
    table = torch.randn(vocab, dim)
    heads = _per_rank(monkeypatch, world, lambda: ParallelLMHead(vocab, dim, "lm_head"))
    for head in heads:
        head.weight.weight_loader(head.weight, table)
    hidden = torch.randn(3, dim)
    gathered = torch.cat([F.linear(hidden, h.weight) for h in heads], dim=-1)
    torch.testing.assert_close(gathered[:, :vocab], hidden @ table.T)
    with pytest.raises(ValueError, match=r"lm_head\.weight.*\(8, 4\).*\(7, 4\)"):
        heads[0].weight.weight_loader(heads[0].weight, torch.randn(8, 4))


def test_rope_head_size_must_be_even():
    with pytest.raises(ValueError, match="even head_size"):
        RotaryEmbedding(7, 16, 10000.0)
    assert math.isclose(get_rope(8, 16, {"rope_theta": 100.0}).base, 100.0)
