"""CUDA graphs for decode steps, speculative verification steps and short prefill /
mixed steps.

Upstream counterparts: ``vllm/compilation/cuda_graph.py`` (``CUDAGraphWrapper``),
``vllm/v1/cudagraph_dispatcher.py`` (``CudagraphDispatcher``) and, closest in spirit,
Model Runner V2's ``vllm/v1/worker/gpu/cudagraph_utils.py``.

A decode step of a small model is hundreds of tiny kernel launches; on a fast GPU the
CPU cannot launch them as fast as the GPU runs them. A CUDA graph records the launches
once and replays them with one call. A graph replays *fixed* addresses and shapes, so:

* every input lives in a static buffer that the step copies into before the replay;
* a graph is captured per size, and a batch is padded up to the next captured size;
  padded tokens write nowhere (slot -1);
* host-side launch facts baked into the graph must hold for every replay.

Three families of graphs follow from the last rule:

* **decode** graphs, one per batch size in ``capture_sizes``: every sequence has one
  query token (``max_query_len == 1``) and ``max_seq_len`` is fixed at
  ``max_model_len``; padded rows attend to one token.
* **verify** graphs (speculative decoding only), one per batch size in
  ``capture_sizes``: captured with ``1 + k`` query tokens per sequence, the uniform
  batch of a step where every request verifies ``k`` drafts (upstream's
  ``uniform_decode_query_len``). Any batch of short queries (decode tiles) fits one:
  requests with fewer drafts, none, or a short prefill chunk. A replay pads the
  sequences with empty ones, as the prefill graphs do.
* **prefill** graphs, one per token count in ``prefill_capture_sizes`` (powers of two,
  then every 1,024 tokens, up to the step's token budget): every other batch. They are
  captured with the attention kernel's prefill tiles, which compute any query length
  correctly, so a short query rides them too: a prompt of a few tokens, or the few
  tokens left of a prompt the prefix cache holds. The kernel's grid is an upper bound
  computed from the token count and the sequence count, so the graph is captured with
  the most sequences such a batch can hold (one token each, at most ``max_num_seqs``)
  and a replay pads the rest with empty sequences (no query tokens, no context), whose
  programs return at once. A mixed step's decodes ride the prefill tiles too (an eager
  step gives them a launch of their own, ``DecodeSplit``).

Launched eagerly, a forward pass is about 350 kernel launches whose host cost (tens of
milliseconds in Python) dwarfs the GPU time of a short prefill, and matches that of a
full 16,384-token step: on a slowed host those steps waited on the host. With graphs up
to the budget no step launches its kernels one by one. vLLM captures prefill too, but
piecewise (attention outside the graph) through torch.compile; our attention kernel
reads every length from the device, so the whole forward pass fits one graph.
"""

from __future__ import annotations

import bisect
import logging

import torch
from torch import nn

from minivllm.attention.triton_launch_config import PREFILL_MIN_QUERY_LEN
from minivllm.forward_context import AttentionMetadata, set_forward_context
from minivllm.utils.math_utils import cdiv

logger = logging.getLogger(__name__)

DECODE, VERIFY, PREFILL = "decode", "verify", "prefill"
"""The graph families; a graph's key is ``(family, size)``: sequences for decode and
verify graphs, tokens for prefill graphs."""

GraphKey = tuple[str, int]


def release_cached_blocks() -> None:
    """Give the device back the memory torch's allocator caches but no tensor uses.

    ``torch.cuda.graph`` does this as each capture begins; ``capture`` does it before
    the first too, so that its measurement counts the graphs' pool alone, and after the
    last, for the last warm-up's blocks (upstream's ``capture_model`` empties the cache
    before and after as well). The graphs' pool itself stays: the memory profile counts
    it (``ModelRunner.profile_cudagraph_memory``).
    """
    torch.cuda.empty_cache()


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 16 up to ``max_num_seqs``."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


