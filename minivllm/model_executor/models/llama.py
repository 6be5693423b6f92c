"""Llama, and the decoder structure Qwen2 and Qwen3 reuse.

Upstream counterpart: ``vllm/model_executor/models/llama.py`` (``LlamaMLP``,
``LlamaAttention``, ``LlamaDecoderLayer``, ``LlamaModel``, ``LlamaForCausalLM``).

Two things differ from a Hugging Face model and explain most of this file:

* The batch is one flat list of tokens (``input_ids [T]``, ``positions [T]``) from many
  sequences, prefill and decode mixed. There is no batch or padding dimension; which
  token belongs to which sequence lives in the attention metadata of the forward
  context, which only ``Attention`` reads.
* Projections that share an input are fused (q/k/v into ``qkv_proj``, gate/up into
  ``gate_up_proj``) and every linear layer is tensor-parallel aware, so the checkpoint's
  tensor names do not match the parameters one to one. ``load_weights`` maps them
  with ``STACKED_PARAMS_MAPPING`` and lets each parameter's ``weight_loader`` copy its
  rank's slice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from minivllm.attention.layer import Attention, KVCacheUpdate
from minivllm.model_executor.custom_op import CustomOp
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from minivllm.model_executor.layers.logits_processor import LogitsProcessor
from minivllm.model_executor.layers.norm_linear import rms_norm_linear
from minivllm.model_executor.layers.rotary_embedding import (
    get_rope,
    rope_parameters_from_config,
)
from minivllm.model_executor.layers.utils import FUSED_ACTIVATION_MAX_M, gate_up_silu_max_m
from minivllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from minivllm.model_executor.weight_utils import default_weight_loader, set_default_torch_dtype

# (fused parameter, checkpoint tensor, shard id): checkpoint q_proj/k_proj/v_proj land in
# qkv_proj at the "q"/"k"/"v" slots, gate_proj/up_proj in gate_up_proj at slots 0/1.
STACKED_PARAMS_MAPPING: list[tuple[str, str, str | int]] = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``, gate and up in one GEMM.

    Args:
        hidden_size: Model width.
        intermediate_size: Width of the gate/up projections (split across ranks).
        hidden_act: Must be ``"silu"``.
        bias: Linear biases (Llama's ``mlp_bias``).
        prefix: Dotted module name.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        bias: bool = False,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"{prefix}: hidden_act {hidden_act!r} is not supported (only 'silu')")
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``."""
        if self.fuses_gate_up_act(x):
            return self.forward_fused(x)
        return self.forward_gate_up(self.gate_up_proj(x))

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` with ``gate_up_proj`` and ``act_fn`` as one kernel; only where
        :meth:`fuses_gate_up_act` holds for ``x`` (the decoder layer asks it once)."""
        from minivllm.model_executor.layers import triton_gate_up_silu  # Triton is optional

        return self.down_proj(triton_gate_up_silu.gate_up_silu(x, self.gate_up_proj.weight))

    def fuses_gate_up_act(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` runs ``gate_up_proj`` and ``act_fn`` as one kernel on ``x``
        (``triton_gate_up_silu.py``): on CUDA, without a bias, for more rows than
        ``down_proj`` fuses the activation into (``FUSED_ACTIVATION_MAX_M``) and at most
        ``MINIVLLM_GATE_UP_SILU_MAX_M``."""
        return (
            CustomOp.selected_impl(x.device) == "cuda"
            and self.gate_up_proj.bias is None
            and FUSED_ACTIVATION_MAX_M < x.shape[0] <= gate_up_silu_max_m()
            and x.dtype == self.gate_up_proj.weight.dtype
        )

    def forward_gate_up(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The rest of ``forward`` from ``gate_up_proj``'s output ``[T, 2 * intermediate]``
        (the decoder layer runs ``gate_up_proj`` itself, fused with its norm)."""
        # down_proj applies act_fn itself: at one or two rows its small-M kernel fuses it
        # into its loads.
        return self.down_proj(gate_up, act=self.act_fn)


