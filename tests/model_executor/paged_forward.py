"""Run a minivllm model over a paged KV cache in tests, without the model runner.

A small stand-in for the parts of ``ModelRunner`` a model test needs: allocate one K and
one V cache per attention layer, bind them, and build the ``AttentionMetadata`` of a
step from per-sequence token lists. The block table is a random permutation of the
blocks, so a model that only worked with contiguous blocks would fail.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.layer import Attention
from minivllm.attention.selector import get_attn_backend
from minivllm.forward_context import AttentionMetadata, set_forward_context


class PagedForward:
    """Owns the caches and block tables of a few sequences for one model.

    Args:
        model: A minivllm causal LM (``forward``, ``compute_logits``).
        num_seqs: Sequences that will be run.
        block_size: Tokens per KV block.
        blocks_per_seq: Blocks reserved per sequence.
        seed: Seed of the block permutation.
    """

    def __init__(
        self,
        model: nn.Module,
        num_seqs: int,
        block_size: int = 4,
        blocks_per_seq: int = 8,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        num_blocks = num_seqs * blocks_per_seq
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_blocks, generator=gen)
        self.block_table = perm.view(num_seqs, blocks_per_seq).to(torch.int32)
        backend = get_attn_backend("torch", torch.device("cpu"))
        dtype = next(model.parameters()).dtype
        for layer in model.modules():
            if isinstance(layer, Attention):
                shape = (num_blocks, block_size, layer.num_kv_heads, layer.head_size)
                layer.kv_cache = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                layer.backend = backend
        self.num_computed = [0] * num_seqs

    def step(self, new_tokens: list[list[int]]) -> torch.Tensor:
        """Feed ``new_tokens[i]`` to sequence ``i`` after its cached prefix.

        Returns the logits of every new token, ``[sum(len), vocab]``, in batch order.
        """
        ids, positions, slots, seq_lens, starts = [], [], [], [], [0]
        for i, tokens in enumerate(new_tokens):
            start = self.num_computed[i]
            for j, token in enumerate(tokens):
                pos = start + j
                block = int(self.block_table[i, pos // self.block_size])
                ids.append(token)
                positions.append(pos)
                slots.append(block * self.block_size + pos % self.block_size)
            self.num_computed[i] = start + len(tokens)
            seq_lens.append(self.num_computed[i])
            starts.append(starts[-1] + len(tokens))
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_table=self.block_table,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            max_query_len=max(len(t) for t in new_tokens),
            max_seq_len=max(seq_lens),
        )
        with torch.no_grad(), set_forward_context(metadata):
            hidden = self.model(
                torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64)
            )
            return self.model.compute_logits(hidden)
