"""The scheduler's interface to KV memory: prefix lookup, slot allocation, freeing.

Upstream counterparts: ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``),
``UnitaryKVCacheCoordinator`` (``vllm/v1/core/kv_cache_coordinator.py``) and
``FullAttentionManager`` (``vllm/v1/core/single_type_kv_cache_manager.py``). Upstream
stacks them so that one model can mix attention types (full, sliding window, Mamba), each
in its own KV cache group. minivllm's models have one group of full-attention layers, so
the three layers collapse into this one class; the logic of each step is unchanged.

The scheduler uses it in two calls per request and step::

    blocks, n = kv.get_computed_blocks(req)          # only when the request is admitted
    new = kv.allocate_slots(req, num_new_tokens, blocks, n)
    if new is None: ...                              # no room: preempt or wait
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minivllm.core.block_pool import BlockEvent, BlockPool
from minivllm.core.kv_cache_utils import KVCacheBlock
from minivllm.utils.math_utils import cdiv

if TYPE_CHECKING:
    from minivllm.request import Request


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the stats were last taken.

    Attributes:
        requests: Requests looked up.
        queries: Tokens looked up (each request's ``num_tokens``).
        hits: Tokens found in the cache.
        reset: Whether the prefix cache was reset meanwhile.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int) -> None:
        """Count one lookup of ``num_tokens`` tokens that hit ``num_hits`` of them."""
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """``hits / queries``, or 0.0 before any query."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Maps requests to KV blocks, with automatic prefix caching.

    Args:
        num_blocks: Blocks in the KV cache (as sized by memory profiling).
        block_size: Tokens per block.
        enable_caching: Share full blocks of identical prefixes between requests.
        enable_kv_cache_events: Let the block pool record :class:`BlockEvent` s.

    Raises:
        ValueError: If ``num_blocks`` or ``block_size`` is < 1.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching, enable_kv_cache_events)
        # request id -> its blocks in token order: its block table, as objects.
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # The same tables as plain ids, grown alongside req_to_blocks: the scheduler reads
        # them for every request every step, so they must not be rebuilt each time.
        self.req_to_block_ids: dict[str, list[int]] = {}
        # request id -> how many of its leading blocks are already in the prefix index,
        # so each step hashes-and-indexes only the blocks that just became full.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (some may still hold a cached prefix)."""
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, in [0, 1]."""
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Find the longest cached prefix of ``request``, in whole blocks.

        Walks ``request.block_hashes`` from the start and stops at the first miss: a
        block's key covers its whole prefix, so nothing after a miss can hit. At most
        ``num_tokens - 1`` tokens may hit: the last token must still run through the
        model, because its logits give the next token. Ref counts are not changed here;
        ``allocate_slots`` takes the hits.

        Returns:
            ``(blocks, num_computed_tokens)`` with ``num_computed_tokens ==
            len(blocks) * block_size``; ``([], 0)`` when caching is off or the request
            wants prompt logprobs (which need every prompt position computed).
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        hit_blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        num_hit_tokens = len(hit_blocks) * self.block_size
        self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens)
        return hit_blocks, num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Give ``request`` slots for its prefix hits plus ``num_new_tokens`` more tokens.

        Afterwards the request holds ``cdiv(num_computed_tokens + num_new_computed_tokens
        + num_new_tokens, block_size)`` blocks: first its old blocks, then the hit blocks,
        then fresh ones. Blocks that are now full and whose tokens are known get indexed
        in the prefix cache at once, so a request scheduled later in the same step can
        already hit them (their K/V is written in this step's forward pass, before any
        attention reads it).

        Args:
            request: The request to grow.
            num_new_tokens: Tokens to compute this step (> 0).
            new_computed_blocks: Prefix-cache hits from ``get_computed_blocks``; only for
                a request that holds no blocks yet.
            num_new_computed_tokens: Tokens those hits cover.

        Returns:
            The newly allocated (not hit) blocks, or None when the pool is too small
            right now; in that case nothing at all has changed.

        Raises:
            ValueError: On inconsistent arguments.
        """
        req_id = request.request_id
        num_held = len(self.req_to_blocks.get(req_id, ()))
        num_total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if (
            not new_computed_blocks
            and num_new_computed_tokens == 0
            and num_new_tokens > 0
            and num_total_tokens <= num_held * self.block_size
            and not self._has_blocks_to_cache(request, num_total_tokens)
        ):
            # The common decode step: the token lands in a block the request already
            # holds and completes none. Nothing to allocate, nothing to index.
            return []
        hits = list(new_computed_blocks or [])
        self._check_allocate_args(request, num_new_tokens, hits, num_new_computed_tokens)
        num_new_blocks = max(cdiv(num_total_tokens, self.block_size) - num_held - len(hits), 0)
        # A hit block nobody holds sits in the free queue; touching it takes it out, so it
        # uses up free capacity exactly like a fresh block does.
        num_evictable_hits = sum(block.ref_cnt == 0 for block in hits)
        if num_new_blocks + num_evictable_hits > self.block_pool.get_num_free_blocks():
            return None

        req_blocks = self.req_to_blocks.setdefault(req_id, [])
        req_block_ids = self.req_to_block_ids.setdefault(req_id, [])
        if hits:
            self.block_pool.touch(hits, req_id)
            req_blocks.extend(hits)
            req_block_ids.extend(block.block_id for block in hits)
            # Hits are already in the index; never index them a second time.
            self.num_cached_block[req_id] = len(req_blocks)
        new_blocks = (
            self.block_pool.get_new_blocks(num_new_blocks, req_id) if num_new_blocks else []
        )
        req_blocks.extend(new_blocks)
        req_block_ids.extend(block.block_id for block in new_blocks)

        if self.enable_caching:
            self.cache_blocks(request, num_total_tokens)
        return new_blocks

    def _check_allocate_args(
        self,
        request: Request,
        num_new_tokens: int,
        hits: list[KVCacheBlock],
        num_new_computed_tokens: int,
    ) -> None:
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        if num_new_computed_tokens != len(hits) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match "
                f"{len(hits)} new_computed_blocks of {self.block_size} tokens"
            )
        if hits and not self.enable_caching:
            raise ValueError("new_computed_blocks given but prefix caching is disabled")
        if hits and (self.req_to_blocks.get(request.request_id) or request.num_computed_tokens):
            raise ValueError(
                f"request {request.request_id} already holds blocks or computed tokens; "
                "prefix hits are only taken when a request is admitted"
            )
        for i, block in enumerate(hits):
            # A hit found by get_computed_blocks can be evicted by any allocation made
            # before this call; using it would silently attach someone else's K/V.
            if i >= len(request.block_hashes) or block.block_hash != request.block_hashes[i]:
                raise ValueError(
                    f"request {request.request_id}: new_computed_blocks[{i}] (block "
                    f"{block.block_id}) no longer holds that prefix; look it up again"
                )

    def _has_blocks_to_cache(self, request: Request, num_tokens: int) -> bool:
        """Whether ``cache_blocks(request, num_tokens)`` would index anything."""
        if not self.enable_caching:
            return False
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        return num_full > self.num_cached_block.get(request.request_id, 0)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index every full block among the request's first ``num_tokens`` tokens.

        Args:
            request: A request holding blocks for at least ``num_tokens`` tokens.
            num_tokens: Tokens whose K/V is (or is being) computed.
        """
        req_id = request.request_id
        # Keys exist only for full blocks of tokens the request already has; slots
        # reserved beyond request.num_tokens have no content yet and stay unindexed.
        if not self._has_blocks_to_cache(request, num_tokens):
            return
        num_full_blocks = min(num_tokens // self.block_size, len(request.block_hashes))
        num_cached_blocks = self.num_cached_block.get(req_id, 0)
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks.get(req_id, []), num_cached_blocks, num_full_blocks
        )
        self.num_cached_block[req_id] = num_full_blocks

    def free(self, request: Request, uncache: bool = False) -> None:
        """Release all blocks of ``request`` (finished, aborted or preempted).

        Blocks are freed last-first so that, among them, the end of the prefix chain is
        evicted first. A request that holds nothing is fine (aborted before admission).
        ``uncache``: the request failed inside a step, so its blocks' K/V may never have
        been written (blocks are indexed when allocated, before the step runs); the
        blocks only it holds leave the prefix-cache index, so nobody hits them.
        """
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, [])
        self.req_to_block_ids.pop(req_id, None)
        self.num_cached_block.pop(req_id, None)
        if uncache:
            self.block_pool.uncache_blocks(b for b in blocks if b.ref_cnt == 1)
        self.block_pool.free_blocks(reversed(blocks), req_id)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table: block ids in token order ([] if it holds none).

        The list is the manager's own and only ever grows until the request is freed;
        read it, don't modify it.
        """
        return self.req_to_block_ids.get(request_id, [])

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; only possible while no request holds blocks."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats.reset = True
        return True

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Return the stats gathered so far and start counting afresh."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache_stats(self) -> None:
        """Discard the stats gathered so far."""
        self.prefix_cache_stats = PrefixCacheStats()

    def take_events(self) -> list[BlockEvent]:
        """Block-pool events since the last call (empty unless events are enabled)."""
        return self.block_pool.take_events()