class LlamaAttention(nn.Module):
    """Self-attention: fused QKV projection, RoPE, paged attention, output projection.

    Subclasses adapt it to a model family through two hooks: ``projection_biases``
    (which projections carry a bias) and ``qk_norm_rope`` (what happens to q and k
    between the projection and attention: RoPE, after a per-head norm in Qwen3).

    Args:
        config: The Hugging Face config.
        prefix: Dotted module name (``model.layers.N.self_attn``).
    """

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden_size = config.hidden_size
        total_num_heads = config.num_attention_heads
        total_num_kv_heads = getattr(config, "num_key_value_heads", None) or total_num_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // total_num_heads
        qkv_bias, o_bias = self.projection_biases(config)
        self.qkv_proj = QKVParallelLinear(
            hidden_size,
            self.head_dim,
            total_num_heads,
            total_num_kv_heads,
            bias=qkv_bias,
            prefix=f"{prefix}.qkv_proj",
        )
        # Heads held by this rank (KV heads replicated when fewer than ranks).
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            total_num_heads * self.head_dim, hidden_size, bias=o_bias, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            self.head_dim, config.max_position_embeddings, rope_parameters_from_config(config)
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            prefix=f"{prefix}.attn",
        )

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        """``(bias on q/k/v, bias on o_proj)``: Llama's ``attention_bias`` covers both."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    def qk_norm_rope(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, KVCacheUpdate | None]:
        """Prepare q and k for attention: Llama and Qwen2 only rotate them (RoPE; on CUDA
        one kernel, in place on the column slices of qkv). The third result is the cache
        update this step already did (``Attention.forward``'s ``kv_cache_updated``):
        None here, attention writes k and v itself; Qwen3's fused kernel does it."""
        q, k = self.rotary_emb(positions, q, k)
        return q, k, None

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]`` for the flat batch at ``positions`` ``[T]``."""
        return self.forward_qkv(positions, self.qkv_proj(hidden_states))

    def forward_qkv(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """The rest of ``forward`` from ``qkv_proj``'s output ``[T, (H + 2 KVH) * D]`` (the
        decoder layer runs ``qkv_proj`` itself, fused with its norm)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, kv_cache_updated = self.qk_norm_rope(positions, q, k, v)
        return self.o_proj(self.attn(q, k, v, kv_cache_updated))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    The residual stream travels beside the hidden states as a separate tensor so that
    each residual add happens inside the following ``RMSNorm`` call (fused add + norm),
    and each norm is handed together with the projection after it to
    ``rms_norm_linear``: at one or two tokens on a GPU, add, norm and projection are one
    kernel; elsewhere it is the norm call, then the projection. From three tokens up to
    ``MINIVLLM_GATE_UP_SILU_MAX_M`` on a GPU, the MLP's first projection instead takes the
    activation into its kernel (``LlamaMLP.fuses_gate_up_act``), after the norm alone.

    Args:
        config: The Hugging Face config.
        attention_cls: ``LlamaAttention`` or a model family's subclass of it.
        prefix: Dotted module name (``model.layers.N``).
    """

    def __init__(self, config: Any, attention_cls: type[LlamaAttention], prefix: str = "") -> None:
        super().__init__()
        self.self_attn = attention_cls(config, prefix=f"{prefix}.self_attn")
        self.mlp = LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            getattr(config, "hidden_act", "silu"),
            bias=bool(getattr(config, "mlp_bias", False)),
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(sublayer output, residual stream)``; their sum is the layer output."""
        # First layer: residual is None, and the embeddings become the residual stream.
        qkv, residual = rms_norm_linear(
            self.input_layernorm, self.self_attn.qkv_proj, hidden_states, residual
        )
        hidden_states = self.self_attn.forward_qkv(positions, qkv)
        if self.mlp.fuses_gate_up_act(hidden_states):
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            return self.mlp.forward_fused(hidden_states), residual
        gate_up, residual = rms_norm_linear(
            self.post_attention_layernorm, self.mlp.gate_up_proj, hidden_states, residual
        )
        return self.mlp.forward_gate_up(gate_up), residual


