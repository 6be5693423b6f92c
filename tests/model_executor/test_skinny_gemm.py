"""The small-M GEMM kernel against ``F.linear``, and the linear layers' dispatch to it.

On the CPU the kernel runs through ``TRITON_INTERPRET=1`` (set by tests/conftest.py); on a
GPU the same tests run it natively, where the split-K programs really race. Shapes are
small and deliberately not multiples of the tiles, so every mask is exercised.

Tolerances: float32 agrees to float32 rounding (only the order of the sums differs);
bfloat16 within two bf16 steps of the output's magnitude, because the Triton interpreter
converts float32 to bfloat16 by truncation where torch rounds to nearest.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.model_executor.custom_op import NATIVE_OPS_ENV, CustomOp
from minivllm.model_executor.layers import triton_skinny_gemm, utils
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.triton_skinny_gemm import launch_skinny_gemm, skinny_gemm
from minivllm.model_executor.layers.utils import (
    GEMV_MAX_M_ENV,
    GemvConfig,
    default_config,
    gemv_max_m,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONFIGS = [
    GemvConfig(block_n=16, block_k=32, split_k=1),
    GemvConfig(block_n=16, block_k=32, split_k=3),  # K = 100 split into 3 x 64: last masked
    GemvConfig(block_n=8, block_k=64, split_k=2, use_dot=False),
    GemvConfig(block_n=4, block_k=16, split_k=1, use_dot=False, num_warps=2),
    # Prefetch and programmatic dependent launch are PTX: exercised on a GPU only (the
    # interpreter runs these as the plain configurations).
    GemvConfig(block_n=16, block_k=32, split_k=3, prefetch=True, pdl=True),
    GemvConfig(block_n=4, block_k=64, split_k=1, use_dot=False, prefetch=True),
]


def _assert_matches_linear(out, x, w, bias):
    expected = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    else:
        step = 2 * expected.abs().max().item() * 2**-7
        torch.testing.assert_close(out.float(), expected, atol=step, rtol=0)


@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=lambda c: f"n{c.block_n}k{c.block_k}s{c.split_k}{'dot' if c.use_dot else 'fma'}",
)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_kernel_matches_linear_every_config(config, m):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 100, generator=gen).to(DEVICE)
    w = torch.randn(37, 100, generator=gen).to(DEVICE)
    bias = torch.randn(37, generator=gen).to(DEVICE)
    out = torch.full((m, 37), float("nan"), device=DEVICE)
    launch_skinny_gemm(out, x, w, bias, config)
    _assert_matches_linear(out, x, w, bias)


@pytest.mark.parametrize(
    "config",
    [
        GemvConfig(block_n=16, block_k=32),  # the default: row blocks of 16
        GemvConfig(block_n=16, block_k=32, split_k=3, block_m=32),
        GemvConfig(block_n=8, block_k=64, split_k=2, use_dot=False, block_m=16),
    ],
    ids=["rows16", "rows32-split3", "fma-rows16-split2"],
)
def test_rows_beyond_one_block_are_all_computed(config):
    """More rows than one program holds (MINIVLLM_GEMV_MAX_M above 16): the grid's third
    axis covers them in row blocks, each with its own split-K counters."""
    gen = torch.Generator().manual_seed(40)
    x = torch.randn(40, 100, generator=gen).to(DEVICE)
    w = torch.randn(37, 100, generator=gen).to(DEVICE)
    out = torch.full((40, 37), float("nan"), device=DEVICE)
    launch_skinny_gemm(out, x, w, None, config)
    _assert_matches_linear(out, x, w, None)
    if config.split_k > 1:
        _, counters = triton_skinny_gemm._workspaces[x.device]
        assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_split_k_is_deterministic_and_resets_its_counters(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 96, generator=gen).to(DEVICE, dtype)
    w = torch.randn(48, 96, generator=gen).to(DEVICE, dtype)
    config = GemvConfig(block_n=16, block_k=16, split_k=4)
    first = torch.empty(2, 48, dtype=dtype, device=DEVICE)
    second = torch.empty_like(first)
    launch_skinny_gemm(first, x, w, None, config)
    launch_skinny_gemm(second, x, w, None, config)
    _assert_matches_linear(first, x, w, None)
    # The last program of each tile sums the partials in a fixed order.
    assert torch.equal(first, second)
    _, counters = triton_skinny_gemm._workspaces[x.device]
    assert int(counters.abs().sum()) == 0  # every tile's counter is back to zero


def test_skinny_gemm_takes_any_leading_shape_and_strided_rows():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(24, 40, generator=gen).to(DEVICE)
    x = torch.randn(2, 3, 80, generator=gen).to(DEVICE)[..., ::2]  # not unit stride
    out = skinny_gemm(x, w)
    assert out.shape == (2, 3, 24)
    _assert_matches_linear(out, x, w, None)
    assert skinny_gemm(x[:0], w).shape == (0, 3, 24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_kernel_equals_silu_and_mul_then_linear(dtype):
    """SiLU-and-mul fused into the loads rounds exactly where SiluAndMul does."""
    gen = torch.Generator().manual_seed(4)
    gate_up = torch.randn(3, 1, 160, generator=gen).to(DEVICE, dtype)  # [gate | up]
    w = (torch.randn(24, 80, generator=gen) / 9).to(DEVICE, dtype)
    with CustomOp.force("native"):
        activated = SiluAndMul()(gate_up)
    out = skinny_gemm(gate_up, w, gated=True)
    assert out.shape == (3, 1, 24)
    _assert_matches_linear(out.view(3, 24), activated.view(3, 80), w, None)
    with pytest.raises(ValueError, match="weight expects 160"):
        skinny_gemm(gate_up[..., :80], w, gated=True)


def test_down_proj_fuses_the_activation_only_into_the_kernel(monkeypatch):
    """RowParallelLinear(x, act=SiluAndMul()) equals the unfused layer; at one or two rows
    the kernel gets [gate | up] itself (fused), from three up to the kernel's row limit it
    gets SiluAndMul's output (the fused tensor-core tiling was slower than both), and at
    more rows cuBLAS does."""
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    calls = _count_kernel_calls(monkeypatch)
    gated: list[bool] = []
    counting = triton_skinny_gemm.skinny_gemm

    def recording(x, weight, bias=None, gated_arg=False):
        gated.append(gated_arg)
        return counting(x, weight, bias, gated_arg)

    monkeypatch.setattr(triton_skinny_gemm, "skinny_gemm", recording)
    down = RowParallelLinear(40, 24, bias=True).to(DEVICE)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        down.weight.copy_(torch.randn(24, 40, generator=gen) / 6)
        down.bias.copy_(torch.randn(24, generator=gen))
    act = SiluAndMul()
    fused_max = utils.FUSED_ACTIVATION_MAX_M
    for rows in (1, fused_max, fused_max + 1, utils.DEFAULT_GEMV_MAX_M,
                 utils.DEFAULT_GEMV_MAX_M + 1):  # fmt: skip
        gate_up = torch.randn(rows, 80, generator=gen).to(DEVICE)
        with CustomOp.force("native"):
            expected = down(act(gate_up))
            assert torch.equal(down(gate_up, act=act), expected)
        with CustomOp.force("cuda"):
            fused = down(gate_up, act=act)
        torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
    assert calls == [1, fused_max, fused_max + 1, utils.DEFAULT_GEMV_MAX_M]
    assert gated == [True, True, False, False]


def test_skinny_gemm_refuses_mismatched_shapes():
    w = torch.randn(24, 40, device=DEVICE)
    with pytest.raises(ValueError, match="x's last dimension is 32, weight expects 40"):
        skinny_gemm(torch.randn(1, 32, device=DEVICE), w)
    with pytest.raises(ValueError, match="unit stride along K"):
        skinny_gemm(torch.randn(1, 24, device=DEVICE), w.t())


def test_default_config_follows_the_sweep():
    # One or two rows of a narrow layer: CUDA cores, 4 features x all of K per program.
    assert default_config(1, 1024, 3072) == GemvConfig(4, 1024, 1, 4, 2, use_dot=False)
    # More rows: tensor cores; narrow layers split K four ways, wide ones do not.
    assert default_config(8, 1024, 3072).split_k == 4
    assert default_config(1, 6144, 1024) == GemvConfig(16, 128, 1, 2, 4, use_dot=True)
    assert default_config(4, 1024, 256).split_k == 1  # too little K to share
    assert default_config(1, 4096, 1024, pdl=True).pdl


def test_pdl_needs_the_switch_and_a_gpu(monkeypatch):
    monkeypatch.setattr(utils, "_PDL_ENV", "1")
    assert not utils.pdl_enabled(torch.device("cpu"))
    monkeypatch.setattr(utils, "_PDL_ENV", "0")
    assert not utils.pdl_enabled(torch.device("cuda", 0))


# ---------------------------------------------------------------------------- dispatch


def test_row_limit_reads_the_environment(monkeypatch):
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    assert gemv_max_m() == utils.DEFAULT_GEMV_MAX_M
    monkeypatch.setenv(GEMV_MAX_M_ENV, "0")
    assert gemv_max_m() == 0
    monkeypatch.setenv(GEMV_MAX_M_ENV, "many")
    with pytest.raises(ValueError, match="MINIVLLM_GEMV_MAX_M must be an integer >= 0"):
        gemv_max_m()


def _count_kernel_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = triton_skinny_gemm.skinny_gemm

    def counting(x, weight, bias=None, gated=False):
        calls.append(x.numel() // x.shape[-1])
        return real(x, weight, bias, gated)

    monkeypatch.setattr(triton_skinny_gemm, "skinny_gemm", counting)
    return calls


@pytest.mark.parametrize("layer_cls", [ColumnParallelLinear, RowParallelLinear])
def test_small_batches_take_the_kernel_large_ones_cublas(monkeypatch, layer_cls):
    """Under the "cuda" implementation a layer sends at most MINIVLLM_GEMV_MAX_M rows to
    the kernel (with its bias, for the column-parallel layer) and more to F.linear; the
    results agree either way."""
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    monkeypatch.delenv(NATIVE_OPS_ENV, raising=False)
    calls = _count_kernel_calls(monkeypatch)
    layer = layer_cls(48, 40, bias=True).to(DEVICE)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(40, 48, generator=gen))
        layer.bias.copy_(torch.randn(40, generator=gen))
    small = torch.randn(2, 48, generator=gen).to(DEVICE)
    large = torch.randn(utils.DEFAULT_GEMV_MAX_M + 1, 48, generator=gen).to(DEVICE)
    with CustomOp.force("cuda"):
        out_small, out_large = layer(small), layer(large)
    assert calls == [2]
    assert layer._forward_method == layer.forward_cuda
    _assert_matches_linear(out_small, small, layer.weight, layer.bias)
    _assert_matches_linear(out_large, large, layer.weight, layer.bias)
    with CustomOp.force("native"):
        layer(small)
    assert calls == [2]  # the torch definition never launches it


def test_layers_that_widen_stay_on_cublas_unless_pdl(monkeypatch):
    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    calls = _count_kernel_calls(monkeypatch)
    wide = ColumnParallelLinear(16, 48).to(DEVICE)
    torch.nn.init.normal_(wide.weight)
    with CustomOp.force("cuda"):
        wide(torch.randn(1, 16, device=DEVICE))
        assert calls == [] and wide.gemv_max_m == 0
        monkeypatch.setattr(utils, "pdl_enabled", lambda device: True)
        CustomOp._set_forced("cuda")  # re-bind, as a new process would
        wide(torch.randn(1, 16, device=DEVICE))
    assert calls == [1]


def test_env_switch_keeps_every_layer_on_linear(monkeypatch):
    monkeypatch.setenv(GEMV_MAX_M_ENV, "0")
    calls = _count_kernel_calls(monkeypatch)
    layer = ColumnParallelLinear(16, 16).to(DEVICE)
    torch.nn.init.normal_(layer.weight)
    with CustomOp.force("cuda"):
        layer(torch.randn(1, 16, device=DEVICE))
    assert calls == [] and layer.gemv_max_m == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pdl_chain_reads_what_the_norm_just_wrote(monkeypatch):
    """RMSNorm (which lets its dependents launch early) then the GEMV under programmatic
    dependent launch, captured in a CUDA graph and replayed on new inputs: the GEMV must
    read the norm's output of *this* replay, never the previous one."""
    from minivllm.model_executor.layers.triton_layernorm import rms_norm

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    monkeypatch.setattr(utils, "_PDL_ENV", "1")
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    norm_w = torch.rand(1024, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
    weight = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    skinny_gemm(rms_norm(x, norm_w, 1e-6), weight)  # compile and allocate outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_gemm(rms_norm(x, norm_w, 1e-6), weight)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
        graph.replay()
        _assert_matches_linear(out, rms_norm(x, norm_w, 1e-6), weight, None)


def test_warm_up_launches_each_layer_shape_at_one_two_and_three_rows(monkeypatch):
    from torch import nn

    monkeypatch.delenv(GEMV_MAX_M_ENV, raising=False)
    calls = _count_kernel_calls(monkeypatch)
    model = nn.Sequential(
        ColumnParallelLinear(32, 16),
        RowParallelLinear(48, 16),
        ColumnParallelLinear(32, 16),  # a repeated shape
        ColumnParallelLinear(16, 32),  # widens: stays on cuBLAS
    ).to(DEVICE)
    for layer in model:
        torch.nn.init.normal_(layer.weight)
    with CustomOp.force("cuda"):
        # The row-parallel one gated too, at the rows that fuse the activation.
        assert utils.warm_up_small_m_kernels(model) == 8
    assert calls == [1, 2, 3] * 2 + [1, 2]
    monkeypatch.setenv(GEMV_MAX_M_ENV, "2")
    with CustomOp.force("cuda"):
        assert utils.warm_up_small_m_kernels(model) == 6
    with CustomOp.force("native"):
        assert utils.warm_up_small_m_kernels(model) == 0
