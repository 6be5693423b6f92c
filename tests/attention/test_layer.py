"""The ``Attention`` layer's cache-write contract: it writes this step's K/V itself unless
handed back the ``KVCacheUpdate`` it gave out for this step, and gives one out only to
the Triton backend in a step with metadata.

The backends here are the torch reference ops behind a recording cache write, named
``"triton"`` or ``"torch"`` and accepting a fused cache write as those backends do: what
the layer decides depends only on that flag, and the reference keeps these tests fast.
The Triton kernel's own write is held to ``reshape_and_cache`` in
tests/model_executor/test_qk_norm_rope.py.
"""

from __future__ import annotations

import pytest
import torch

from minivllm.attention import reference
from minivllm.attention import triton_unified_attention as tua
from minivllm.attention.layer import Attention, KVCacheUpdate
from minivllm.attention.selector import AttentionBackend, get_attn_backend
from minivllm.forward_context import AttentionMetadata, DecodeSplit, set_forward_context
from tests.attention.paged_batch import PagedBatch, make_paged_batch

NUM_KV_HEADS, GROUP, HEAD_SIZE = 2, 2, 16


def _batch() -> PagedBatch:
    # A decode over a cached context, and a prefill chunk over a cached prefix.
    return make_paged_batch([(5, 1), (3, 4)], block_size=4, num_kv_heads=NUM_KV_HEADS,
                            group=GROUP, head_size=HEAD_SIZE, dtype=torch.float32)  # fmt: skip


def _layer(
    batch: PagedBatch, name: str, hints: list[dict] | None = None
) -> tuple[Attention, list[torch.Tensor]]:
    """An Attention layer bound to ``batch``'s cache and a backend called ``name``; the
    list records the slot mapping of every cache write the backend makes, ``hints`` (if
    given) the keyword hints of every attention call."""
    writes: list[torch.Tensor] = []

    def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
        writes.append(slot_mapping)
        reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)

    def paged_attention(query, key_cache, value_cache, block_table, seq_lens,
                        query_start_loc, scale, **kwargs) -> torch.Tensor:  # fmt: skip
        if hints is not None:
            hints.append(kwargs)
        result = reference.paged_attention(
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale
        )
        out = kwargs.get("out")
        return result if out is None else out.copy_(result)

    layer = Attention(NUM_KV_HEADS * GROUP, HEAD_SIZE, batch.scale, NUM_KV_HEADS, "layers.0")
    layer.kv_cache = (batch.key_cache, batch.value_cache)
    layer.backend = AttentionBackend(name, reshape_and_cache, paged_attention,
                                     fused_kv_cache_write=name == "triton",
                                     takes_seq_order=name == "triton",
                                     splits_decodes=name == "triton")  # fmt: skip
    return layer, writes


def _metadata(batch: PagedBatch) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping, block_table=batch.block_table,
        seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc,
        max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len,
    )  # fmt: skip


