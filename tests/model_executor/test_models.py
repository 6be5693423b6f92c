"""Llama / Qwen2 / Qwen3 over a paged KV cache agree with Hugging Face transformers.

Each model is loaded with ``get_model`` from a tiny random-weight checkpoint, run on a
prefill of several sequences of different lengths (one flat batch, a shuffled block
table), then one decode step over the cached prefixes; every logit row is compared with
the HF model run on the same full sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from minivllm.attention.layer import Attention
from minivllm.config import ModelConfig
from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.norm_linear import NORM_GEMV_ENV
from minivllm.model_executor.layers.qk_norm_rope import FUSED_QK_NORM_ROPE_ENV
from minivllm.model_executor.layers.utils import GATE_UP_SILU_MAX_M_ENV
from minivllm.model_executor.loader import get_model
from minivllm.model_executor.models.llama import LlamaForCausalLM
from minivllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from minivllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from tests.model_executor.paged_forward import PagedForward
from tests.tiny_models import load_hf_model, make_tiny_model

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that head_dim 16's frequencies fall in all three bands of the scaling.
    "original_max_position_embeddings": 64,
}

CASES = {
    "llama": ("llama", {}, LlamaForCausalLM),
    "qwen2": ("qwen2", {}, Qwen2ForCausalLM),
    "qwen3": ("qwen3", {}, Qwen3ForCausalLM),
    "llama-tied": ("llama", {"tie_word_embeddings": True}, LlamaForCausalLM),
    "llama-rope-llama3": ("llama", {"rope_parameters": LLAMA3_ROPE}, LlamaForCausalLM),
    # head_dim * heads != hidden_size, as in Qwen3-0.6B (1024 hidden, 16 x 128 heads).
    "qwen3-wide-heads": ("qwen3", {"head_dim": 32}, Qwen3ForCausalLM),
}

PROMPTS = [
    [5, 17, 300, 42, 8, 99, 1, 250, 7],
    [11, 400],
    [3, 3, 3, 90, 511, 200, 64, 18, 27, 33, 45, 2, 6, 77],
]
NEXT_TOKENS = [12, 501, 9]


def _load(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    hf_config = transformers.AutoConfig.from_pretrained(path)
    config = ModelConfig(model=str(path), hf_config=hf_config, dtype=dtype, max_model_len=128)
    return get_model(config, torch.device("cpu"))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, overrides, cls = CASES[request.param]
    path = make_tiny_model(arch, tmp_path_factory.mktemp(request.param), **overrides)
    return path, cls


def _hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0]


def test_prefill_then_decode_matches_hf(case):
    path, cls = case
    model = _load(path)
    hf_model = load_hf_model(path)
    assert type(model) is cls
    runner = PagedForward(model, num_seqs=len(PROMPTS))

    logits = runner.step(PROMPTS)
    assert logits.shape == (sum(map(len, PROMPTS)), hf_model.config.vocab_size)
    expected = torch.cat([_hf_logits(hf_model, p) for p in PROMPTS])
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)

    decode_logits = runner.step([[t] for t in NEXT_TOKENS])
    expected = torch.stack(
        [_hf_logits(hf_model, p + [t])[-1] for p, t in zip(PROMPTS, NEXT_TOKENS, strict=True)]
    )
    torch.testing.assert_close(decode_logits, expected, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_matches_one_shot(case):
    """Feeding a prompt in two chunks (second chunk attends to cached K/V) changes nothing."""
    path, _ = case
    model = _load(path)
    prompt = PROMPTS[2]
    whole = PagedForward(model, num_seqs=1, seed=1).step([prompt])
    chunked = PagedForward(model, num_seqs=1, seed=2)
    first = chunked.step([prompt[:5]])
    second = chunked.step([prompt[5:]])
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-5, rtol=1e-5)


def test_tied_embeddings_share_one_tensor(tmp_path):
    path = make_tiny_model("llama", tmp_path, tie_word_embeddings=True)
    model = _load(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    names = {name for name, _ in model.named_parameters()}
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


def test_qwen2_loads_qkv_bias(tmp_path):
    path = make_tiny_model("qwen2", tmp_path)
    model = _load(path)
    hf_model = load_hf_model(path)
    attn = model.model.layers[1].self_attn
    hf_attn = hf_model.model.layers[1].self_attn
    expected = torch.cat([hf_attn.q_proj.bias, hf_attn.k_proj.bias, hf_attn.v_proj.bias])
    torch.testing.assert_close(attn.qkv_proj.bias, expected, atol=0, rtol=0)
    assert attn.o_proj.bias is None


def test_bfloat16_model_close_to_hf(tmp_path):
    """In bfloat16 every parameter is bf16 and logits track HF's bf16 run closely."""
    path = make_tiny_model("qwen3", tmp_path)
    model = _load(path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    logits = PagedForward(model, num_seqs=1).step([PROMPTS[0]])
    expected = _hf_logits(hf_model, PROMPTS[0])
    assert logits.dtype == torch.bfloat16
    # Attention accumulates differently (float32 softmax here); stay within bf16 noise.
    torch.testing.assert_close(logits.float(), expected.float(), atol=0.1, rtol=0.05)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


class _KernelOps(TorchDispatchMode):
    """The operators one decoder layer dispatches that launch a GPU kernel, in order.

    Views and allocations launch none and are left out; the attention layer (its KV-cache
    write and attention kernels belong to the attention backend) is one ``"attention"``.
    """

    NO_KERNEL = {"empty", "empty_like", "empty_strided", "lift_fresh"}

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.counting = self.in_attention = False
        layer.register_forward_pre_hook(lambda *_: setattr(self, "counting", True))
        layer.register_forward_hook(lambda *_: setattr(self, "counting", False))
        attn = next(m for m in layer.modules() if isinstance(m, Attention))
        attn.register_forward_pre_hook(lambda *_: self._enter_attention())
        attn.register_forward_hook(lambda *_: setattr(self, "in_attention", False))

    def _enter_attention(self) -> None:
        if self.counting:
            self.ops.append("attention")
        self.in_attention = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if (self.counting and not self.in_attention and not func.is_view
                and name not in self.NO_KERNEL):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


QK, NORM = FUSED_QK_NORM_ROPE_ENV, NORM_GEMV_ENV
UNFUSED = ["fused_add_rms_norm", "mm"]  # the add + norm, then the cuBLAS projection


@pytest.mark.skipif(torch.cuda.is_available(), reason="forces the kernels onto CPU tensors")
@pytest.mark.parametrize(
    "arch,switches,expected",
    [
        # 5 kernels + attention (the default): add + norm + qkv, q/k norm + RoPE,
        # o_proj, add + norm + gate/up, down with SiLU-and-mul fused in.
        ("qwen3", {}, ["rms_norm_gemv", "qk_norm_rope", "attention", "skinny_gemm",
                       "rms_norm_gemv", "skinny_gemm"]),
        # 7 + attention (MINIVLLM_NORM_GEMV=0): the norms as kernels of their own.
        ("qwen3", {NORM: "0"}, [*UNFUSED, "qk_norm_rope", "attention", "skinny_gemm",
                                *UNFUSED, "skinny_gemm"]),
        # 9 + attention: and the q norm, the k norm and RoPE as three kernels.
        ("qwen3", {NORM: "0", QK: "0"}, [*UNFUSED, "rms_norm", "rms_norm", "rotary_embedding",
                                         "attention", "skinny_gemm", *UNFUSED, "skinny_gemm"]),
        ("llama", {NORM: "1"}, ["rms_norm_gemv", "rotary_embedding", "attention", "skinny_gemm",
                                "rms_norm_gemv", "skinny_gemm"]),
    ],
)
def test_decode_layer_kernel_launches(arch, switches, expected, tmp_path, monkeypatch):
    """A batch-1 decode step runs exactly these kernels per layer: no copy, cast or split."""
    for switch in (QK, NORM):
        monkeypatch.delenv(switch, raising=False)
    for switch, value in switches.items():
        monkeypatch.setenv(switch, value)
    model = _load(make_tiny_model(arch, tmp_path, num_hidden_layers=2))
    runner = PagedForward(model, num_seqs=1)
    mode = _KernelOps(model.model.layers[1])
    with CustomOp.force("cuda"):
        runner.step([PROMPTS[0][:2]])
        mode.ops.clear()  # the prefill ran through the hooks outside the mode
        with mode:
            runner.step([[NEXT_TOKENS[0]]])
    assert mode.ops == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="forces the kernels onto CPU tensors")
