"""CUDA graphs for decode steps.

Upstream counterparts: ``vllm/compilation/cuda_graph.py`` (``CUDAGraphWrapper``),
``vllm/v1/cudagraph_dispatcher.py`` (``CudagraphDispatcher``) and, closest in spirit,
Model Runner V2's ``vllm/v1/worker/gpu/cudagraph_utils.py``.

A decode step of a small model is hundreds of tiny kernel launches; on a fast GPU the
CPU cannot launch them as fast as the GPU runs them. A CUDA graph records the launches
once and replays them with one call. A graph replays *fixed* addresses and shapes, so:

* every input lives in a static buffer that the step copies into before the replay;
* a graph is captured per batch size in ``capture_sizes``, and a batch is padded up to
  the next captured size; padded rows write nowhere (slot -1) and attend to one token;
* host-side launch facts baked into the graph must hold for every replay: a decode
  step always has ``max_query_len == 1``, and ``max_seq_len`` is fixed at
  ``max_model_len`` (the kernels read the real lengths from ``seq_lens`` on the GPU).

Prefill and mixed steps run eagerly: their shapes vary too much to capture, and their
launch overhead is small next to their compute. vLLM captures those too (piecewise,
around attention) with torch.compile; minivllm leaves that out.
"""

from __future__ import annotations

import bisect
import logging

import torch
from torch import nn

from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.utils.math_utils import cdiv

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 16 up to ``max_num_seqs``."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class CUDAGraphRunner:
    """Captures ``model(input_ids, positions)`` for decode batches and replays it.

    Args:
        model: The model (its Attention layers already bound to the KV cache).
        max_num_seqs: Largest decode batch.
        max_model_len: Longest sequence; fixes the block-table width and the
            ``max_seq_len`` launch hint.
        block_size: Tokens per KV block.
        hidden_size: Width of the model's output hidden states.
        dtype: Activation dtype.
        device: The CUDA device.
    """

    def __init__(
        self,
        model: nn.Module,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.capture_sizes = default_capture_sizes(max_num_seqs)
        n = self.capture_sizes[-1]
        max_blocks = cdiv(max_model_len, block_size)
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_table = torch.zeros(n, max_blocks, **i32)
        self.seq_lens = torch.ones(n, **i32)
        self.query_start_loc = torch.arange(n + 1, **i32)
        self.output = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def _metadata(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            block_table=self.block_table[:bs],
            seq_lens=self.seq_lens[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )

    def _forward(self, bs: int) -> None:
        with set_forward_context(self._metadata(bs)):
            self.output[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per size, largest first, sharing one memory pool."""
        for bs in reversed(self.capture_sizes):
            self._forward(bs)  # warm-up: compiles kernels, settles allocations
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._forward(bs)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.capture_sizes)

    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a decode batch of ``num_seqs`` runs at, or None."""
        i = bisect.bisect_left(self.capture_sizes, num_seqs)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Replay the graph for a decode batch (one token per sequence)."""
        n = input_ids.shape[0]
        bs = self.padded_size(n)
        assert bs is not None and meta.max_query_len == 1
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].fill_(-1)
        width = meta.block_table.shape[1]
        self.block_table[:n, :width].copy_(meta.block_table, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:bs].fill_(1)
        self.graphs[bs].replay()
        return self.output[:n]
