"""Size the KV pool on a GPU: what the memory budget leaves once the weights, the largest
step's activations, the CUDA graphs and the memory outside torch's allocator are counted.

Upstream counterparts: ``Worker.determine_available_memory`` in
``vllm/v1/worker/gpu_worker.py`` and the ``memory_profiling`` context manager in
``vllm/utils/mem_utils.py``, which diffs two memory snapshots around the profiling run.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from minivllm.worker.kv_cache import block_bytes, num_blocks_from_memory

logger = logging.getLogger(__name__)


def profile_num_blocks(runner: Any) -> int:
    """Run ``runner.profile_run()`` and turn the memory it leaves into a block count.

    ``runner`` is a ``ModelRunner`` with its model (and a draft model, if any) loaded
    and no KV cache yet. With a draft model, one block id costs both caches' bytes and
    the draft's scratch blocks come off the top. The CUDA graphs' memory pool is apart
    from the activations the profile saw (eager steps and the sampler still need
    those), so it comes off too (``ModelRunner.profile_cudagraph_memory``).
    """
    device = runner.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free_before, total = torch.cuda.mem_get_info(device)
    weights = torch.cuda.memory_allocated(device)
    runner.profile_run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    free_after, _ = torch.cuda.mem_get_info(device)
    # Memory the process holds outside torch's allocator (CUDA context, NCCL, ...).
    non_torch = max(0, (total - free_after) - torch.cuda.memory_reserved(device))
    budget = int(total * runner.cache_config.gpu_memory_utilization)
    torch.cuda.empty_cache()  # the run's activations, before the graphs' one-block cache
    graphs = runner.profile_cudagraph_memory()
    available = budget - peak - non_torch - graphs
    draft = runner.draft_kv_spec
    if draft is not None:
        # The draft's scratch blocks past the pool (see spec_decode/draft_model.py).
        available -= runner.drafter.num_scratch_blocks * draft.block_bytes_all_layers
    num_blocks = num_blocks_from_memory(runner.kv_spec, available, draft)
    logger.info(
        "memory profile: total %.2f GiB, budget %.2f GiB, weights %.2f GiB, "
        "activation peak %.2f GiB, non-torch %.2f GiB, CUDA graphs %.2f GiB, free before "
        "%.2f GiB -> KV cache %.2f GiB = %d blocks",
        total / 2**30,
        budget / 2**30,
        weights / 2**30,
        (peak - weights) / 2**30,
        non_torch / 2**30,
        graphs / 2**30,
        free_before / 2**30,
        num_blocks * block_bytes(runner.kv_spec, draft) / 2**30,
        num_blocks,
    )
    torch.cuda.empty_cache()
    return num_blocks
