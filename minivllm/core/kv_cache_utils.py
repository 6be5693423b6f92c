"""The building blocks of the paged KV cache: blocks, the free queue, block hashes, sizing.

Upstream counterpart: ``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``,
``FreeKVCacheBlockQueue``, ``hash_block_tokens``, ``get_request_block_hasher``,
``get_num_blocks``) and ``AttentionSpec.page_size_bytes`` in
``vllm/v1/kv_cache_interface.py``.

A *block* is the unit of KV memory: ``block_size`` consecutive token slots of every layer's
K and V cache. Nothing here touches tensors; these objects are the scheduler-side
bookkeeping for memory that the model runner allocates once, up front.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minivllm.request import BlockHash

if TYPE_CHECKING:
    from minivllm.request import Request

NONE_HASH: BlockHash = hashlib.sha256(b"minivllm prefix-cache root").digest()
"""The parent hash of the first block of every sequence.

A fixed value (upstream draws it at random unless PYTHONHASHSEED is set) so that block
hashes are reproducible across runs, which makes traces and tests deterministic.
"""


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Bookkeeping for one physical KV block.

    Attributes:
        block_id: Index of the block in every layer's K/V cache tensor.
        ref_cnt: Number of requests whose block table currently holds this block.
        block_hash: The block's prefix-cache key while it is indexed in the pool's
            hash table, else None. Set only on full blocks.
        prev_free_block: Previous block in the free queue (None when not queued).
        next_free_block: Next block in the free queue (None when not queued).
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # The links are intrusive: the queue threads itself through the blocks, so moving a
    # block in or out of the queue allocates nothing. Only FreeKVCacheBlockQueue writes them.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        # Print neighbour ids, not neighbours: the default repr would walk the whole list.
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        short_hash = self.block_hash.hex()[:8] if self.block_hash else None
        return (
            f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={short_hash}, "
            f"prev={prev_id}, next={next_id})"
        )


class FreeKVCacheBlockQueue:
    """The free blocks, in eviction order, as a doubly linked list.

    The front is the next block handed out (and, if it still holds a cached prefix, the
    next one evicted); freed blocks join at the back. So the order is least recently
    freed first, which is LRU eviction once the caller frees a request's blocks
    tail-first. A block that gets a prefix-cache hit while free leaves from the middle;
    that is why this is a linked list and not a deque: every operation is O(1).

    Two sentinel blocks (id -1) bracket the list, so no operation needs a special case
    for an empty list or for the first or last element.

    Args:
        blocks: The initial free blocks, front first.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(block_id=-1)
        self.tail = KVCacheBlock(block_id=-1)
        self.head.next_free_block = self.tail
        self.tail.prev_free_block = self.head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> KVCacheBlock:
        """Remove and return the front block.

        Raises:
            ValueError: If the queue is empty.
        """
        if self.num_free_blocks == 0:
            raise ValueError("no free blocks available")
        block = self.head.next_free_block
        assert block is not None
        self._unlink(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks, front first.

        Raises:
            ValueError: If fewer than ``n`` blocks are free (nothing is removed then).
        """
        if n < 0 or n > self.num_free_blocks:
            raise ValueError(f"cannot pop n={n} blocks: {self.num_free_blocks} are free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out of the queue from wherever it is.

        Raises:
            ValueError: If ``block`` is not in the queue.
        """
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"remove: block {block.block_id} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the back of the queue (evicted last).

        Raises:
            ValueError: If ``block`` is already in the queue (a double free).
        """
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"append: block {block.block_id} is already in the free queue")
        last = self.tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.tail
        self.tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append ``blocks`` in the given order (the first of them is evicted first)."""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All queued blocks, front first (walks the list; meant for tests and tracing)."""
        blocks = []
        block = self.head.next_free_block
        while block is not None and block is not self.tail:
            blocks.append(block)
            block = block.next_free_block
        return blocks

    def _unlink(self, block: KVCacheBlock) -> None:
        prev_block, next_block = block.prev_free_block, block.next_free_block
        assert prev_block is not None and next_block is not None
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The prefix-cache key of one full block: SHA-256 of the parent key and the tokens.

    Chaining the parent's digest in makes the key stand for the whole prefix up to and
    including this block, while hashing only ``block_size`` tokens per block.

    The encoding is the 32-byte parent digest followed by each token as a little-endian
    int64. Every part has a fixed width, so two different (parent, tokens) pairs never
    encode to the same bytes, and the result is the same on every machine and Python
    version (upstream pickles a tuple instead, which it documents as not reproducible
    across versions).

    Args:
        parent_hash: Key of the previous block, or None for the first block.
        token_ids: The block's token ids.
    """
    if parent_hash is None:
        parent_hash = NONE_HASH
    token_bytes = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return hashlib.sha256(parent_hash + token_bytes).digest()


def get_request_block_hasher(block_size: int) -> Callable[[Request], list[BlockHash]]:
    """Make the ``block_hasher`` callback that ``Request`` calls whenever tokens are added.

    The callback hashes only blocks completed since the last call: it starts at
    ``len(request.block_hashes) * block_size`` and chains from ``request.block_hashes[-1]``,
    so hashing a request costs O(new tokens), not O(all tokens), per step. A partial
    last block is never hashed: only full blocks can be shared. The callback carries its
    ``block_size`` as an attribute, so that ``Request`` calls it only once the next
    block can be full, not after every decoded token.

    Args:
        block_size: Tokens per KV block.

    Raises:
        ValueError: If ``block_size`` < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")

    def request_block_hasher(request: Request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        token_ids = request.all_token_ids
        new_hashes: list[BlockHash] = []
        while start + block_size <= len(token_ids):
            parent = hash_block_tokens(parent, token_ids[start : start + block_size])
            new_hashes.append(parent)
            start += block_size
        return new_hashes

    # Read by ``Request``, which skips the call until a block can be complete.
    request_block_hasher.block_size = block_size  # type: ignore[attr-defined]
    return request_block_hasher


def page_size_bytes(block_size: int, num_kv_heads: int, head_size: int, dtype_size: int) -> int:
    """Bytes one block occupies in one layer: its K and its V, ``2*B*KVH*D*dtype_size``.

    Args:
        block_size: Tokens per block.
        num_kv_heads: KV heads stored by this process (after tensor-parallel split).
        head_size: Dimension of one head.
        dtype_size: Bytes per element of the cache (``torch.bfloat16.itemsize`` is 2);
            a number, so that the scheduler's side never imports torch.
    """
    for name, value in (
        ("block_size", block_size),
        ("num_kv_heads", num_kv_heads),
        ("head_size", head_size),
        ("dtype_size", dtype_size),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return 2 * block_size * num_kv_heads * head_size * dtype_size


def get_num_blocks(available_bytes: int, page_size_bytes: int, num_layers: int) -> int:
    """How many blocks fit in ``available_bytes`` when every layer needs one page per block.

    A block id names the same slot range in every layer, so one block costs
    ``page_size_bytes * num_layers``. Never negative.

    Args:
        available_bytes: Memory left for the KV cache after weights and activations.
        page_size_bytes: Bytes of one block in one layer (see :func:`page_size_bytes`).
        num_layers: Attention layers that each hold a K/V cache.
    """
    if page_size_bytes < 1:
        raise ValueError(f"page_size_bytes must be >= 1, got {page_size_bytes}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return max(int(available_bytes) // page_size_bytes // num_layers, 0)
