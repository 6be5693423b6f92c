"""Integer arithmetic shared by the scheduler, the KV cache and the model layers.

Upstream counterpart: ``vllm/utils/math_utils.py`` (``cdiv``, ``next_power_of_2``).

The kernels' launchers size their grids and tiles with these, on the host, rather than
with ``triton.cdiv`` and ``triton.next_power_of_2``: those are Triton functions that can
also run inside a kernel, and a host call goes through Triton's wrapper, about twenty
times the cost of the plain arithmetic (the Benchmarks chapter's fourteenth round). An
eager step makes a few hundred such calls.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many groups of ``b`` hold ``a`` items (blocks for tokens)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (0 for ``n`` <= 0, as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
