"""Tests for BlockPool: allocation, ref counts, LRU order, lazy eviction, the hash index."""

from __future__ import annotations

import logging

import pytest

from minivllm.core.block_pool import BlockEvent, BlockPool
from minivllm.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_request(tokens: list[int], rid: str = "r") -> Request:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=8),
        block_hasher=get_request_block_hasher(BLOCK_SIZE),
    )


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_constructor_validates_and_keeps_every_block_usable() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, enable_caching=True)
    pool = BlockPool(4, enable_caching=True)
    assert pool.get_num_free_blocks() == 4
    assert free_ids(pool) == [0, 1, 2, 3]
    assert pool.get_usage() == 0.0


def test_get_new_blocks_sets_ref_cnt_and_usage() -> None:
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.get_num_free_blocks() == 1
    assert pool.get_usage() == pytest.approx(0.75)


def test_get_new_blocks_too_many_raises_and_changes_nothing() -> None:
    pool = BlockPool(3, enable_caching=True)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="cannot allocate 2 blocks"):
        pool.get_new_blocks(2)
    assert free_ids(pool) == [2]


def test_free_blocks_appends_in_given_order_and_detects_double_free() -> None:
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(4)
    pool.free_blocks(reversed(blocks[:3]))
    assert free_ids(pool) == [2, 1, 0]
    with pytest.raises(ValueError, match="already free"):
        pool.free_blocks([blocks[3], blocks[0]])
    # The failed call must not have half-freed block 3.
    assert blocks[3].ref_cnt == 1
    assert free_ids(pool) == [2, 1, 0]


