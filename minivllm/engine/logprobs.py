"""Per-request logprobs, assembled step by step into vLLM's output shape.

Upstream counterpart: ``LogprobsProcessor`` in ``vllm/v1/engine/logprobs.py`` (and
``append_logprobs_for_next_position`` in ``vllm/logprobs.py``). The model runner hands
over plain lists (one row per position: the chosen token first, then the batch-wide
top-N); this class trims each row to what the request asked for, decodes the token
texts and keeps the running ``cumulative_logprob``.
"""

from __future__ import annotations

from typing import Any

from minivllm.runner_outputs import Logprob, LogprobsLists
from minivllm.sample.logprobs import make_position_logprobs

PositionLogprobs = dict[int, Logprob]


class LogprobsProcessor:
    """Collects one request's sample logprobs and prompt logprobs.

    Args:
        tokenizer: Decodes ``Logprob.decoded_token`` (None leaves it None).
        num_logprobs: ``SamplingParams.logprobs`` (None: no sample logprobs).
        num_prompt_logprobs: ``SamplingParams.prompt_logprobs`` (None: none).
        num_prompt_tokens: Prompt length (prompt logprobs has one entry per token).

    Attributes:
        logprobs: One dict per generated token, or None when not requested.
        cumulative_logprob: Sum of the sampled tokens' logprobs, or None.
        prompt_logprobs: One entry per prompt token; the first is None (nothing
            predicts it), or None when not requested.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_logprobs: int | None,
        num_prompt_logprobs: int | None,
        num_prompt_tokens: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.num_logprobs = num_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.logprobs: list[PositionLogprobs] | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        if num_prompt_logprobs is not None:
            self.prompt_logprobs = [None] * num_prompt_tokens

    def _decode(self, token_ids: list[int]) -> list[str | None]:
        if self.tokenizer is None:
            return [None] * len(token_ids)
        # Each token alone, as vLLM's convert_ids_list_to_tokens does.
        return [self.tokenizer.decode([t]) for t in token_ids]

    def add_sample(self, lists: LogprobsLists, row: int) -> None:
        """Append the logprobs of one newly sampled token (row ``row`` of the step)."""
        if self.logprobs is None:
            return
        assert self.num_logprobs is not None and self.cumulative_logprob is not None
        token_ids, logprobs = lists.token_ids[row], lists.logprobs[row]
        keep = self.num_logprobs + 1
        self.cumulative_logprob += logprobs[0]
        self.logprobs.append(
            make_position_logprobs(
                token_ids,
                logprobs,
                lists.ranks[row],
                self.num_logprobs,
                self._decode(token_ids[:keep]),
            )
        )

    def add_samples(self, lists: LogprobsLists, num_rows: int | None = None) -> None:
        """Append the logprobs of the tokens a step added, one row each (a speculative
        step may add several: its accepted drafts and one more); only the first
        ``num_rows`` when a stop string ended the request before the step's last token."""
        rows = len(lists.token_ids) if num_rows is None else min(num_rows, len(lists.token_ids))
        for row in range(rows):
            self.add_sample(lists, row)

    def add_prompt_chunk(self, start: int, lists: LogprobsLists) -> None:
        """Store prompt logprobs for prompt tokens ``start + 1 ...`` (one per row).

        Row ``i`` came from the logits at position ``start + i`` and scores prompt token
        ``start + i + 1``. Storing by position makes a recomputed chunk (after a
        preemption) overwrite, never duplicate.
        """
        if self.prompt_logprobs is None:
            return
        assert self.num_prompt_logprobs is not None
        keep = self.num_prompt_logprobs + 1
        for i, (token_ids, logprobs) in enumerate(zip(lists.token_ids, lists.logprobs)):
            self.prompt_logprobs[start + i + 1] = make_position_logprobs(
                token_ids,
                logprobs,
                lists.ranks[i],
                self.num_prompt_logprobs,
                self._decode(token_ids[:keep]),
            )