@pytest.mark.parametrize(
    "limit,mlp",
    [("256", ["gate_up_silu", "skinny_gemm"]), ("0", ["mm", "silu_and_mul", "skinny_gemm"])],
    ids=["fused", "apart"],
)
def test_decode_layer_kernel_launches_at_three_sequences(limit, mlp, tmp_path, monkeypatch):
    """From three rows on, the norm + GEMV fusion (one or two rows) no longer applies and
    down_proj no longer takes SiLU-and-mul into its loads: gate/up and the activation are
    then one kernel (the default) or two (``MINIVLLM_GATE_UP_SILU_MAX_M=0``)."""
    for switch in (QK, NORM):
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setenv(GATE_UP_SILU_MAX_M_ENV, limit)
    model = _load(make_tiny_model("qwen3", tmp_path, num_hidden_layers=2))
    runner = PagedForward(model, num_seqs=3)
    mode = _KernelOps(model.model.layers[1])
    with CustomOp.force("cuda"):
        runner.step([prompt[:2] for prompt in PROMPTS])
        mode.ops.clear()
        with mode:
            runner.step([[token] for token in NEXT_TOKENS])
    assert mode.ops == [*UNFUSED, "qk_norm_rope", "attention", "skinny_gemm",
                        "fused_add_rms_norm", *mlp]  # fmt: skip
