"""A one-shot all-reduce over NVLink through PyTorch's symmetric memory.

Upstream counterparts: ``vllm/distributed/device_communicators/symm_mem.py``
(``SymmMemCommunicator``: a symmetric buffer from ``torch.distributed._symmetric_memory``
and torch's ``symm_mem`` all-reduce ops) and ``custom_all_reduce.py``
(``CustomAllreduce``: the size limits, and the choice of a one-shot reduction for small
messages or any message at two ranks).

NCCL's all-reduce costs tens of microseconds however small the message: it runs a ring
protocol through its own channels. A tensor-parallel decode step of a 36-layer model
does 74 of them on messages of a few KB to 2 MB, so that fixed cost, not bandwidth,
bounds the step. On one node the GPUs can read each other's memory over NVLink
directly. Each rank allocates the same buffer with ``symm_mem.empty`` and exchanges
handles once (``rendezvous``); after that a reduction is one kernel:

* **one-shot**: every rank copies its input into its own buffer, waits at a barrier
  (signal pads in the same symmetric allocation), then reads all ranks' buffers and sums
  them, in rank order, so every rank gets the same bits. Each rank reads the whole
  message from every peer: the least latency, the most traffic.
* **two-shot**: a reduce-scatter then an all-gather inside one kernel; each rank sums
  only its slice, then copies the others' sums. One more barrier, but each rank reads
  only its share of every peer's message: faster for large messages.

Multicast (NVLink SHARP, ``multimem_*`` ops) is never used: the ops here read peers'
memory with ordinary loads. Above ``max_size`` bytes, and whenever this communicator is
disabled, ``tensor_model_parallel_all_reduce`` falls back to NCCL.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

SYMM_MEM_ENV = "MINIVLLM_SYMM_MEM"
"""``MINIVLLM_SYMM_MEM=0`` turns the symmetric-memory all-reduce off (NCCL for every
message); read when a worker joins its process group."""

KiB = 1024
MiB = 1024 * KiB

MAX_SIZE = 8 * MiB
"""Largest message (bytes) reduced through symmetric memory: upstream
``CustomAllreduce``'s default ``max_size``. It covers a decode step of 1,024 tokens at
hidden size 4,096 in bf16; longer prefills, which are bandwidth-bound, go to NCCL."""

ONE_SHOT_MAX_SIZES = {2: 512 * KiB, 4: 512 * KiB, 8: 256 * KiB}
"""Up to this many bytes a reduction is one-shot, above it two-shot, by world size.
Four and eight ranks: upstream's ``custom_all_reduce.cuh`` choice. Two ranks: upstream's
own kernel stays one-shot at any size, but torch's one-shot kernel runs at most 24
blocks, and on two H200s it ties two-shot at 512 KB and falls behind above
(``docs/benchmarks/all_reduce_h200.json``, ``python -m minivllm.benchmarks.all_reduce``)."""

SUPPORTED_WORLD_SIZES = tuple(ONE_SHOT_MAX_SIZES)
"""World sizes torch's kernels are specialized for."""

SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
"""The dtypes torch's symmetric-memory reductions dispatch on."""

# The ops must read the input and the buffer with the same vector width, so the input's
# offset in its storage must be as aligned as the buffer's start (16-byte vectors).
_ALIGNMENT = 16


def symm_mem_enabled() -> bool:
    """Whether ``MINIVLLM_SYMM_MEM`` (default on) allows the symmetric-memory all-reduce."""
    return os.environ.get(SYMM_MEM_ENV, "1") != "0"


def pick_algorithm(nbytes: int, world_size: int, max_size: int) -> str | None:
    """``"one_shot"``, ``"two_shot"`` or None (use NCCL) for a message of ``nbytes``."""
    if world_size not in ONE_SHOT_MAX_SIZES or nbytes > max_size:
        return None
    return "one_shot" if nbytes <= ONE_SHOT_MAX_SIZES[world_size] else "two_shot"


