"""The block pool: every KV block, who holds it, and which cached prefix it contains.

Upstream counterpart: ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``).

Three structures, one invariant each:

* ``blocks[i].ref_cnt`` is the number of requests holding block ``i``.
* ``free_block_queue`` holds exactly the blocks with ``ref_cnt == 0``, in eviction order.
* ``cached_block_hash_to_block[h]`` is a block whose ``block_hash == h``; a block has a
  ``block_hash`` exactly while it is in that index.

A freed block keeps its contents and its index entry: it is free *and* cached, so a later
request with the same prefix can take it back (``touch``). Its cache entry is dropped only
when the block is handed out for new data (``get_new_blocks``): lazy eviction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from minivllm.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock

if TYPE_CHECKING:
    from minivllm.request import Request

logger = logging.getLogger(__name__)


class BlockEvent(NamedTuple):
    """One change to the pool, recorded only when events are enabled (for tracers).

    ``kind`` is one of ``"allocate"`` (handed out fresh, ref_cnt 1), ``"touch"`` (prefix
    hit, ref_cnt + 1), ``"free"`` (a holder let go, ref_cnt - 1), ``"cache"`` (indexed
    under a hash), ``"evict"`` (index entry dropped because the block is being reused)
    and ``"reset"`` (whole index cleared; ``block_id`` is -1). Replaying allocate, touch
    and free reproduces every ref count.
    """

    kind: str
    block_id: int
    request_id: str | None = None


class BlockPool:
    """Owns all KV blocks: allocation, freeing, and the prefix-cache index.

    Unlike upstream, no block is reserved as a "null block": upstream needs a placeholder
    for blocks that fell out of a sliding window, which minivllm does not have, and padded
    tokens are written to slot -1 (skipped), so ids ``0 .. num_blocks - 1`` are all usable.

    Args:
        num_blocks: Number of blocks in the KV cache.
        enable_caching: Keep an index of full blocks by hash (automatic prefix caching).
        enable_events: Record a :class:`BlockEvent` for every change (off by default:
            the check costs one ``is None`` test per operation).
    """

    def __init__(self, num_blocks: int, enable_caching: bool, enable_events: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_blocks)]
        # Initially ordered by id, so a fresh engine hands out blocks 0, 1, 2, ...
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        self.events: list[BlockEvent] | None = [] if enable_events else None

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block holding the full block with key ``block_hash``, or None on a miss.

        The block may be held by running requests or sitting in the free queue.
        """
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Index ``blocks[num_cached_blocks:num_full_blocks]`` under the request's hashes.

        Block ``i`` of a request gets ``request.block_hashes[i]``. If another block already
        holds the same content (two requests produced identical blocks), the first stays
        the indexed one and this block stays unhashed: blocks in a running request's
        block table never change, so the duplicate is not merged, just not shared.

        Args:
            request: The request owning ``blocks``.
            blocks: All blocks of the request, in order.
            num_cached_blocks: Blocks of the request already indexed (or already hits).
            num_full_blocks: Blocks that are full after this step.

        Raises:
            ValueError: If a hash is missing or a block to index already has a hash.
        """
        if not self.enable_caching or num_cached_blocks >= num_full_blocks:
            return
        if len(request.block_hashes) < num_full_blocks or len(blocks) < num_full_blocks:
            raise ValueError(
                f"request {request.request_id}: cannot cache {num_full_blocks} blocks with "
                f"{len(request.block_hashes)} hashes and {len(blocks)} blocks"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            block, block_hash = blocks[i], request.block_hashes[i]
            if block.block_hash is not None:
                raise ValueError(f"block {block.block_id} is already cached")
            if block_hash in self.cached_block_hash_to_block:
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
            self._record("cache", block.block_id, request.request_id)

    def get_new_blocks(self, num_blocks: int, request_id: str | None = None) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the front of the free queue, with ref_cnt 1.

        A taken block that still carries a cached prefix is evicted from the index now,
        because its slots are about to be overwritten.

        Args:
            num_blocks: How many blocks to hand out.
            request_id: The receiving request; only recorded in events.

        Raises:
            ValueError: If fewer than ``num_blocks`` blocks are free (nothing changes).
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.get_num_free_blocks()} free"
            )
        new_blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in new_blocks:
            self._maybe_evict_cached_block(block)
            block.ref_cnt = 1
            self._record("allocate", block.block_id, request_id)
        return new_blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        """Drop ``block`` from the prefix-cache index if it is there (lazy eviction)."""
        if block.block_hash is None:
            return
        del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        self._record("evict", block.block_id)

    def uncache_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop ``blocks`` from the prefix-cache index at once: their K/V cannot be
        trusted (the step that was to write them failed). They stay allocated."""
        for block in blocks:
            self._maybe_evict_cached_block(block)

    def touch(self, blocks: Iterable[KVCacheBlock], request_id: str | None = None) -> None:
        """Add a holder to each of ``blocks`` (prefix-cache hits for a request).

        A hit block with ref_cnt 0 is in the free queue as an eviction candidate; taking it
        out is what keeps it from being handed to someone else.
        """
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
            self._record("touch", block.block_id, request_id)

    def free_blocks(
        self, ordered_blocks: Iterable[KVCacheBlock], request_id: str | None = None
    ) -> None:
        """Remove a holder from each block; blocks nobody holds join the free queue's back.

        Blocks that reach ref_cnt 0 are appended in the given order, so the first of them
        is evicted first. Callers pass a request's blocks last-first: the tail of a prefix
        chain is the least likely to be shared, and evicting it first keeps the rest of
        the chain reachable (a hit needs every block before it).

        Raises:
            ValueError: If a block is already free (a double free); nothing changes then.
        """
        blocks = list(ordered_blocks)
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"free_blocks: block {block.block_id} is already free")
        for block in blocks:
            block.ref_cnt -= 1
            self._record("free", block.block_id, request_id)
        self.free_block_queue.append_n(block for block in blocks if block.ref_cnt == 0)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, e.g. after new weights make old K/V wrong.

        Only possible while no request holds a block (a running request's blocks must
        keep their contents). Returns whether the reset happened.
        """
        num_used = self.num_blocks - self.get_num_free_blocks()
        if num_used > 0:
            logger.warning("cannot reset the prefix cache: %d blocks are still in use", num_used)
            return False
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        self._record("reset", -1)
        return True

    def get_num_free_blocks(self) -> int:
        """Blocks nobody holds (cached or not): all of them can be handed out."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of blocks held by at least one request, in [0, 1]."""
        return 1.0 - self.get_num_free_blocks() / self.num_blocks

    def take_events(self) -> list[BlockEvent]:
        """Return the events recorded since the last call and start a new list."""
        if self.events is None:
            return []
        events, self.events = self.events, []
        return events

    def _record(self, kind: str, block_id: int, request_id: str | None = None) -> None:
        if self.events is not None:
            self.events.append(BlockEvent(kind, block_id, request_id))