def _flat(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens = batch.query.shape[0]
    return tuple(t.reshape(num_tokens, -1) for t in (batch.query, batch.key, batch.value))


def test_offers_the_cache_only_to_triton_in_a_step():
    batch = _batch()
    triton_layer, _ = _layer(batch, "triton")
    torch_layer, _ = _layer(batch, "torch")
    unbound = Attention(NUM_KV_HEADS * GROUP, HEAD_SIZE, 1.0, NUM_KV_HEADS)
    metadata = _metadata(batch)
    with set_forward_context(None):  # the memory-profiling run
        assert triton_layer.fusable_kv_cache_update() is None
    with set_forward_context(metadata):
        update = triton_layer.fusable_kv_cache_update()
        assert torch_layer.fusable_kv_cache_update() is None
        assert unbound.fusable_kv_cache_update() is None
    assert update.key_cache is batch.key_cache and update.value_cache is batch.value_cache
    assert update.slot_mapping is metadata.slot_mapping


def test_a_cache_written_before_attention_is_not_written_again():
    """The same output and cache as a layer that writes the cache itself, with no write
    from the layer."""
    writing, unfused = _batch(), _batch()
    q, k, v = _flat(writing)
    layer, writes = _layer(writing, "triton")
    with set_forward_context(_metadata(writing)):
        update = layer.fusable_kv_cache_update()
        # What the fused kernel does before attention, as the reference does it.
        reference.reshape_and_cache(writing.key, writing.value, *update)
        out = layer(q, k, v, kv_cache_updated=update)
    assert writes == []

    ref_layer, ref_writes = _layer(unfused, "triton")
    with set_forward_context(_metadata(unfused)):
        expected = ref_layer(*_flat(unfused))
    assert len(ref_writes) == 1
    assert torch.equal(out, expected)
    assert torch.equal(writing.key_cache, unfused.key_cache)
    assert torch.equal(writing.value_cache, unfused.value_cache)


def test_rejects_an_update_of_another_layer_or_step():
    batch = _batch()
    layer, writes = _layer(batch, "triton")
    other, _ = _layer(_batch(), "triton")
    q, k, v = _flat(batch)
    metadata = _metadata(batch)
    with set_forward_context(metadata):
        foreign = other.fusable_kv_cache_update()
        stale = KVCacheUpdate(batch.key_cache, batch.value_cache, metadata.slot_mapping.clone())
        for update in (foreign, stale):
            with pytest.raises(ValueError, match="not this layer's cache update"):
                layer(q, k, v, kv_cache_updated=update)
        update = layer.fusable_kv_cache_update()
    with set_forward_context(None), pytest.raises(ValueError, match="no step is running"):
        layer(q, k, v, kv_cache_updated=update)
    assert writes == []


def test_hands_a_decode_batch_order_only_to_a_backend_that_takes_it():
    """The Triton backend gets the step's ``seq_order`` (one sort shared by every layer of
    the step); the torch oracle is never handed one, and the metadata never sorts for it."""
    decode = make_paged_batch([(5, 1), (9, 1), (2, 1)], block_size=4,
                              num_kv_heads=NUM_KV_HEADS, group=GROUP, head_size=HEAD_SIZE,
                              dtype=torch.float32)  # fmt: skip
    seen: dict[str, list[dict]] = {"torch": [], "triton": []}  # the oracle first
    layers = {name: _layer(decode, name, seen[name])[0] for name in seen}
    metadata = _metadata(decode)
    with set_forward_context(metadata):
        for name, layer in layers.items():
            if name == "torch":
                assert "seq_order" not in metadata.__dict__  # not sorted for the oracle
            layer(*_flat(decode))
            layer(*_flat(decode))
    orders = [hints["seq_order"] for hints in seen["triton"]]
    assert orders[0] is orders[1] is metadata.seq_order
    assert orders[0].tolist() == [1, 0, 2]
    assert [hints["seq_order"] for hints in seen["torch"]] == [None, None]


def _mixed(dtype: torch.dtype = torch.float32, query: int = 4, device=None) -> PagedBatch:
    # Two decodes first (as the scheduler lists them), then a chunk and a whole prompt.
    return make_paged_batch([(5, 1), (11, 1), (3, query), (0, query + 3)], block_size=4,
                            num_kv_heads=NUM_KV_HEADS, group=GROUP, head_size=HEAD_SIZE,
                            dtype=dtype, device=device or "cpu")  # fmt: skip


def _split(batch: PagedBatch, metadata: AttentionMetadata, n: int = 2) -> AttentionMetadata:
    """``metadata`` with its first ``n`` sequences (decodes) cut off, as prepare_inputs
    cuts a mixed step."""
    lens = batch.seq_lens.tolist()
    metadata.decode_split = DecodeSplit.of(
        metadata, n, batch.query_start_loc[n:] - batch.query_start_loc[n],
        max(lens[:n]), max(lens[n:]),
    )  # fmt: skip
    return metadata


def test_a_mixed_batch_is_attended_in_two_calls_only_by_a_backend_that_splits():
    """The Triton backend gets the decodes (one-token queries, their own launch order)
    and the chunks in separate calls, each into its rows of one output; the oracle gets
    the batch whole. The outputs agree."""
    batch = _mixed()
    seen: dict[str, list[dict]] = {"torch": [], "triton": []}
    outs = {}
    for name in seen:
        layer, _ = _layer(batch, name, seen[name])
        with set_forward_context(_split(batch, _metadata(batch))):
            outs[name] = layer(*_flat(batch))
    decodes, prefills = seen["triton"]
    assert (decodes["max_query_len"], decodes["max_seq_len"]) == (1, 12)
    assert decodes["seq_order"].tolist() == [1, 0]
    assert (prefills["max_query_len"], prefills["max_seq_len"]) == (7, 7)
    assert prefills["seq_order"] is None
    assert decodes["out"].data_ptr() == outs["triton"].data_ptr()
    assert len(seen["torch"]) == 1 and seen["torch"][0]["out"] is None
    torch.testing.assert_close(outs["triton"], outs["torch"])


def test_split_triton_attention_matches_one_launch_and_the_reference(monkeypatch):
    """The real kernels: a mixed batch with a chunk long enough for prefill tiles, once
    whole and once cut after its decodes. Cut, the decodes run on 16-row decode tiles
    and the chunks keep the prefill tiles; both runs match the oracle."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = _mixed(torch.bfloat16, query=33, device=device)
    triton = get_attn_backend("triton", device)
    configs = []
    real_launch = tua.launch_unified_attention

    def launch(*args, **kwargs):
        configs.append(args[8])
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(tua, "launch_unified_attention", launch)
    monkeypatch.setattr("minivllm.attention.backends.triton_attn.launch_unified_attention",
                        launch)  # fmt: skip
    q, k, v = _flat(batch)
    outs = []
    for cut in (False, True):
        layer, _ = _layer(batch, "triton")
        layer.backend = triton
        metadata = _metadata(batch)
        with set_forward_context(_split(batch, metadata) if cut else metadata):
            outs.append(layer(q, k, v).view_as(batch.query))
    whole, decodes, prefills = configs
    assert whole.block_m == prefills.block_m > decodes.block_m == 16
    # The layer wrote this step's keys and values into the cache: the oracle reads them.
    ref = reference.paged_attention(batch.query, batch.key_cache, batch.value_cache,
                                    batch.block_table, batch.seq_lens,
                                    batch.query_start_loc, batch.scale)  # fmt: skip
    for out in outs:
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=2e-2, rtol=2e-2)
