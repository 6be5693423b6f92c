"""The draft model's share of the KV pool, and where its passes read and write.

The draft's cache is indexed by the target's block ids, so one block id costs both
models' bytes; positions past a request's blocks go to scratch blocks after the pool.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.arg_utils import EngineArgs
from minivllm.spec_decode.draft_model import DraftModelProposer, TargetBatch
from minivllm.worker.kv_cache import KVCacheSpec, cpu_default_num_blocks, num_blocks_from_memory
from minivllm.worker.model_runner import ModelRunner
from tests.spec_decode.test_draft_model import draft_model, make_target_and_draft

TARGET = KVCacheSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, num_layers=6
)
DRAFT = KVCacheSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, num_layers=2)


def test_a_block_id_costs_both_models_bytes() -> None:
    target, draft = TARGET.block_bytes_all_layers, DRAFT.block_bytes_all_layers
    assert draft * 6 == target  # half the head size, a third of the layers
    available = 100 * (target + draft) + 5
    assert num_blocks_from_memory(TARGET, available) == available // target
    assert num_blocks_from_memory(TARGET, available, DRAFT) == 100
    assert cpu_default_num_blocks(TARGET, 1.0, 10**6, 4096, DRAFT) == (2**30) // (target + draft)


def test_runner_sizes_the_pool_and_the_drafts_cache_with_the_draft(tmp_path) -> None:
    target, draft = make_target_and_draft(tmp_path)
    runners = {}
    for name, spec in (("alone", None), ("draft", draft_model(draft, 3))):
        config = EngineArgs(
            model=str(target),
            device="cpu",
            dtype="float32",
            block_size=8,
            max_num_seqs=4,
            cpu_kv_cache_space=2**-14,  # 64 KiB: the space, not max_num_seqs, decides
            speculative_config=spec,
        ).create_engine_config()
        runners[name] = ModelRunner(config)
    alone, with_draft = runners["alone"], runners["draft"]
    per_block = alone.kv_spec.block_bytes_all_layers
    assert with_draft.draft_kv_spec.block_bytes_all_layers * 2 == per_block  # 1 of 2 layers
    assert alone.determine_num_blocks() == 2**16 // per_block
    num_blocks = with_draft.determine_num_blocks()
    assert num_blocks == 2**16 // (per_block * 3 // 2)
    with_draft.initialize_kv_cache(num_blocks)
    scratch = with_draft.drafter.num_scratch_blocks
    assert scratch == 4  # one block per batch row covers k = 3 positions of 8-token blocks
    assert with_draft.draft_kv_caches[0][0].shape[0] == num_blocks + scratch
    assert len(with_draft.draft_kv_caches) == 1 and len(with_draft.kv_caches) == 2


def test_positions_past_a_requests_blocks_go_to_its_scratch_blocks() -> None:
    """Two requests: a prefill chunk (no sample) and a decode that verified 2 drafts and
    rejected one. Block size 4, k = 3, a pool of 10 blocks (scratch: blocks 10 and 11)."""
    proposer = DraftModelProposer(torch.nn.Identity(), 3, 4, 64, 2, torch.device("cpu"))
    proposer.set_num_blocks(10)
    batch = TargetBatch(
        query_start_loc=np.array([0, 5, 8]),
        num_computed=np.array([0, 6]),
        block_table=np.array([[3, 4], [7, 2]]),
        num_blocks=np.array([2, 2]),
        needs_sample=np.array([False, True]),
    )
    plan = proposer._plan(batch, num_tokens=8, num_rejected=np.array([1]))
    # Request 0 feeds its 5 prefill tokens; request 1 its last token and the accepted
    # draft (the rejected one left out), then the token it sampled (index 8 + 0).
    assert plan.src.tolist() == [0, 1, 2, 3, 4, 5, 6, 8]
    assert plan.positions.tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    # Request 1 holds positions 0..7; its new token's position 8 is past them: scratch.
    assert plan.slots.tolist() == [12, 13, 14, 15, 16, 2 * 4 + 2, 2 * 4 + 3, 11 * 4]
    assert plan.sample_idx.tolist() == [7]
    assert plan.seq_lens.tolist() == [5, 9]
    # The chain: positions 9 and 10, in request 1's scratch block (11, its batch row's).
    assert plan.chain_pos.tolist() == [[9], [10]]
    assert plan.chain_slots.tolist() == [[45], [46]]
    assert plan.chain_table.tolist() == [[7, 2, 11]]
    # No slot of any pass lands in a block of the pool that the request does not hold.
    for slots, own in ((plan.slots[:5], {3, 4}), (plan.slots[5:], {7, 2})):
        assert all(s // 4 in own or s // 4 >= 10 for s in slots.tolist())


def test_chain_positions_stop_at_max_model_len() -> None:
    proposer = DraftModelProposer(torch.nn.Identity(), 4, 4, 10, 1, torch.device("cpu"))
    proposer.set_num_blocks(5)
    batch = TargetBatch(
        query_start_loc=np.array([0, 1]),
        num_computed=np.array([7]),
        block_table=np.array([[0, 1]]),
        num_blocks=np.array([2]),
        needs_sample=np.array([True]),
    )
    plan = proposer._plan(batch, num_tokens=1, num_rejected=np.array([0]))
    assert plan.positions.tolist() == [7, 8]
    assert plan.chain_pos[:, 0].tolist() == [9, 9, 9]
