"""Keeping the garbage collector's full passes short while the engine runs.

Upstream counterpart: ``freeze_gc_heap`` in ``vllm/utils/gc_utils.py``, which
``EngineCore.__init__`` (``vllm/v1/engine/core.py``) and the API server call once start-up
is done, and ``EngineCore.shutdown`` undoes.

Why: a step allocates Python objects for every request (outputs, token lists, events),
so the collector runs often, and every so often a full (oldest-generation) pass walks
every tracked object in the process. After start-up that is over a million objects left
by torch, transformers and the engine itself, and the pass stalls the step loop for a
few hundred milliseconds (on the H200 the throughput workload's first timed run after a
warm-up showed one such pause of the GPU between two steps). ``gc.freeze()`` moves every
object tracked so far into a permanent generation that no pass visits; the objects stay
alive, as they would anyway.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_gc_heap() -> None:
    """Collect what is garbage now, then freeze everything left (for the rest of the
    process: a server or an engine-core process after start-up)."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def frozen_gc_heap() -> Iterator[None]:
    """Freeze the heap for the duration of a block (``LLM.generate``), then unfreeze it.

    Scoped rather than process-wide because an offline ``LLM`` may be dropped without
    ``shutdown()`` (tests, notebooks, benchmarks that build one engine after another):
    frozen objects are never collected, so a frozen engine's reference cycles, its KV
    cache among them, would outlive it. No collection first: freezing is cheap, a full
    collection is the pause this avoids; garbage frozen with the heap is collected after
    the block.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
