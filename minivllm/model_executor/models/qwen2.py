"""Qwen2: the Llama structure with a bias on the q, k and v projections.

Upstream counterpart: ``vllm/model_executor/models/qwen2.py`` (``Qwen2Attention``,
``Qwen2Model``, ``Qwen2ForCausalLM``). Upstream keeps a full copy of the decoder; here
the only difference from Llama, which projections have a bias, is one overridden hook.
"""

from __future__ import annotations

from typing import Any

from minivllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    """Llama attention with biased q/k/v projections and an unbiased ``o_proj``."""

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        """Qwen2 always has q/k/v biases and never an o_proj bias (not in its config)."""
        return True, False


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5 causal LM."""

    attention_cls = Qwen2Attention
