"""Prompt lookup: propose the tokens that followed the last time the context's end occurred.

Upstream counterpart: ``vllm/v1/spec_decode/ngram_proposer.py`` (``NgramProposer``,
``_find_longest_matched_ngram_and_propose_tokens``). Text that repeats itself (code
being edited, a passage being quoted, a summary reusing the prompt's phrases) is
cheap to predict: if the last ``n`` tokens also appear earlier, guess that what came
after them then comes after them now. No model runs, so a wrong guess costs only the
wasted verification slots.

The rule, as upstream's: among the n-grams ending the request's tokens with
``prompt_lookup_min <= n <= prompt_lookup_max``, take the longest that occurred
earlier (an earlier occurrence may overlap the suffix, but must start at least one
token before it); if it occurred several times, take the *earliest* occurrence; propose
up to ``k`` tokens that followed it, fewer if the sequence ends first. Upstream finds
the match with a Knuth-Morris-Pratt scan of the reversed tokens compiled by Numba;
minivllm compares every earlier position with the last token at once in NumPy, then
extends only the positions that matched, which gives the same answer in one pass over
the tokens and ``max_n - 1`` passes over a handful of candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    """Drafts for a batch of requests, from their own tokens.

    Args:
        num_speculative_tokens: ``k``, the most drafts per request and step.
        prompt_lookup_min: Shortest suffix n-gram worth matching (>= 1).
        prompt_lookup_max: Longest suffix n-gram tried (>= ``prompt_lookup_min``).
        max_model_len: No draft may take a sequence past this length.
    """

    def __init__(
        self,
        num_speculative_tokens: int,
        prompt_lookup_min: int,
        prompt_lookup_max: int,
        max_model_len: int,
    ) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"prompt_lookup_min={prompt_lookup_min}, prompt_lookup_max={prompt_lookup_max}"
            )
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.max_model_len = max_model_len

    def propose(self, token_ids: Sequence[Sequence[int] | np.ndarray]) -> list[list[int]]:
        """Drafts for each request, given all its tokens so far (prompt then output).

        A request gets no drafts (an empty list) when nothing matches or when it has
        reached ``max_model_len``.
        """
        return [self.propose_one(tokens) for tokens in token_ids]

    def propose_one(self, token_ids: Sequence[int] | np.ndarray) -> list[int]:
        """Drafts for one request's tokens (prompt then output)."""
        tokens = np.asarray(token_ids)
        k = min(self.k, self.max_model_len - len(tokens))
        if k <= 0:
            return []
        found = find_longest_ngram_match(tokens, self.min_n, self.max_n)
        if found is None:
            return []
        start = found  # the first token after the matched n-gram
        return tokens[start : start + k].tolist()


def find_longest_ngram_match(tokens: np.ndarray, min_n: int, max_n: int) -> int | None:
    """Where to start copying: just after the earliest occurrence of the longest match.

    ``match_len[e]`` is how many tokens ending at position ``e`` equal the tokens ending
    the sequence (capped at ``max_n``), for every ``e`` before the last position. One
    pass over the sequence finds the ends where it is at least 1 (the token equals the
    last one); each further offset ``t`` keeps those of them where ``tokens[e - t] ==
    tokens[-1 - t]`` too, since a match of length ``t + 1`` needs one of length ``t``.
    Only the survivors are compared, usually a handful, so a step's proposal costs one
    pass over the request's tokens rather than ``max_n``.

    Returns:
        The index of the first token after the match, or None if no n-gram of length
        ``>= min_n`` matches.
    """
    length = len(tokens)
    if length < min_n + 1:
        return None
    # An earlier occurrence ends at most one token early. Ascending, and filtering keeps
    # the order, so best[0] is the earliest occurrence of the longest match (upstream's
    # choice).
    best = np.flatnonzero(tokens[:-1] == tokens[-1])
    longest = 1
    for t in range(1, min(max_n, length - 1)):
        if not best.size:
            break
        ends = best[best >= t]
        ends = ends[tokens[ends - t] == tokens[length - 1 - t]]
        if not ends.size:
            break
        best, longest = ends, t + 1
    if not best.size or longest < min_n:
        return None
    return int(best[0]) + 1
