"""Incremental detokenization and stop-string matching.

Upstream counterpart: ``vllm/v1/engine/detokenizer.py`` (``IncrementalDetokenizer``,
``check_stop_strings``). Decoding token by token is not the same as decoding each token
alone: byte-level BPE splits multi-byte characters across tokens, and SentencePiece
tokens carry leading-space markers that depend on their neighbours. The standard trick
keeps two offsets into the output ids: text is decoded from a few tokens *before* the
new ones (``prefix_offset``) and the already-emitted part is subtracted; a trailing
U+FFFD means a character is still incomplete, so nothing is emitted yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tokenizers
import transformers

# Tokens of context decoded before the new ones; enough for any merge or space marker.
_CONTEXT_TOKENS = 5


def fast_decoder(tokenizer: Any) -> Callable[..., str] | None:
    """The Rust ``tokenizers.Tokenizer.decode`` behind ``tokenizer``, where calling it
    directly gives exactly what ``tokenizer.decode`` gives; else None.

    Why: a stream decodes twice per token per request, and transformers' Python wrapper
    (input conversion, kwargs, the clean-up check) costs several times the Rust decode
    itself; with hundreds of streams that shows in every engine step the front end
    processes. The wrapper adds nothing when the class keeps transformers' own
    ``decode`` and ``_decode`` and does not clean up tokenization spaces, so only then
    is it skipped.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    fast_cls = transformers.PreTrainedTokenizerFast
    if (
        isinstance(backend, tokenizers.Tokenizer)
        and isinstance(tokenizer, fast_cls)
        and type(tokenizer).decode is fast_cls.decode
        and type(tokenizer)._decode is fast_cls._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    ):
        return backend.decode
    return None


class IncrementalDetokenizer:
    """Turns a request's growing list of output ids into text, one step at a time.

    Args:
        tokenizer: A Hugging Face tokenizer.
        prompt_token_ids: The prompt, used as left context for the first output tokens.
        skip_special_tokens: Drop special tokens from the text.
        stop: Stop strings checked by ``update_and_check_stop``.
        min_tokens: Text of the first ``min_tokens`` output tokens is never searched.
        include_stop_str_in_output: Keep a matched stop string (and a stop token's
            text) in ``output_text``.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        stop: list[str] | None = None,
        min_tokens: int = 0,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.min_tokens = min_tokens
        self.include_stop_str_in_output = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.output_text = ""
        self.num_output_tokens = 0  # output ids consumed so far
        # Ids of the last update_and_check_stop after the one that completed a stop string.
        self.tokens_past_stop = 0
        self._fast_decode = fast_decoder(tokenizer)

    def _decode(self, ids: list[int]) -> str:
        if self._fast_decode is not None:
            return self._fast_decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, new_token_ids: list[int]) -> str:
        """Add generated ids; return the newly completed text (possibly "")."""
        self.token_ids.extend(new_token_ids)
        self.num_output_tokens += len(new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        new_text = full_text[len(prefix_text) :]
        self.prefix_offset = max(self.read_offset, len(self.token_ids) - _CONTEXT_TOKENS)
        self.read_offset = len(self.token_ids)
        self.output_text += new_text
        return new_text

    def flush(self) -> None:
        """Append text still held back at the end: a character the last tokens left
        incomplete, shown as U+FFFD, exactly as a one-shot ``decode`` of the ids shows it.

        Called when a request finishes without a stop string, so the final text does
        not depend on whether the request had stop strings or was streamed.
        """
        if self.read_offset == len(self.token_ids):
            return
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        self.output_text += full_text[len(prefix_text) :]
        self.read_offset = len(self.token_ids)

    def update_and_check_stop(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Detokenize a step's new ids, then look for a stop string; return it if found.

        Mirrors vLLM's ``BaseIncrementalDetokenizer.update``:

        * ``stop_terminated`` (the scheduler stopped the request on EOS or a stop token
          id): that last token's text is left out unless ``include_stop_str_in_output``;
        * text produced by the first ``min_tokens`` tokens is not searched, and nothing
          is searched before more than ``min_tokens`` tokens exist;
        * on a match ``output_text`` is cut before the stop string (or after it with
          ``include_stop_str_in_output``), and ``tokens_past_stop`` says how many of
          the step's ids came after the one that completed it. A speculative step can
          bring several tokens; upstream keeps them all, minivllm drops those (the
          caller does), so a request ends on the same token with speculation as without.
        """
        self.tokens_past_stop = 0
        num_new = len(new_token_ids)
        if stop_terminated and not self.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
        stop_check_offset = len(self.output_text)
        text_ends = []  # len(output_text) after each id
        for token_id in new_token_ids:
            self.update([token_id])
            text_ends.append(len(self.output_text))
            if self.min_tokens and self.num_output_tokens <= self.min_tokens:
                stop_check_offset = len(self.output_text)
        if stop_terminated and not self.include_stop_str_in_output:
            self.num_output_tokens += 1  # the skipped stop token still counts
        if not self.stop or self.num_output_tokens <= self.min_tokens:
            return None
        match = check_stop_strings(
            self.output_text,
            len(self.output_text) - stop_check_offset,
            self.stop,
            self.include_stop_str_in_output,
        )
        if match is None:
            return None
        stop_str, truncate_to = match
        if self.include_stop_str_in_output:
            match_end = len(self.output_text) if truncate_to == -1 else truncate_to
        else:
            match_end = truncate_to + len(stop_str)
        completing = next((i for i, end in enumerate(text_ends) if end >= match_end), None)
        if completing is not None:
            self.tokens_past_stop = num_new - 1 - completing
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str


def check_stop_strings(
    output_text: str,
    new_char_count: int,
    stop: list[str],
    include_in_output: bool,
) -> tuple[str, int] | None:
    """Find the first stop string that the latest text completed.

    Only the tail that could contain a match touching the new characters is searched,
    so a string split across tokens is still found, and old text is not rescanned.

    Returns:
        ``(stop_string, truncate_to)`` where ``truncate_to`` is the length the output
        text keeps (-1 keeps it whole), or None when nothing matched.
    """
    if not new_char_count or not stop:
        return None
    for stop_str in stop:
        start = max(0, len(output_text) - new_char_count - len(stop_str) + 1)
        index = output_text.find(stop_str, start)
        if index == -1:
            continue
        if include_in_output:
            end = index + len(stop_str)
            return stop_str, (end if end < len(output_text) else -1)
        return stop_str, index
    return None
