"""Prompt lookup: hand examples, edge cases, and the vectorised search against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.spec_decode.ngram_proposer import NgramProposer


def propose(tokens: list[int], k: int = 3, lo: int = 1, hi: int = 3, max_len: int = 100):
    return NgramProposer(k, lo, hi, max_len).propose([tokens])[0]


def brute_force(tokens: list[int], k: int, lo: int, hi: int, max_len: int) -> list[int]:
    """The rule spelled out: longest n first, then the earliest earlier occurrence."""
    k = min(k, max_len - len(tokens))
    if k <= 0:
        return []
    for n in range(hi, lo - 1, -1):
        suffix = tokens[len(tokens) - n :] if n <= len(tokens) else None
        # An occurrence must start before the suffix does (it may overlap it).
        for start in range(len(tokens) - n):
            if suffix is not None and tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


# (tokens, k, prompt_lookup_min, prompt_lookup_max, expected drafts)
CASES = {
    "copies what followed the match": ([1, 2, 3, 4, 5, 9, 2, 3], 2, 1, 3, [4, 5]),
    "no match": ([1, 2, 3, 4], 3, 1, 3, []),
    "match shorter than prompt_lookup_min": ([1, 2, 3, 7, 3], 3, 2, 3, []),
    "k longer than what follows: stops at the end": ([5, 6, 7, 5, 6], 4, 1, 2, [7, 5, 6]),
    # [1, 2] occurs at 0 and 3 (the longest match): the earliest one wins.
    "several occurrences: the earliest": ([1, 2, 8, 1, 2, 9, 1, 2], 1, 1, 2, [8]),
    # [2] alone occurs later (followed by 7), but [1, 2] is longer (followed by 5).
    "the longest n-gram beats a later shorter one": ([1, 2, 5, 0, 2, 7, 1, 2], 1, 1, 2, [5]),
    # Matches longer than prompt_lookup_max count as prompt_lookup_max: earliest [3, 4].
    "capped at prompt_lookup_max": ([3, 4, 0, 2, 3, 4, 1, 2, 3, 4], 1, 1, 2, [0]),
    "a run of one token overlaps itself": ([4, 4, 4, 4], 3, 1, 3, [4]),
    "one token: nothing earlier to match": ([7], 3, 1, 3, []),
}


@pytest.mark.parametrize("case", CASES)
def test_hand_examples(case: str) -> None:
    tokens, k, lo, hi, expected = CASES[case]
    assert propose(tokens, k, lo, hi) == expected
    assert brute_force(tokens, k, lo, hi, 100) == expected


def test_drafts_never_pass_max_model_len() -> None:
    tokens = [1, 2, 3, 1, 2]
    assert propose(tokens, k=3, max_len=7) == [3, 1]
    assert propose(tokens, k=3, max_len=5) == []


def test_batch_keeps_request_order_and_accepts_arrays() -> None:
    proposer = NgramProposer(2, 1, 2, 100)
    batch = [[1, 2, 1], np.array([3, 4, 5]), [9, 9]]
    assert proposer.propose(batch) == [[2, 1], [], [9]]
    assert proposer.propose_one((1, 2, 1)) == [2, 1]


@pytest.mark.parametrize(
    "args, name",
    [((0, 1, 2, 10), "num_speculative_tokens"), ((2, 0, 2, 10), "prompt_lookup_min"),
     ((2, 3, 2, 10), "prompt_lookup_max")],
)  # fmt: skip
def test_bad_settings_name_the_argument(args: tuple[int, ...], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        NgramProposer(*args)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    k=st.integers(1, 5),
    lo=st.integers(1, 4),
    extra=st.integers(0, 3),
    room=st.integers(0, 6),
)
def test_matches_the_plain_loop(tokens: list[int], k: int, lo: int, extra: int, room: int) -> None:
    max_len = len(tokens) + room
    expected = brute_force(tokens, k, lo, lo + extra, max_len)
    assert NgramProposer(k, lo, lo + extra, max_len).propose([tokens])[0] == expected
