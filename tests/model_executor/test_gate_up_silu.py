"""The fused gate/up + SiLU-and-mul kernel against ``silu_and_mul(F.linear(x, W))``, and
the MLP's dispatch to it.

On the CPU the kernel runs through ``TRITON_INTERPRET=1`` (set by tests/conftest.py); on a
GPU the same tests run it natively. Shapes are small and deliberately not multiples of
the tiles, so every mask is exercised.

Tolerances: float32 agrees to float32 rounding (only the order of the sums over K
differs), which is the test of the arithmetic. bfloat16 rounds four times on the way
(gate, up, silu, the product) as the unfused layers do, and the Triton interpreter
converts float32 to bfloat16 by truncation where torch rounds to nearest: so within four
bf16 steps of each element, plus one step of the output's magnitude for the order of the
sums near zero.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3Config

from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers import triton_gate_up_silu, utils
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.triton_gate_up_silu import gate_up_silu, launch_gate_up_silu
from minivllm.model_executor.layers.utils import GATE_UP_SILU_MAX_M_ENV, GemvConfig
from minivllm.model_executor.models.llama import LlamaDecoderLayer, LlamaMLP
from minivllm.model_executor.models.qwen3 import Qwen3Attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONFIGS = [
    GemvConfig(block_m=16, block_n=16, block_k=32),
    GemvConfig(block_m=32, block_n=32, block_k=64, num_warps=8, num_stages=2),
    GemvConfig(block_m=16, block_n=64, block_k=16, num_warps=2, num_stages=4),
]


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with the gate/up product in float32 and the layers' roundings."""
    gate_up = F.linear(x.float(), w.float()).to(x.dtype)
    with CustomOp.force("native"):
        return SiluAndMul()(gate_up)


def _assert_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    else:
        step = expected.float().abs().max().item() * 2**-7
        torch.testing.assert_close(out.float(), expected.float(), atol=step, rtol=4 * 2**-7)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"m{c.block_m}n{c.block_n}k{c.block_k}")
