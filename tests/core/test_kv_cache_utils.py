"""Tests for the block, the free queue, block hashing and KV sizing."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch

from minivllm.core.kv_cache_utils import (
    NONE_HASH,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_num_blocks,
    get_request_block_hasher,
    hash_block_tokens,
    page_size_bytes,
)
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def make_queue(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def test_queue_starts_in_id_order() -> None:
    _, queue = make_queue(5)
    assert len(queue) == queue.num_free_blocks == 5
    assert ids(queue.get_all_free_blocks()) == [0, 1, 2, 3, 4]


def test_popleft_and_append_follow_fifo_order() -> None:
    blocks, queue = make_queue(4)
    first = queue.popleft()
    assert first.block_id == 0
    assert first.prev_free_block is None and first.next_free_block is None
    queue.append(first)
    assert ids(queue.get_all_free_blocks()) == [1, 2, 3, 0]
    assert ids(queue.popleft_n(2)) == [1, 2]
    assert ids(queue.get_all_free_blocks()) == [3, 0]
    assert queue.num_free_blocks == 2


def test_remove_from_the_middle_and_the_ends() -> None:
    blocks, queue = make_queue(5)
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue.get_all_free_blocks()) == [1, 3]
    assert queue.num_free_blocks == 2
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[2])


def test_append_rejects_a_block_already_queued() -> None:
    blocks, queue = make_queue(3)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[1])
    assert queue.num_free_blocks == 3


def test_empty_queue_errors_and_recovers() -> None:
    blocks, queue = make_queue(2)
    popped = queue.popleft_n(2)
    assert queue.get_all_free_blocks() == []
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()
    with pytest.raises(ValueError, match="cannot pop"):
        queue.popleft_n(1)
    queue.append_n(reversed(popped))
    assert ids(queue.get_all_free_blocks()) == [1, 0]


def test_popleft_n_too_many_changes_nothing() -> None:
    _, queue = make_queue(3)
    with pytest.raises(ValueError):
        queue.popleft_n(4)
    assert ids(queue.get_all_free_blocks()) == [0, 1, 2]


def test_block_repr_names_neighbours_not_recursively() -> None:
    blocks, _ = make_queue(3)
    text = repr(blocks[1])
    assert "id=1" in text and "prev=0" in text and "next=2" in text


def test_hash_block_tokens_is_sha256_of_parent_and_int64_tokens() -> None:
    tokens = [1, 2, 3, 70000]
    expected = hashlib.sha256(NONE_HASH + struct.pack("<4q", *tokens)).digest()
    assert hash_block_tokens(None, tokens) == expected
    assert len(expected) == 32


def test_hash_depends_on_parent_tokens_and_order() -> None:
    h1 = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(None, [1, 2]) == h1
    assert hash_block_tokens(None, [2, 1]) != h1
    assert hash_block_tokens(h1, [1, 2]) != h1
    assert hash_block_tokens(h1, [1, 2]) != hash_block_tokens(hash_block_tokens(None, [9]), [1, 2])


def make_request(tokens: list[int], block_size: int, rid: str = "r") -> Request:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=8),
        block_hasher=get_request_block_hasher(block_size),
    )


def test_request_hasher_hashes_only_full_blocks_and_chains() -> None:
    req = make_request(list(range(10)), block_size=4)
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    h1 = hash_block_tokens(h0, [4, 5, 6, 7])
    assert req.block_hashes == [h0, h1]
    req.append_output_token_ids(10)
    assert len(req.block_hashes) == 2
    req.append_output_token_ids([11])
    assert req.block_hashes == [h0, h1, hash_block_tokens(h1, [8, 9, 10, 11])]


def test_incremental_hashes_equal_hashing_all_at_once() -> None:
    tokens = list(range(100, 137))
    grown = make_request(tokens[:5], block_size=3)
    for tok in tokens[5:]:
        grown.append_output_token_ids(tok)
    whole = make_request(tokens, block_size=3)
    assert grown.block_hashes == whole.block_hashes
    assert len(whole.block_hashes) == len(tokens) // 3


def _recording_hasher(calls: list[int], block_size: int | None):
    """The real hasher of 4-token blocks, recording each call's token count; it states
    ``block_size`` only when given one."""
    inner = get_request_block_hasher(4)

    def hasher(request: Request) -> list:
        calls.append(request.num_tokens)
        return inner(request)

    if block_size is not None:
        hasher.block_size = block_size  # type: ignore[attr-defined]
    return hasher


def test_request_calls_the_hasher_only_when_a_block_can_be_full() -> None:
    calls: list[int] = []
    hasher = _recording_hasher(calls, 4)
    req = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=16), block_hasher=hasher)
    for tok in range(6, 14):
        req.append_output_token_ids(tok)
    # At construction (5 tokens), then when the 8th and the 12th token complete a block.
    assert calls == [5, 8, 12]
    assert req.block_hashes == make_request(list(range(1, 14)), block_size=4).block_hashes
    req.append_output_token_ids([14, 15, 16, 17, 18])  # several at once: one call, two blocks
    assert calls[-1] == 18 and len(req.block_hashes) == 4


def test_a_hasher_without_a_block_size_is_called_on_every_append() -> None:
    calls: list[int] = []
    req = Request(
        "r", [1, 2, 3], SamplingParams(max_tokens=8), block_hasher=_recording_hasher(calls, None)
    )
    for tok in (4, 5, 6):
        req.append_output_token_ids(tok)
    assert calls == [3, 4, 5, 6]
    assert req.block_hashes == make_request([1, 2, 3, 4, 5, 6], block_size=4).block_hashes


def test_hasher_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        get_request_block_hasher(0)


def test_page_size_bytes() -> None:
    assert page_size_bytes(16, 8, 128, torch.bfloat16.itemsize) == 2 * 16 * 8 * 128 * 2
    assert page_size_bytes(1, 1, 1, torch.float32.itemsize) == 8
    with pytest.raises(ValueError, match="num_kv_heads"):
        page_size_bytes(16, 0, 128, torch.float16.itemsize)


def test_get_num_blocks() -> None:
    page = page_size_bytes(16, 8, 128, torch.bfloat16.itemsize)
    assert get_num_blocks(page * 28 * 100 + page - 1, page, 28) == 100
    assert get_num_blocks(-5, page, 28) == 0
    with pytest.raises(ValueError, match="num_layers"):
        get_num_blocks(10**9, page, 0)
    with pytest.raises(ValueError, match="page_size_bytes"):
        get_num_blocks(10**9, 0, 4)