# Prefill graphs go up to the step's token budget. An eager prefill's launches cost tens
# of milliseconds of host time (Python and driver calls): more than the GPU time of any
# step below some ten thousand tokens, and about as long as a full 16,384-token step
# runs, so a slowed host made those steps host-bound (docs/benchmarks/perf12, the
# Benchmarks chapter's fourteenth round). Powers of two up to PREFILL_CAPTURE_STEP, then a
# graph every step of at least PREFILL_CAPTURE_STEP tokens: a step is padded up to the next
# graph, and doubling would pad a 9,000-token step to 16,384, more GPU time than its
# launches cost. The step grows with the budget so that no more than
# MAX_PREFILL_STEP_GRAPHS graphs lie above it.
PREFILL_CAPTURE_STEP = 1024
MAX_PREFILL_STEP_GRAPHS = 16


def default_prefill_capture_sizes(max_num_batched_tokens: int) -> list[int]:
    """Token counts to capture prefill graphs for: powers of two from the shortest query
    that selects prefill tiles, then multiples of a step (``PREFILL_CAPTURE_STEP``, or a
    multiple of it for budgets above ``MAX_PREFILL_STEP_GRAPHS`` of them), and the step's
    token budget itself, so that every step has a graph."""
    budget = max_num_batched_tokens
    if budget < PREFILL_MIN_QUERY_LEN:
        return []
    step = PREFILL_CAPTURE_STEP * cdiv(budget, MAX_PREFILL_STEP_GRAPHS * PREFILL_CAPTURE_STEP)
    sizes, t = [], PREFILL_MIN_QUERY_LEN
    while t <= min(budget, step):
        sizes.append(t)
        t *= 2
    sizes += range(2 * step, budget + 1, step)
    if sizes[-1] != budget:
        sizes.append(budget)
    return sizes


