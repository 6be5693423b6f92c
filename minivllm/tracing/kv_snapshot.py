"""The KV pool's side of a trace: who holds which blocks (``KVSnapshot``), and what
happened to each request's blocks in a step (``BlockCounts`` from the block pool's
events).

Split from ``tracer.py``, which records steps and imports these (and re-exports them,
so ``from minivllm.tracing.tracer import KVSnapshot`` keeps working). Like every record
of the tracer they hold ids and numbers only, so a snapshot outlives its engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minivllm.core.block_pool import BlockEvent
from minivllm.core.kv_cache_manager import KVCacheManager


@dataclass
class BlockCounts:
    """What happened to one request's blocks (or to all blocks) in a span of steps.

    Attributes:
        allocated: Fresh blocks handed to it (``get_new_blocks``).
        reused: Prefix-cache hits it took (``touch``): blocks it did not have to compute.
        freed: Blocks it let go (finished, aborted or preempted).
        cached: Its full blocks newly indexed in the prefix cache.
        evicted: Cached prefixes its fresh blocks overwrote (lazy eviction).
    """

    allocated: int = 0
    reused: int = 0
    freed: int = 0
    cached: int = 0
    evicted: int = 0

    @property
    def net_held(self) -> int:
        """Change in block references held: ``allocated + reused - freed``."""
        return self.allocated + self.reused - self.freed

    def __iadd__(self, other: BlockCounts) -> BlockCounts:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


@dataclass(frozen=True)
class KVSnapshot:
    """The KV pool at one moment: who holds which blocks, and which hold a cached prefix.

    Reference counts are not stored: a block's ref count is the number of block tables
    it appears in, so the tables say it all.

    Attributes:
        num_blocks: Blocks in the pool.
        block_size: Tokens per block.
        block_tables: Request id -> its block ids in token order (requests holding any).
        cached_block_ids: Blocks currently indexed in the prefix cache (held or free).
        num_free_blocks: Blocks nobody holds, as the pool's free queue counts them.
    """

    num_blocks: int
    block_size: int
    block_tables: dict[str, list[int]]
    cached_block_ids: frozenset[int]
    num_free_blocks: int

    def ref_counts(self) -> dict[int, int]:
        """Block id -> number of requests holding it (held blocks only)."""
        counts: dict[int, int] = {}
        for table in self.block_tables.values():
            for block_id in table:
                counts[block_id] = counts.get(block_id, 0) + 1
        return counts

    @property
    def num_blocks_in_use(self) -> int:
        """Distinct blocks held by at least one request."""
        return len(self.ref_counts())

    @property
    def shared_block_ids(self) -> set[int]:
        """Blocks held by two or more requests: one prefix, stored once."""
        return {b for b, n in self.ref_counts().items() if n > 1}

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (reusable until evicted)."""
        return len(self.cached_block_ids - self.ref_counts().keys())

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests (the engine's "KV cache usage")."""
        return self.num_blocks_in_use / self.num_blocks


def snapshot_kv(kv_cache_manager: KVCacheManager) -> KVSnapshot:
    """Copy the state of ``kv_cache_manager`` that a picture or a check needs."""
    pool = kv_cache_manager.block_pool
    return KVSnapshot(
        num_blocks=kv_cache_manager.num_blocks,
        block_size=kv_cache_manager.block_size,
        block_tables={
            rid: [b.block_id for b in blocks]
            for rid, blocks in kv_cache_manager.req_to_blocks.items()
            if blocks
        },
        cached_block_ids=frozenset(b.block_id for b in pool.cached_block_hash_to_block.values()),
        num_free_blocks=kv_cache_manager.num_free_blocks,
    )


def count_block_events(events: list[BlockEvent]) -> dict[str | None, BlockCounts]:
    """Sum block events per request id.

    The pool records an eviction without a request (it happens inside
    ``get_new_blocks``, just before the block is handed out); it is charged to the
    request whose ``allocate`` of the same block follows it. ``reset`` events are not
    counted. Events with no request id are kept under ``None``.
    """
    counts: dict[str | None, BlockCounts] = {}
    pending_evictions: set[int] = set()
    for event in events:
        if event.kind == "evict":
            pending_evictions.add(event.block_id)
            continue
        if event.kind == "reset":
            continue
        c = counts.setdefault(event.request_id, BlockCounts())
        if event.kind == "allocate":
            c.allocated += 1
            if event.block_id in pending_evictions:
                pending_evictions.discard(event.block_id)
                c.evicted += 1
        elif event.kind == "touch":
            c.reused += 1
        elif event.kind == "free":
            c.freed += 1
        elif event.kind == "cache":
            c.cached += 1
    if pending_evictions:  # an eviction not followed by an allocation: keep it counted
        counts.setdefault(None, BlockCounts()).evicted += len(pending_evictions)
    return counts
