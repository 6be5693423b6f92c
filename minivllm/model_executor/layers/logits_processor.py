"""Hidden states -> logits over the full vocabulary.

Upstream counterpart: ``vllm/model_executor/layers/logits_processor.py``
(``LogitsProcessor``). The model runner calls this only for the tokens that are sampled
(the last token of each sequence), not for every prompt token: the vocabulary GEMM is
the most expensive matmul of a small model, and prompt logits are thrown away.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.communication_op import tensor_model_parallel_all_gather
from minivllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


class LogitsProcessor(nn.Module):
    """Project with the LM head, gather the vocabulary slices, drop the padding.

    Args:
        vocab_size: Real vocabulary size (the head may be padded beyond it).
    """

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> ``[N, vocab_size]`` in the model dtype, on every rank."""
        local_logits = F.linear(hidden_states, lm_head.weight)
        # Ranks own contiguous vocabulary ranges in rank order, so concatenating the
        # slices yields the padded vocabulary in order; padding is only at the end.
        logits = tensor_model_parallel_all_gather(local_logits, dim=-1)
        return logits[..., : self.vocab_size]
