"""The garbage collector's start-up heap is frozen while the engine steps, and only then."""

from __future__ import annotations

import gc

import pytest

from minivllm import LLM, SamplingParams
from minivllm.utils.gc_utils import freeze_gc_heap, frozen_gc_heap


def test_frozen_scope_freezes_and_always_unfreezes() -> None:
    gc.unfreeze()
    with frozen_gc_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), frozen_gc_heap():
        raise KeyError("a failing step")
    assert gc.get_freeze_count() == 0


def test_freeze_gc_heap_collects_cycles_first() -> None:
    gc.unfreeze()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle only the collector frees
    del a, b
    freeze_gc_heap()
    try:
        assert not any(type(o).__name__ == "Node" for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_generate_steps_with_the_heap_frozen(llm: LLM) -> None:
    """Every step of LLM.generate sees a frozen heap; afterwards the heap is thawed, so a
    dropped engine's cycles stay collectable."""
    seen = []
    step = llm.llm_engine.step

    def recording_step():
        seen.append(gc.get_freeze_count())
        return step()

    llm.llm_engine.step = recording_step
    try:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                     SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    finally:
        del llm.llm_engine.step
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0
