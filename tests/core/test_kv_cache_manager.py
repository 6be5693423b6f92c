"""Tests for KVCacheManager: prefix hits, allocation, freeing, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from minivllm.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

BS = 4


def make_request(
    tokens: list[int], rid: str, block_size: int = BS, **sampling: int | None
) -> Request:
    params = SamplingParams(max_tokens=sampling.pop("max_tokens", 8), **sampling)
    return Request(rid, tokens, params, block_hasher=get_request_block_hasher(block_size))


def run_prefill(kv: KVCacheManager, req: Request) -> list[int]:
    """Admit ``req`` like the scheduler does and mark its whole prompt computed."""
    hits, num_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return kv.get_block_ids(req.request_id)


def snapshot(kv: KVCacheManager) -> tuple:
    pool = kv.block_pool
    return (
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        dict(pool.cached_block_hash_to_block),
        {rid: list(blocks) for rid, blocks in kv.req_to_blocks.items()},
        dict(kv.num_cached_block),
    )


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(4, 0)
    kv = KVCacheManager(8, 4)
    assert (kv.num_blocks, kv.block_size, kv.num_free_blocks, kv.usage) == (8, 4, 8, 0.0)


def test_allocate_prompt_then_decode_grows_one_block_at_a_time() -> None:
    kv = KVCacheManager(8, BS)
    req = make_request(list(range(10)), "a")
    new = kv.allocate_slots(req, 10)
    assert [b.block_id for b in new] == [0, 1, 2]
    assert kv.get_block_ids("a") == [0, 1, 2]
    assert kv.num_free_blocks == 5 and kv.usage == pytest.approx(3 / 8)
    req.num_computed_tokens = 10
    req.append_output_token_ids(99)
    assert kv.allocate_slots(req, 1) == []
    req.num_computed_tokens = 11
    req.append_output_token_ids(98)
    assert kv.allocate_slots(req, 1) == []
    req.num_computed_tokens = 12
    req.append_output_token_ids(97)
    new = kv.allocate_slots(req, 1)
    assert [b.block_id for b in new] == [3]
    assert kv.get_block_ids("a") == [0, 1, 2, 3]


def test_only_full_known_blocks_are_cached_chunk_by_chunk() -> None:
    kv = KVCacheManager(8, BS)
    req = make_request(list(range(12)), "a")
    kv.allocate_slots(req, 5)
    blocks = kv.req_to_blocks["a"]
    assert [b.block_hash is not None for b in blocks] == [True, False]
    req.num_computed_tokens = 5
    kv.allocate_slots(req, 7)
    assert [b.block_hash for b in kv.req_to_blocks["a"]] == req.block_hashes


def test_slots_beyond_known_tokens_are_not_cached() -> None:
    kv = KVCacheManager(4, BS)
    req = make_request(list(range(6)), "a")
    kv.allocate_slots(req, 8)  # reserve two full blocks for six known tokens
    assert [b.block_hash is not None for b in kv.req_to_blocks["a"]] == [True, False]
    assert len(kv.block_pool.cached_block_hash_to_block) == 1


def test_decode_caches_the_block_its_new_token_completes() -> None:
    kv = KVCacheManager(4, BS)
    req = make_request(list(range(7)), "a")
    kv.allocate_slots(req, 7)
    req.num_computed_tokens = 7
    req.append_output_token_ids(50)
    assert kv.req_to_blocks["a"][1].block_hash is None
    kv.allocate_slots(req, 1)
    assert kv.req_to_blocks["a"][1].block_hash == req.block_hashes[1]


def test_prefix_hit_across_requests_shares_blocks() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request(list(range(10)), "a")
    ids_a = run_prefill(kv, a)
    b = make_request(list(range(9)) + [77, 78, 79], "b")
    hits, num_hit = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == ids_a[:2] and num_hit == 8
    assert all(blk.ref_cnt == 1 for blk in hits)  # lookup does not take references
    kv.allocate_slots(b, b.num_tokens - num_hit, hits, num_hit)
    ids_b = kv.get_block_ids("b")
    assert ids_b[:2] == ids_a[:2] and ids_b[2] not in ids_a
    assert [kv.block_pool.blocks[i].ref_cnt for i in ids_a] == [2, 2, 1]


def test_lookup_stops_at_the_first_miss() -> None:
    kv = KVCacheManager(10, BS)
    run_prefill(kv, make_request(list(range(13)), "a"))
    # Same second and third blocks, different first block: the chain breaks at once.
    b = make_request([100, 101, 102, 103] + list(range(4, 13)), "b")
    assert kv.get_computed_blocks(b) == ([], 0)


@pytest.mark.parametrize(("prompt_len", "expected_hit"), [(8, 4), (9, 8), (7, 4), (4, 0)])
def test_hit_is_capped_so_the_last_token_is_computed(prompt_len: int, expected_hit: int) -> None:
    kv = KVCacheManager(10, BS)
    run_prefill(kv, make_request(list(range(12)), "a"))
    b = make_request(list(range(prompt_len)), "b")
    blocks, num_hit = kv.get_computed_blocks(b)
    assert num_hit == expected_hit == len(blocks) * BS
    assert num_hit < b.num_tokens


def test_exact_multiple_prompt_recomputes_last_block_into_an_unindexed_duplicate() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request(list(range(8)), "a")
    ids_a = run_prefill(kv, a)
    b = make_request(list(range(8)), "b")
    ids_b = run_prefill(kv, b)
    assert ids_b[0] == ids_a[0] and ids_b[1] != ids_a[1]
    dup = kv.block_pool.blocks[ids_b[1]]
    assert dup.block_hash is None
    assert kv.block_pool.get_cached_block(b.block_hashes[1]).block_id == ids_a[1]


def test_no_hits_when_caching_is_off_or_prompt_logprobs_wanted() -> None:
    kv = KVCacheManager(10, BS, enable_caching=False)
    run_prefill(kv, make_request(list(range(12)), "a"))
    assert kv.block_pool.cached_block_hash_to_block == {}
    assert kv.get_computed_blocks(make_request(list(range(12)), "b")) == ([], 0)
    assert kv.prefix_cache_stats.requests == 0

    kv = KVCacheManager(10, BS)
    run_prefill(kv, make_request(list(range(12)), "a"))
    logprobs_req = make_request(list(range(12)), "c", prompt_logprobs=1)
    assert kv.get_computed_blocks(logprobs_req) == ([], 0)


def test_prefix_cache_stats_and_hit_rate() -> None:
    kv = KVCacheManager(10, BS)
    assert PrefixCacheStats().hit_rate == 0.0
    run_prefill(kv, make_request(list(range(9)), "a"))
    kv.get_computed_blocks(make_request(list(range(9)), "b"))
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert stats.hit_rate == pytest.approx(8 / 18)
    assert kv.prefix_cache_stats.requests == 0
    kv.get_computed_blocks(make_request([5], "c"))
    kv.reset_prefix_cache_stats()
    assert kv.prefix_cache_stats == PrefixCacheStats()


def test_allocation_failure_returns_none_and_changes_nothing() -> None:
    kv = KVCacheManager(4, BS)
    run_prefill(kv, make_request(list(range(9)), "a"))
    b = make_request(list(range(100, 109)), "b")
    before = snapshot(kv)
    assert kv.allocate_slots(b, 9) is None
    assert snapshot(kv) == before
    assert "b" not in kv.req_to_blocks


def test_evictable_hits_count_against_free_capacity() -> None:
    kv = KVCacheManager(3, BS)
    a = make_request(list(range(9)), "a")
    run_prefill(kv, a)
    kv.free(a)
    # Blocks 0 and 1 are now free but cached; a holder of one fresh block takes block 2.
    other = make_request([55], "x")
    assert [b.block_id for b in kv.allocate_slots(other, 1)] == [2]
    b = make_request(list(range(9)), "b")
    hits, num_hit = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0, 1]
    # 1 fresh block + 2 hits leaving the free queue = 3 > 2 free: must refuse.
    before = snapshot(kv)
    assert kv.allocate_slots(b, 1, hits, num_hit) is None
    assert snapshot(kv) == before
    kv.free(other)
    assert kv.allocate_slots(b, 1, hits, num_hit) is not None
    assert kv.get_block_ids("b")[:2] == [0, 1]


def test_hits_on_held_blocks_cost_no_free_capacity() -> None:
    kv = KVCacheManager(4, BS)
    run_prefill(kv, make_request(list(range(9)), "a"))  # holds 3 blocks, 1 free
    b = make_request(list(range(9)), "b")
    hits, num_hit = kv.get_computed_blocks(b)
    new = kv.allocate_slots(b, 1, hits, num_hit)
    assert new is not None and len(new) == 1 and kv.num_free_blocks == 0


def test_free_releases_tail_first_and_forgets_the_request() -> None:
    kv = KVCacheManager(6, BS)
    a = make_request(list(range(10)), "a")
    ids = run_prefill(kv, a)
    kv.free(a)
    queue = [b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()]
    assert queue[-3:] == ids[::-1]
    assert "a" not in kv.req_to_blocks and "a" not in kv.num_cached_block
    assert kv.get_block_ids("a") == []
    kv.free(a)  # freeing a request that holds nothing is harmless
    assert kv.num_free_blocks == 6


def test_preempted_request_gets_its_own_blocks_back() -> None:
    kv = KVCacheManager(6, BS)
    a = make_request(list(range(10)), "a")
    ids = run_prefill(kv, a)
    kv.free(a)
    a.num_computed_tokens = 0
    hits, num_hit = kv.get_computed_blocks(a)
    assert [b.block_id for b in hits] == ids[:2] and num_hit == 8


def test_allocate_slots_rejects_bad_arguments() -> None:
    kv = KVCacheManager(8, BS)
    a = make_request(list(range(9)), "a")
    run_prefill(kv, a)
    b = make_request(list(range(9)), "b")
    hits, num_hit = kv.get_computed_blocks(b)
    with pytest.raises(ValueError, match="num_new_tokens"):
        kv.allocate_slots(b, 0, hits, num_hit)
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(b, 1, hits, num_hit - 1)
    with pytest.raises(ValueError, match="already holds blocks"):
        kv.allocate_slots(a, 1, hits, num_hit)
    d = make_request(list(range(9)), "d")
    d.num_computed_tokens = 4
    with pytest.raises(ValueError, match="computed tokens"):
        kv.allocate_slots(d, 1, hits, num_hit)
    c = make_request(list(range(50, 59)), "c")
    with pytest.raises(ValueError, match="no longer holds that prefix"):
        kv.allocate_slots(c, 1, hits, num_hit)
    off = KVCacheManager(8, BS, enable_caching=False)
    with pytest.raises(ValueError, match="disabled"):
        off.allocate_slots(b, 1, hits, num_hit)


def test_stale_hit_after_eviction_is_refused() -> None:
    kv = KVCacheManager(3, BS)
    a = make_request(list(range(9)), "a")
    run_prefill(kv, a)
    kv.free(a)
    b = make_request(list(range(9)), "b")
    hits, num_hit = kv.get_computed_blocks(b)
    kv.allocate_slots(make_request(list(range(200, 212)), "x"), 12)  # evicts everything
    with pytest.raises(ValueError, match="look it up again"):
        kv.allocate_slots(b, 1, hits, num_hit)


def test_reset_prefix_cache() -> None:
    kv = KVCacheManager(4, BS)
    a = make_request(list(range(9)), "a")
    run_prefill(kv, a)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.prefix_cache_stats.reset
    assert kv.get_computed_blocks(make_request(list(range(9)), "b")) == ([], 0)


def test_events_pass_request_ids_through() -> None:
    kv = KVCacheManager(4, BS, enable_kv_cache_events=True)
    a = make_request(list(range(5)), "a")
    run_prefill(kv, a)
    kv.free(a)
    kinds = [(e.kind, e.block_id, e.request_id) for e in kv.take_events()]
    assert kinds == [
        ("allocate", 0, "a"),
        ("allocate", 1, "a"),
        ("cache", 0, "a"),
        ("free", 1, "a"),
        ("free", 0, "a"),
    ]


# --- property-based: random schedules over a tiny pool -----------------------------------

# Prompts are cut from these, so requests share first blocks, whole prefixes, or nothing.
PREFIXES = [list(range(1, 13)), [1, 2, 3, 4, 5, 6] + list(range(20, 26)), list(range(30, 42))]


class KVCacheMachine(RuleBasedStateMachine):
    """Drives a KVCacheManager the way a scheduler would, with a simulated KV cache.

    The fake model writes, for each computed position, the whole token prefix ending
    there into its slot (real K/V depends on exactly that). So a request that was handed
    a wrong or overwritten block is caught by comparing slots with its own tokens.
    """

    @initialize(
        num_blocks=st.integers(2, 10),
        block_size=st.sampled_from([1, 2, 4]),
        caching=st.booleans(),
    )
    def setup(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
        self.bs = block_size
        self.slots: list[list[tuple[int, ...] | None]] = [
            [None] * block_size for _ in range(num_blocks)
        ]
        self.live: list[Request] = []
        self.hash_to_prefix: dict[bytes, tuple[int, ...]] = {}
        self.next_id = 0

    @precondition(lambda self: len(self.live) < 5)
    @rule(
        which=st.integers(0, len(PREFIXES) - 1),
        cut=st.integers(0, 12),
        suffix=st.lists(st.integers(0, 3), max_size=4),
        max_tokens=st.integers(1, 5),
    )
    def add_request(self, which: int, cut: int, suffix: list[int], max_tokens: int) -> None:
        prompt = PREFIXES[which][:cut] + suffix or [7]
        req = make_request(prompt, f"r{self.next_id}", self.bs, max_tokens=max_tokens)
        self.next_id += 1
        self.live.append(req)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 99), chunk=st.integers(1, 8), preempt=st.booleans())
    def step(self, pick: int, chunk: int, preempt: bool) -> None:
        req = self.live[pick % len(self.live)]
        rid = req.request_id
        hits, num_hit = [], 0
        if rid not in self.kv.req_to_blocks:
            hits, num_hit = self.kv.get_computed_blocks(req)
        start = req.num_computed_tokens + num_hit
        num_new = min(chunk, req.num_tokens - start)
        if self.kv.allocate_slots(req, num_new, hits, num_hit) is None:
            if preempt and rid in self.kv.req_to_blocks:
                self.kv.free(req)
                req.num_computed_tokens = 0
            return
        self.check_slots(req, num_hit)  # the hits must already hold this request's K/V
        self.forward(req, start, start + num_new)
        req.num_computed_tokens = start + num_new
        if req.num_computed_tokens == req.num_tokens:
            if req.num_output_tokens == req.max_tokens:
                self.kv.free(req)
                self.live.remove(req)
            else:
                req.append_output_token_ids(req.num_tokens % 3)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 99))
    def abort(self, pick: int) -> None:
        req = self.live.pop(pick % len(self.live))
        self.kv.free(req)

    def forward(self, req: Request, start: int, end: int) -> None:
        """What reshape_and_cache would do: write positions [start, end) into slots."""
        table = self.kv.get_block_ids(req.request_id)
        for pos in range(start, end):
            self.slots[table[pos // self.bs]][pos % self.bs] = tuple(req.all_token_ids[: pos + 1])
        for i, block_hash in enumerate(req.block_hashes):
            self.hash_to_prefix[block_hash] = tuple(req.all_token_ids[: (i + 1) * self.bs])

    def check_slots(self, req: Request, num_tokens: int) -> None:
        table = self.kv.get_block_ids(req.request_id)
        for pos in range(num_tokens):
            expected = tuple(req.all_token_ids[: pos + 1])
            assert self.slots[table[pos // self.bs]][pos % self.bs] == expected

    @invariant()
    def ref_counts_match_holders(self) -> None:
        if not hasattr(self, "kv"):
            return
        pool = self.kv.block_pool
        holders = [0] * pool.num_blocks
        for blocks in self.kv.req_to_blocks.values():
            assert len({b.block_id for b in blocks}) == len(blocks)
            for b in blocks:
                holders[b.block_id] += 1
        assert [b.ref_cnt for b in pool.blocks] == holders
        queued = pool.free_block_queue.get_all_free_blocks()
        assert len(queued) == pool.get_num_free_blocks()
        assert {b.block_id for b in queued} == {i for i, n in enumerate(holders) if n == 0}
        assert len(queued) + sum(n > 0 for n in holders) == pool.num_blocks

    @invariant()
    def index_is_consistent_and_correct(self) -> None:
        if not hasattr(self, "kv"):
            return
        pool = self.kv.block_pool
        index = pool.cached_block_hash_to_block
        if not self.kv.enable_caching:
            assert index == {}
        for block_hash, block in index.items():
            assert block.block_hash == block_hash
            # The block holds exactly the K/V of the prefix its hash stands for.
            prefix = self.hash_to_prefix[block_hash]
            base = len(prefix) - self.bs
            for off in range(self.bs):
                assert self.slots[block.block_id][off] == prefix[: base + off + 1]
        assert sum(b.block_hash is not None for b in pool.blocks) == len(index)

    @invariant()
    def every_running_request_reads_its_own_kv(self) -> None:
        if not hasattr(self, "kv"):
            return
        for req in self.live:
            if req.request_id in self.kv.req_to_blocks:
                self.check_slots(req, req.num_computed_tokens)

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        for req in self.live:
            self.kv.free(req)
        pool = self.kv.block_pool
        assert pool.get_num_free_blocks() == pool.num_blocks
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        assert self.kv.req_to_blocks == {} and self.kv.usage == 0.0


KVCacheMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestKVCacheMachine = KVCacheMachine.TestCase


def test_fast_path_still_rejects_inconsistent_hit_counts() -> None:
    """The early return for decode tokens must not skip argument checks."""
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    req = make_request(list(range(6)), "fastpath")
    run_prefill(kv, req)
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(req, 1, None, num_new_computed_tokens=4)