def _ops_available() -> bool:
    """torch has the symmetric-memory module and the two reductions used here."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return False
    ops = torch.ops.symm_mem
    return hasattr(ops, "one_shot_all_reduce_copy_out") and hasattr(ops, "two_shot_all_reduce_")


def unavailable_reason(
    group: dist.ProcessGroup | None, device: torch.device, max_size: int
) -> str | None:
    """Why this process cannot use the symmetric-memory all-reduce (None: it can).

    Every rank evaluates the same conditions on the same configuration, so the ranks
    agree without talking (``rendezvous`` itself is a collective).
    """
    if not symm_mem_enabled():
        return f"{SYMM_MEM_ENV}=0"
    if not (dist.is_available() and dist.is_initialized()):
        return "torch.distributed is not initialized"
    world = dist.get_world_size(group)
    if world not in SUPPORTED_WORLD_SIZES:
        return f"world size {world} (supported: {SUPPORTED_WORLD_SIZES})"
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if dist.get_backend(group) != "nccl":
        return f"process group backend {dist.get_backend(group)!r} is not NCCL"
    if max_size < _ALIGNMENT:
        return f"max_size {max_size} bytes is below one vector"
    if not _ops_available():
        return f"torch {torch.__version__} has no symmetric-memory all-reduce ops"
    return None


class SymmMemCommunicator:
    """All-reduce of small messages through a symmetric buffer; NCCL keeps the rest.

    Created once per worker, after the process group is up and before any CUDA graph is
    captured (``rendezvous`` is a collective, and a graph replays the buffer's address).

    Args:
        group: The tensor-parallel group (None: the default group).
        device: This rank's device.
        max_size: Buffer size in bytes: the largest message it reduces.
        force_algorithm: ``"one_shot"`` or ``"two_shot"`` for every message it takes,
            whatever the size (for tests and benchmarks, like upstream's
            ``force_multimem``); None: by size (``pick_algorithm``).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        device: torch.device,
        max_size: int = MAX_SIZE,
        force_algorithm: str | None = None,
    ) -> None:
        if force_algorithm not in (None, "one_shot", "two_shot"):
            raise ValueError(
                f"force_algorithm must be 'one_shot', 'two_shot' or None, got {force_algorithm!r}"
            )
        self.force_algorithm = force_algorithm
        self.disabled = True
        self.max_size = max_size - max_size % _ALIGNMENT
        self.reason = unavailable_reason(group, device, self.max_size)
        if self.reason is not None:
            logger.info("symmetric-memory all-reduce off: %s", self.reason)
            return
        import torch.distributed._symmetric_memory as torch_symm_mem

        self.group = group if group is not None else dist.group.WORLD
        self.group_name = self.group.group_name
        self.world_size = dist.get_world_size(group)
        try:
            # Bytes, viewed as each message's dtype: one buffer serves bf16 and fp32.
            self.buffer = torch_symm_mem.empty(self.max_size, dtype=torch.uint8, device=device)
            torch_symm_mem.rendezvous(self.buffer, self.group_name)
        except RuntimeError as e:
            # Every rank fails alike (same driver, same topology), so all fall back.
            self.reason = f"symmetric memory initialization failed: {e}"
            logger.warning("symmetric-memory all-reduce off: %s", self.reason)
            return
        self.disabled = False
        logger.info(
            "symmetric-memory all-reduce on: %d ranks, messages up to %d bytes",
            self.world_size,
            self.max_size,
        )

    def algorithm(self, inp: torch.Tensor) -> str | None:
        """The reduction ``inp`` gets here, or None when it must go to NCCL."""
        if self.disabled or inp.dtype not in SUPPORTED_DTYPES or not inp.is_contiguous():
            return None
        nbytes = inp.numel() * inp.element_size()
        if nbytes == 0 or nbytes % 4 or (inp.storage_offset() * inp.element_size()) % _ALIGNMENT:
            return None
        algo = pick_algorithm(nbytes, self.world_size, self.max_size)
        return self.force_algorithm if algo and self.force_algorithm else algo

    def should_use_symm_mem(self, inp: torch.Tensor) -> bool:
        """Whether ``all_reduce(inp)`` runs here (upstream's ``should_use_symm_mem``)."""
        return self.algorithm(inp) is not None

    def all_reduce(self, inp: torch.Tensor, algo: str | None = None) -> torch.Tensor:
        """Sum ``inp`` over the ranks in place; returns ``inp``.

        Call only when ``should_use_symm_mem(inp)``; every rank must call it with the
        same shape, as with any collective. ``algo``: ``algorithm(inp)`` when the caller
        already has it (the layers' all-reduce asks once per call, not twice).
        """
        algo = algo or self.algorithm(inp)
        if algo is None:
            raise ValueError(f"inp ({inp.dtype}, {tuple(inp.shape)}) is not for symmetric memory")
        flat = inp.view(-1)
        symm = self.buffer.view(inp.dtype)[: flat.numel()]
        if algo == "one_shot":
            # One kernel: copy in, barrier, read every rank's buffer, sum. Each thread
            # writes the output elements it copied in, so ``out`` may alias the input.
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(
                symm, flat, "sum", self.group_name, flat
            )
        else:
            symm.copy_(flat)
            torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", self.group_name)
            flat.copy_(symm)
        return inp