@pytest.mark.parametrize("m", [1, 3, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_linear_then_silu_and_mul(config, m, dtype):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 100, generator=gen).to(DEVICE, dtype)  # K = 100: the last step masked
    w = (torch.randn(2 * 37, 100, generator=gen) / 5).to(DEVICE, dtype)  # D = 37
    out = torch.full((m, 37), float("nan"), device=DEVICE, dtype=dtype)
    launch_gate_up_silu(out, x, w, config)
    _assert_close(out, _reference(x, w))


def test_rows_and_columns_are_not_mixed_up():
    """Gate and up come from the right halves of W: swapping them changes the result, so
    the comparison above would catch a kernel that read the halves the wrong way round."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 32, generator=gen).to(DEVICE)
    w = torch.randn(2 * 16, 32, generator=gen).to(DEVICE)
    out = gate_up_silu(x, w)
    _assert_close(out, _reference(x, w))
    assert not torch.allclose(out, _reference(x, torch.cat([w[16:], w[:16]])), atol=1e-3)


def test_gate_up_silu_takes_any_leading_shape_and_checks_its_arguments():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2 * 24, 40, generator=gen).to(DEVICE)
    x = torch.randn(2, 3, 80, generator=gen).to(DEVICE)[..., ::2]  # not unit stride
    out = gate_up_silu(x, w)
    assert out.shape == (2, 3, 24)
    _assert_close(out.view(6, 24), _reference(x.reshape(6, 40), w))
    assert gate_up_silu(x[:0], w).shape == (0, 3, 24)
    with pytest.raises(ValueError, match="x's last dimension is 41"):
        gate_up_silu(torch.zeros(2, 41, device=DEVICE), w)
    with pytest.raises(ValueError, match=r"weight must be \[2 D, K\]"):
        gate_up_silu(x, w[:47])
    with pytest.raises(ValueError, match="split_k=1 and block_m set"):
        launch_gate_up_silu(out.view(6, 24), x.reshape(6, 40), w, GemvConfig(16, 32))


def test_config_table_covers_every_row_count():
    bounds = [bound for bound, _ in utils.GATE_UP_SILU_TABLE]
    assert bounds == sorted(bounds) and bounds[-1] >= utils.DEFAULT_GATE_UP_SILU_MAX_M
    for m in (3, bounds[0], bounds[0] + 1, utils.DEFAULT_GATE_UP_SILU_MAX_M, 256):
        config = utils.gate_up_silu_config(m, 3072, 1024)
        assert config.split_k == 1 and config.block_m >= 16


def _mlp(bias: bool = False) -> LlamaMLP:
    mlp = LlamaMLP(40, 24, "silu", bias=bias).to(DEVICE)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 5)
    return mlp


def test_mlp_fuses_from_three_rows_up_to_the_limit(monkeypatch):
    """At one or two rows down_proj fuses the activation into its loads instead; above
    ``MINIVLLM_GATE_UP_SILU_MAX_M`` (and at 0) the layers run apart; a bias or the torch
    implementation never fuses. Every path gives the same numbers."""
    launched: list[int] = []
    real = triton_gate_up_silu.gate_up_silu

    def counting(x, weight):
        launched.append(x.shape[0])
        return real(x, weight)

    monkeypatch.setattr(triton_gate_up_silu, "gate_up_silu", counting)
    monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, "5")
    mlp = _mlp()
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 6):
            x = torch.randn(rows, 40, generator=gen).to(DEVICE)
            with CustomOp.force("native"):
                expected = mlp(x)
            with CustomOp.force("cuda"):
                assert mlp.fuses_gate_up_act(x) == (3 <= rows <= 5)
                torch.testing.assert_close(mlp(x), expected, atol=1e-5, rtol=1e-5)
        assert launched == [3, 5]
        monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, "0")
        with CustomOp.force("cuda"):
            assert not mlp.fuses_gate_up_act(torch.zeros(4, 40, device=DEVICE))
        monkeypatch.delenv(GATE_UP_SILU_MAX_M_ENV)
        with CustomOp.force("cuda"):
            assert not _mlp(bias=True).fuses_gate_up_act(torch.zeros(4, 40, device=DEVICE))
    monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, "many")
    with pytest.raises(ValueError, match="MINIVLLM_GATE_UP_SILU_MAX_M must be an integer"):
        utils.gate_up_silu_max_m()


def test_decoder_layer_output_is_the_same_fused_or_not(monkeypatch):
    """The layer normalises, then runs the fused MLP, where the unfused path hands the
    norm to ``rms_norm_linear``: both give the same output and residual stream."""
    config = Qwen3Config(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=1, vocab_size=32,
    )  # fmt: skip
    layer = LlamaDecoderLayer(config, Qwen3Attention, prefix="model.layers.0").to(DEVICE)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(4, 64, generator=gen).to(DEVICE)
    residual = torch.randn(4, 64, generator=gen).to(DEVICE)
    attn_out = torch.randn(4, 64, generator=gen).to(DEVICE)
    # Attention itself is not under test (it needs the engine's forward context).
    monkeypatch.setattr(layer.self_attn, "forward_qkv", lambda positions, qkv: attn_out)
    with torch.no_grad():
        for p in layer.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 8)
        results = []
        for limit in ("0", "256"):
            monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, limit)
            with CustomOp.force("cuda"):
                assert layer.mlp.fuses_gate_up_act(hidden) == (limit != "0")
                results.append(layer(torch.arange(4), hidden.clone(), residual.clone()))
    (out_apart, res_apart), (out_fused, res_fused) = results
    torch.testing.assert_close(res_fused, res_apart)
    torch.testing.assert_close(out_fused, out_apart, atol=1e-5, rtol=1e-5)


def test_warm_up_launches_each_reachable_tile_configuration_once(monkeypatch):
    launched: list[int] = []
    real = triton_gate_up_silu.gate_up_silu
    monkeypatch.setattr(
        triton_gate_up_silu, "gate_up_silu", lambda x, w: launched.append(x.shape[0]) or real(x, w)
    )
    table = (
        (16, GemvConfig(block_m=16, block_n=16, block_k=32)),
        (32, GemvConfig(block_m=32, block_n=16, block_k=32)),
        (1 << 30, GemvConfig(block_m=16, block_n=32, block_k=32)),
    )
    monkeypatch.setattr(utils, "GATE_UP_SILU_TABLE", table)
    model = torch.nn.Sequential(_mlp(), _mlp(), LlamaMLP(40, 32, "silu").to(DEVICE))
    monkeypatch.delenv(GATE_UP_SILU_MAX_M_ENV, raising=False)
    limit = utils.DEFAULT_GATE_UP_SILU_MAX_M
    assert limit > 32
    with CustomOp.force("cuda"):
        # Two distinct shapes x three configurations; the last one at the row limit.
        assert utils.warm_up_gate_up_silu(model) == 6
    assert launched == [16, 32, limit] * 2
    launched.clear()
    monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, "20")  # the last configuration is unreachable
    with CustomOp.force("cuda"):
        assert utils.warm_up_gate_up_silu(model) == 4
    assert launched == [16, 20] * 2
    with CustomOp.force("native"):
        assert utils.warm_up_gate_up_silu(model) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_in_a_cuda_graph_reads_the_new_inputs():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(48, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2 * 3072, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    gate_up_silu(x, w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gate_up_silu(x, w)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
        graph.replay()
        _assert_close(out, _reference(x, w))