class LlamaModel(nn.Module):
    """Embedding, the decoder layers, and the final norm.

    Args:
        config: The Hugging Face config.
        attention_cls: Attention class for every layer.
        prefix: Dotted module name (``model``, matching checkpoint names).
    """

    def __init__(
        self, config: Any, attention_cls: type[LlamaAttention], prefix: str = "model"
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=f"{prefix}.embed_tokens"
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, attention_cls, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``input_ids [T]``, ``positions [T]`` -> final hidden states ``[T, hidden]``."""
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """A causal LM in minivllm's model interface.

    ``forward(input_ids, positions)`` returns hidden states for every token;
    ``compute_logits`` turns selected rows into vocabulary logits; ``load_weights``
    consumes ``(name, tensor)`` pairs from a Hugging Face checkpoint.

    Args:
        config: The Hugging Face config (``transformers.PretrainedConfig``).
        dtype: Parameter dtype; default: ``torch.get_default_dtype()``.
    """

    attention_cls: type[LlamaAttention] = LlamaAttention
    stacked_params_mapping = STACKED_PARAMS_MAPPING

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types) or getattr(
            config, "use_sliding_window", False
        ):
            raise ValueError(
                f"{type(self).__name__}: sliding-window attention is not supported "
                f"(layer_types={layer_types})"
            )
        self.config = config
        with set_default_torch_dtype(dtype):
            self.model = LlamaModel(config, self.attention_cls, prefix="model")
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix="lm_head")
            if getattr(config, "tie_word_embeddings", False):
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``input_ids [T]`` int64, ``positions [T]`` int64 -> ``[T, hidden]``."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> ``[N, vocab_size]`` (model dtype, full vocabulary on every rank)."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters; return the parameters completed.

        A fused parameter counts as loaded only once every one of its shards arrived.

        Raises:
            ValueError: a tensor matches no parameter, or has the wrong shape.
        """
        params = dict(self.named_parameters())
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        loaded: set[str] = set()
        shards_seen: dict[str, set[str | int]] = defaultdict(set)
        for name, tensor in weights:
            # RoPE buffers that some checkpoints carry are recomputed from the config;
            # a tied head has no parameter of its own.
            if "rotary_emb." in name or (tied and name.startswith("lm_head.")):
                continue
            for fused_name, shard_name, shard_id in self.stacked_params_mapping:
                if shard_name in name:
                    target = name.replace(shard_name, fused_name)
                    _load_into(params, target, name, tensor, shard_id)
                    shards_seen[target].add(shard_id)
                    break
            else:
                _load_into(params, name, name, tensor, None)
                loaded.add(name)
        for target, seen in shards_seen.items():
            if seen == self._expected_shards(target):
                loaded.add(target)
        return loaded

    def _expected_shards(self, fused_param: str) -> set[str | int]:
        return {
            shard_id
            for fused_name, _, shard_id in self.stacked_params_mapping
            if fused_name in fused_param
        }


def _load_into(
    params: dict[str, nn.Parameter],
    param_name: str,
    ckpt_name: str,
    tensor: torch.Tensor,
    shard_id: str | int | None,
) -> None:
    """Hand one checkpoint tensor to its parameter's ``weight_loader``."""
    param = params.get(param_name)
    if param is None:
        raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no model parameter")
    weight_loader = getattr(param, "weight_loader", default_weight_loader)
    try:
        if shard_id is None:
            weight_loader(param, tensor)
        else:
            weight_loader(param, tensor, shard_id)
    except ValueError as exc:
        raise ValueError(f"checkpoint tensor {ckpt_name!r}: {exc}") from exc
