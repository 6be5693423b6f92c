"""Integer arithmetic shared by the scheduler, the KV cache and the model layers.

Upstream counterpart: ``vllm/utils/math_utils.py`` (``cdiv``).
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many groups of ``b`` hold ``a`` items (blocks for tokens)."""
    return -(-a // b)