def test_shared_block_returns_to_queue_only_at_ref_cnt_zero() -> None:
    pool = BlockPool(2, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and pool.get_num_free_blocks() == 1
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and free_ids(pool) == [1, 0]


def cache_request_blocks(pool: BlockPool, req: Request) -> list[KVCacheBlock]:
    blocks = pool.get_new_blocks(len(req.block_hashes))
    pool.cache_full_blocks(req, blocks, 0, len(blocks))
    return blocks


def test_cache_full_blocks_indexes_by_request_hashes() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = make_request(list(range(9)))
    blocks = cache_request_blocks(pool, req)
    assert len(blocks) == 2
    for block, block_hash in zip(blocks, req.block_hashes, strict=True):
        assert block.block_hash == block_hash
        assert pool.get_cached_block(block_hash) is block
    assert pool.get_cached_block(b"\x00" * 32) is None


def test_cache_full_blocks_is_incremental_and_rejects_recaching() -> None:
    pool = BlockPool(4, enable_caching=True)
    req = make_request(list(range(12)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 1)
    assert blocks[1].block_hash is None
    pool.cache_full_blocks(req, blocks, 1, 3)
    assert [b.block_hash for b in blocks] == req.block_hashes
    with pytest.raises(ValueError, match="already cached"):
        pool.cache_full_blocks(req, blocks, 2, 3)
    with pytest.raises(ValueError, match="hashes"):
        pool.cache_full_blocks(req, blocks + pool.get_new_blocks(1), 3, 4)


def test_duplicate_content_keeps_the_first_block_indexed() -> None:
    pool = BlockPool(4, enable_caching=True)
    a = make_request([7, 7, 7, 7], rid="a")
    b = make_request([7, 7, 7, 7], rid="b")
    (block_a,) = cache_request_blocks(pool, a)
    (block_b,) = cache_request_blocks(pool, b)
    assert pool.get_cached_block(a.block_hashes[0]) is block_a
    assert block_b.block_hash is None
    assert len(pool.cached_block_hash_to_block) == 1


def test_caching_disabled_indexes_nothing() -> None:
    pool = BlockPool(2, enable_caching=False)
    req = make_request([1, 2, 3, 4])
    blocks = cache_request_blocks(pool, req)
    assert blocks[0].block_hash is None
    assert pool.cached_block_hash_to_block == {}


def test_freed_cached_block_stays_hittable_until_reused() -> None:
    pool = BlockPool(2, enable_caching=True)
    req = make_request([1, 2, 3, 4])
    (block,) = cache_request_blocks(pool, req)
    pool.free_blocks([block])
    # Free and cached at the same time: a hit can still find it.
    assert pool.get_cached_block(req.block_hashes[0]) is block
    assert block.ref_cnt == 0 and pool.get_num_free_blocks() == 2
    # Block 1 is at the front, so the cached block survives one allocation...
    (other,) = pool.get_new_blocks(1)
    assert other.block_id == 1 and pool.get_cached_block(req.block_hashes[0]) is block
    # ...and is evicted lazily, only when it is handed out again.
    (reused,) = pool.get_new_blocks(1)
    assert reused is block
    assert block.block_hash is None
    assert pool.get_cached_block(req.block_hashes[0]) is None


def test_touch_takes_a_free_cached_block_out_of_the_queue() -> None:
    pool = BlockPool(3, enable_caching=True)
    req = make_request([1, 2, 3, 4])
    (block,) = cache_request_blocks(pool, req)
    pool.free_blocks([block])
    assert free_ids(pool) == [1, 2, 0]
    pool.touch([block])
    assert block.ref_cnt == 1
    assert free_ids(pool) == [1, 2]
    # Still cached: the hit does not drop the index entry.
    assert pool.get_cached_block(req.block_hashes[0]) is block


def test_lru_order_evicts_least_recently_freed_and_chain_tail_first() -> None:
    pool = BlockPool(6, enable_caching=True)
    old = make_request(list(range(12)), rid="old")
    new = make_request(list(range(100, 112)), rid="new")
    old_blocks = cache_request_blocks(pool, old)
    new_blocks = cache_request_blocks(pool, new)
    pool.free_blocks(reversed(old_blocks))
    pool.free_blocks(reversed(new_blocks))
    # The older request's blocks go first, tail first within it.
    evicted = pool.get_new_blocks(2)
    assert evicted == [old_blocks[2], old_blocks[1]]
    assert pool.get_cached_block(old.block_hashes[0]) is old_blocks[0]
    assert pool.get_cached_block(old.block_hashes[1]) is None
    assert all(pool.get_cached_block(h) is not None for h in new.block_hashes)


def test_reset_prefix_cache_only_when_nothing_is_held(caplog: pytest.LogCaptureFixture) -> None:
    pool = BlockPool(3, enable_caching=True)
    req = make_request(list(range(8)))
    blocks = cache_request_blocks(pool, req)
    with caplog.at_level(logging.WARNING):
        assert pool.reset_prefix_cache() is False
    assert "still in use" in caplog.text
    assert pool.get_cached_block(req.block_hashes[0]) is blocks[0]
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block == {}
    assert all(b.block_hash is None for b in pool.blocks)


def test_events_are_off_by_default_and_replay_ref_counts() -> None:
    quiet = BlockPool(2, enable_caching=True)
    quiet.get_new_blocks(1)
    assert quiet.events is None and quiet.take_events() == []

    pool = BlockPool(3, enable_caching=True, enable_events=True)
    req = make_request([1, 2, 3, 4])
    (block,) = pool.get_new_blocks(1, request_id="a")
    pool.cache_full_blocks(req, [block], 0, 1)
    pool.touch([block], request_id="b")
    pool.free_blocks([block], request_id="a")
    pool.free_blocks([block], request_id="b")
    pool.get_new_blocks(3, request_id="c")
    events = pool.take_events()
    assert events[:5] == [
        BlockEvent("allocate", 0, "a"),
        BlockEvent("cache", 0, "r"),
        BlockEvent("touch", 0, "b"),
        BlockEvent("free", 0, "a"),
        BlockEvent("free", 0, "b"),
    ]
    assert BlockEvent("evict", 0, None) in events
    assert pool.take_events() == []
    # Replaying allocate/touch/free reproduces the pool's ref counts.
    ref = dict.fromkeys(range(3), 0)
    delta = {"allocate": 1, "touch": 1, "free": -1}
    for ev in events:
        ref[ev.block_id] += delta.get(ev.kind, 0)
    assert ref == {b.block_id: b.ref_cnt for b in pool.blocks}