class CUDAGraphRunner:
    """Captures ``model(input_ids, positions)`` for decode and short prefill batches and
    replays it.

    Args:
        model: The model (its Attention layers already bound to the KV cache).
        max_num_seqs: Largest batch (in sequences).
        max_num_batched_tokens: The step's token budget; bounds the prefill graphs.
        max_model_len: Longest sequence; fixes the block-table width and the
            ``max_seq_len`` launch hint.
        block_size: Tokens per KV block.
        hidden_size: Width of the model's output hidden states.
        dtype: Activation dtype.
        device: The CUDA device.
        num_speculative_tokens: ``k`` of speculative decoding; above 0, verify graphs
            of ``1 + k`` query tokens per sequence are captured too (unless ``1 + k``
            already picks the prefill tiles, whose graphs then serve those steps).
    """

    def __init__(
        self,
        model: nn.Module,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_speculative_tokens: int = 0,
    ) -> None:
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.capture_sizes = default_capture_sizes(max_num_seqs)
        self.prefill_capture_sizes = default_prefill_capture_sizes(max_num_batched_tokens)
        # Query tokens per sequence of a verify graph; 0: no verify graphs.
        q = 1 + num_speculative_tokens
        self.verify_query_len = q if 1 < q < PREFILL_MIN_QUERY_LEN else 0
        self.verify_capture_sizes = self.capture_sizes if self.verify_query_len else []
        n = max(
            [
                self.capture_sizes[-1],
                *self.prefill_capture_sizes,
                *(bs * self.verify_query_len for bs in self.verify_capture_sizes),
            ]
        )
        max_blocks = cdiv(max_model_len, block_size)
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_table = torch.zeros(n, max_blocks, **i32)
        self.seq_lens = torch.ones(n, **i32)
        self.query_start_loc = torch.arange(n + 1, **i32)
        # Decode graphs read query_start_loc as 0, 1, 2, ...; a prefill replay overwrites
        # it, and the next decode replay restores it from here.
        self._arange = torch.arange(n + 1, **i32)
        self._query_start_loc_is_arange = True
        # A decode graph's launch order (AttentionMetadata.seq_order), copied in with the
        # batch. Entries past the batch name the padding sequences (length 1, so last
        # in any longest-first order; restored from _arange); _order_written marks how
        # far a replay overwrote that tail.
        self.seq_order = torch.arange(n, dtype=torch.long, device=device)
        self._order_written = 0
        self.output = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.memory_bytes = 0  # set by capture()
        # Tests read it: which graphs ran.
        self.num_replays = {DECODE: 0, VERIFY: 0, PREFILL: 0}

    def _num_seqs(self, family: str, size: int) -> int:
        """Sequences a graph is captured for. A prefill graph of ``size`` tokens holds at
        most ``size`` of them (every sequence of a step has at least one token)."""
        return min(size, self.max_num_seqs) if family == PREFILL else size

    def _num_tokens(self, family: str, size: int) -> int:
        """Tokens a graph is captured for."""
        return size * self.verify_query_len if family == VERIFY else size

    def _metadata(self, family: str, size: int) -> AttentionMetadata:
        num_seqs, num_tokens = self._num_seqs(family, size), self._num_tokens(family, size)
        # Any value >= PREFILL_MIN_QUERY_LEN selects the same (prefill) tiles, any value
        # below it the same decode tiles: the query lengths themselves come from the device.
        max_query_len = {DECODE: 1, VERIFY: self.verify_query_len, PREFILL: size}[family]
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            block_table=self.block_table[:num_seqs],
            seq_lens=self.seq_lens[:num_seqs],
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            max_query_len=max_query_len,
            max_seq_len=self.max_model_len,
            launch_order=self.seq_order[:num_seqs] if family == DECODE else None,
        )

    def _forward(self, family: str, size: int) -> None:
        n = self._num_tokens(family, size)
        with set_forward_context(self._metadata(family, size)):
            self.output[:n] = self.model(self.input_ids[:n], self.positions[:n])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per family and size, largest first, sharing one memory pool.

        Sets ``memory_bytes``: the device memory the capture took (the graphs' pool).
        """
        # During capture the buffers describe a harmless batch (no slot is written).
        self.seq_lens.fill_(1)
        self.slot_mapping.fill_(-1)
        torch.cuda.synchronize()
        release_cached_blocks()
        free_before = torch.cuda.mem_get_info(self.output.device)[0]
        for family, size in self.graph_keys():
            self._set_capture_layout(family, size)
            self._forward(family, size)  # warm-up: compiles kernels, settles allocations
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._forward(family, size)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[(family, size)] = graph
        self.query_start_loc.copy_(self._arange)
        self._query_start_loc_is_arange = True
        self.seq_lens.fill_(1)
        torch.cuda.synchronize()
        release_cached_blocks()  # the last warm-up's blocks, outside the graphs' pool
        self.memory_bytes = free_before - torch.cuda.mem_get_info(self.output.device)[0]
        logger.info(
            "captured CUDA graphs for decode batch sizes %s, verify batch sizes %s (%d "
            "query tokens each) and prefill token counts %s: %.2f GiB",
            self.capture_sizes,
            self.verify_capture_sizes,
            self.verify_query_len,
            self.prefill_capture_sizes,
            self.memory_bytes / 2**30,
        )

    def graph_keys(self) -> list[GraphKey]:
        """Every graph to capture, largest (in tokens) first."""
        keys = [(PREFILL, t) for t in self.prefill_capture_sizes]
        keys += [(VERIFY, bs) for bs in self.verify_capture_sizes]
        keys += [(DECODE, bs) for bs in self.capture_sizes]
        return sorted(keys, key=lambda k: -self._num_tokens(*k))

    def _set_capture_layout(self, family: str, size: int) -> None:
        """The batch a graph is captured on: every sequence reads block 0 and writes
        nothing (slot -1)."""
        if family == PREFILL:  # one sequence of every token, empty ones after
            self.query_start_loc[1] = size
            self.seq_lens[0] = size
            self._set_padding(family, size, size, 1)
        elif family == VERIFY:  # every sequence verify_query_len tokens, no context
            q = self.verify_query_len
            self.query_start_loc[: size + 1].copy_(self._arange[: size + 1] * q)
            self.seq_lens[:size].fill_(q)
        else:
            self.query_start_loc.copy_(self._arange)
            self.seq_lens[:size].fill_(1)

    def _set_padding(self, family: str, size: int, num_tokens: int, num_seqs: int) -> None:
        """Pad sequences ``num_seqs..`` of a prefill or verify graph with empty ones."""
        cap = self._num_seqs(family, size)
        self.query_start_loc[num_seqs + 1 : cap + 1].fill_(num_tokens)
        self.seq_lens[num_seqs:cap].fill_(0)

    def _copy_seq_order(self, order: torch.Tensor, num_seqs: int) -> None:
        """Write a decode batch's launch order (the host's, or a device sort when the
        batch brought none) and put back the padding's own indices behind it where an
        earlier, larger batch had written."""
        if num_seqs < self._order_written:
            tail = slice(num_seqs, self._order_written)
            self.seq_order[tail].copy_(self._arange[tail])
        self.seq_order[:num_seqs].copy_(order, non_blocking=True)
        self._order_written = num_seqs

    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a decode batch of ``num_seqs`` runs at, or None."""
        i = bisect.bisect_left(self.capture_sizes, num_seqs)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def graph_key(self, meta: AttentionMetadata, num_tokens: int) -> GraphKey | None:
        """Which captured graph runs this batch (None: run it eagerly).

        A pure decode batch takes a decode graph. A batch of short queries (decode tiles,
        more than one token per sequence: drafts being verified, maybe beside a short
        prefill chunk) takes a verify graph when every query fits its ``1 + k`` tokens.
        Any other batch takes the smallest prefill graph with room for its tokens: the
        prefill tiles give every query length the right answer (a mixed batch's decode
        rows already rely on that), so a short query (a prompt of a few tokens, or the
        last tokens of a prompt the prefix cache holds) need not run eagerly, which costs
        tens of milliseconds of launches. Batches larger than every graph run eagerly.
        """
        q = meta.max_query_len
        if q == 1:
            bs = self.padded_size(meta.num_seqs)
            return None if bs is None else (DECODE, bs)
        if q <= self.verify_query_len:
            # num_seqs <= bs and q <= verify_query_len: the tokens fit as well.
            bs = self.padded_size(meta.num_seqs)
            if bs is not None:
                return (VERIFY, bs)
        i = bisect.bisect_left(self.prefill_capture_sizes, num_tokens)
        if i < len(self.prefill_capture_sizes):
            return (PREFILL, self.prefill_capture_sizes[i])
        return None

    def run(
        self,
        key: GraphKey,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Copy a batch into the static buffers and replay the graph ``key`` names."""
        family, size = key
        n, s = input_ids.shape[0], meta.num_seqs
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n : self._num_tokens(family, size)].fill_(-1)
        width = meta.block_table.shape[1]
        self.block_table[:s, :width].copy_(meta.block_table, non_blocking=True)
        self.seq_lens[:s].copy_(meta.seq_lens, non_blocking=True)
        if family == DECODE:
            self.seq_lens[s:size].fill_(1)
            self._copy_seq_order(meta.seq_order, s)
            if not self._query_start_loc_is_arange:
                self.query_start_loc.copy_(self._arange)
                self._query_start_loc_is_arange = True
        else:
            self.query_start_loc[: s + 1].copy_(meta.query_start_loc, non_blocking=True)
            self._set_padding(family, size, n, s)
            self._query_start_loc_is_arange = False
        self.graphs[key].replay()
        self.num_replays[family] += 1
        return self.output[:n]
