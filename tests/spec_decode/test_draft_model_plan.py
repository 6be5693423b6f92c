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


def _two_requests(shift: torch.Tensor | None = None) -> TargetBatch:
    """A prefill chunk of 5 tokens (no sample) and a decode that verified 2 drafts.
    Block size 4; the decode holds blocks 7 and 2 (positions 0..7)."""
    return TargetBatch(
        query_start_loc=np.array([0, 5, 8]),
        num_computed=np.array([0, 6]),
        block_table=np.array([[3, 4], [7, 2]]),
        num_blocks=np.array([2, 2]),
        needs_sample=np.array([False, True]),
        num_draft_tokens=np.array([0, 2]),
        position_shift=shift,
    )


def _layout(batch: TargetBatch, num_accepted: int):
    """k = 3, a pool of 10 blocks (scratch: blocks 10 and 11, one per batch row)."""
    proposer = DraftModelProposer(torch.nn.Identity(), 3, 4, 64, 2, torch.device("cpu"))
    proposer.set_num_blocks(10)
    input_ids = torch.arange(100, 108)
    return proposer._layout(batch, input_ids, torch.tensor([200]), torch.tensor([num_accepted]))


def test_positions_past_a_requests_blocks_go_to_its_scratch_blocks() -> None:
    """The decode accepted 1 of its 2 drafts: its new token takes the rejected draft's
    place, so the pass has the same shape whatever the verification decided."""
    passes = _layout(_two_requests(), num_accepted=1)
    # Request 0 feeds its 5 prefill tokens; request 1 its last token, the accepted
    # draft, the new token (where the rejected draft was), and a spare copy of it.
    assert passes.tokens.tolist() == [100, 101, 102, 103, 104, 105, 106, 200, 200]
    assert passes.positions.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    # Request 1 holds positions 0..7; positions 8 and 9 are past them: its scratch block
    # (11, its batch row's).
    slots = passes.meta.slot_mapping.tolist()
    assert slots == [12, 13, 14, 15, 16, 2 * 4 + 2, 2 * 4 + 3, 11 * 4, 11 * 4 + 1]
    assert passes.sample_idx.tolist() == [7]  # draft 1 is the argmax after the new token
    assert passes.meta.seq_lens.tolist() == [5, 10]
    # The chain: after the new token's position 8, positions 9 and 10, in scratch.
    assert [p.tolist() for p in passes.chain_positions] == [[9], [10]]
    assert [m.slot_mapping.tolist() for m in passes.chain_metas] == [[45], [46]]
    assert passes.chain_metas[0].block_table.tolist() == [[7, 2, 11]]
    # No slot of any pass lands in a block of the pool that the request does not hold.
    for own, part in (({3, 4}, slots[:5]), ({7, 2}, slots[5:])):
        assert all(s // 4 in own or s // 4 >= 10 for s in part)


def test_all_accepted_puts_the_new_token_last_and_a_shift_moves_everything_down() -> None:
    passes = _layout(_two_requests(), num_accepted=2)
    assert passes.tokens.tolist()[5:] == [105, 106, 107, 200]
    assert passes.sample_idx.tolist() == [8]
    assert [p.tolist() for p in passes.chain_positions] == [[10], [11]]
    # Async scheduling: the previous step rejected one draft the scheduler counted, so
    # request 1's tokens sit one position lower (request 0 does not move).
    shifted = _layout(_two_requests(torch.tensor([0, 1])), num_accepted=2)
    assert shifted.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert shifted.meta.slot_mapping.tolist()[5:] == [2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 11 * 4]
    assert shifted.meta.seq_lens.tolist() == [5, 9]
    assert [p.tolist() for p in shifted.chain_positions] == [[9], [10]]


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
    passes = proposer._layout(batch, torch.tensor([5]), torch.tensor([6]), None)
    assert passes.positions.tolist() == [7, 8]
    assert [p.tolist() for p in passes.chain_positions] == [[9], [9], [9]]
    # Position 9 goes to the row's scratch block (5); the passes past the last position
    # run there too but write nothing.
    assert [m.slot_mapping.tolist() for m in passes.chain_metas] == [[5 * 4 + 1], [-1], [-1]]
