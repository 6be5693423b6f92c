"""Incremental detokenization equals one-shot decoding; stop strings across tokens."""

from __future__ import annotations

import random

import pytest

from minivllm.engine.detokenizer import IncrementalDetokenizer, check_stop_strings
from tests.tiny_models import add_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    import transformers

    path = add_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize(
    "text", ["héllo wörld — ünïcode ✓ 日本語 🙂 end", "def f(x):\n    return x"]
)
def test_incremental_equals_full_decode(tokenizer, text: str) -> None:
    # Prompt and output are tokenized apart so that no character straddles them.
    prompt, output = tokenizer.encode("Prompt: "), tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.update([t]) for t in output]
    assert "".join(pieces) == detok.output_text == tokenizer.decode(output)


def test_random_ids_incremental(tokenizer) -> None:
    rng = random.Random(0)
    ids = [rng.randrange(2, len(tokenizer)) for _ in range(200)]
    detok = IncrementalDetokenizer(tokenizer, [])
    for t in ids:
        detok.update([t])
    full = tokenizer.decode(ids)
    # A trailing incomplete character may still be held back at the very end.
    assert full.startswith(detok.output_text) and len(full) - len(detok.output_text) <= 1


def test_stop_string_split_across_tokens() -> None:
    text = ""
    found = None
    for piece in ["The an", "sw", "er is", " 42."]:
        text += piece
        found = check_stop_strings(text, len(piece), ["answer"], include_in_output=False)
        if found:
            break
    assert found == ("answer", 4)
    assert check_stop_strings("The answer is", 7, ["answer"], include_in_output=True) == (
        "answer",
        10,
    )
    assert check_stop_strings("abc", 0, ["a"], False) is None
