"""Token embedding and LM head, split across tensor-parallel ranks by vocabulary.

Upstream counterpart: ``vllm/model_executor/layers/vocab_parallel_embedding.py``
(``VocabParallelEmbedding``, ``get_masked_input_and_mask``, ``ParallelLMHead``).

The embedding table is the largest single matrix of a small model (152K x 3584 for
Qwen2-7B) and it is used twice: to look tokens up and, often tied, to score every
vocabulary entry at the end. Each rank keeps a contiguous range of rows. A lookup then
finds a token on exactly one rank: every rank looks up the tokens it owns, writes zeros
for the others, and one all-reduce (a sum) assembles the full embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from minivllm.model_executor.weight_utils import check_shape
from minivllm.utils.math_utils import cdiv


def get_masked_input_and_mask(
    input_ids: torch.Tensor, vocab_start: int, vocab_end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map token ids to row indices of this rank's shard.

    Returns ``(local_ids, outside)``: ids in ``[vocab_start, vocab_end)`` become
    ``id - vocab_start``; others become 0 (a valid row, so the lookup needs no
    branch) and are flagged in ``outside`` so their embedding can be zeroed.
    """
    outside = (input_ids < vocab_start) | (input_ids >= vocab_end)
    local_ids = (input_ids - vocab_start).masked_fill(outside, 0)
    return local_ids, outside


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` whose rows are split into ``tp_size`` contiguous ranges.

    The vocabulary is padded up to a multiple of ``tp_size`` so every rank holds the
    same number of rows (collectives need equal shapes); padding rows are zero and no
    token id ever selects them.

    Args:
        num_embeddings: Vocabulary size.
        embedding_dim: Hidden size.
        prefix: Dotted module name, used in error messages.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings_per_partition = cdiv(num_embeddings, self.tp_size)
        self.num_embeddings_padded = self.num_embeddings_per_partition * self.tp_size
        self.vocab_start_index = min(
            self.tp_rank * self.num_embeddings_per_partition, num_embeddings
        )
        self.vocab_end_index = min(
            self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings
        )
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's rows of the ``[vocab, hidden]`` checkpoint tensor; zero the padding."""
        check_shape(
            f"{self.prefix}.weight",
            (self.num_embeddings, self.embedding_dim),
            loaded_weight.shape,
        )
        rows = self.vocab_end_index - self.vocab_start_index
        with torch.no_grad():
            param[:rows].copy_(loaded_weight[self.vocab_start_index : self.vocab_end_index])
            param[rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` token ids -> ``[T, hidden]`` embeddings (full, on every rank)."""
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local_ids, outside = get_masked_input_and_mask(
            input_ids, self.vocab_start_index, self.vocab_end_index
        )
        embeddings = F.embedding(local_ids, self.weight)
        embeddings.masked_fill_(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(embeddings)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection ``hidden -> vocab``, sharded like the embedding.

    It is only a weight holder: ``LogitsProcessor`` does the matmul, because the logits
    of each rank's vocabulary slice must then be gathered, not summed.
    """

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        """Share the embedding's weight (``tie_word_embeddings``); returns ``self``."""
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Not a lookup table: use ``LogitsProcessor``."""
        raise RuntimeError("ParallelLMHead holds weights only; call LogitsProcessor instead")
