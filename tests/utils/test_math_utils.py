"""cdiv and next_power_of_2: the host-side arithmetic the kernels' launchers size their
grids and tiles with, equal to Triton's own helpers wherever those are defined."""

from __future__ import annotations

import pytest
import triton

from minivllm.utils.math_utils import cdiv, next_power_of_2


@pytest.mark.parametrize("b", [1, 2, 3, 7, 16, 128, 2048])
def test_cdiv_is_tritons_ceiling_division(b: int) -> None:
    for a in [*range(0, 300), 16384, 151936, 2**40 + 3]:
        assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)


def test_next_power_of_2_is_tritons() -> None:
    for n in [*range(0, 5000), 151936, 2**20 + 1, 2**40, 2**40 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n)
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 5, 1024, 1025)] == [0, 1, 2, 4, 8, 1024, 2048]
