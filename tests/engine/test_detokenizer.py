"""Incremental detokenization equals one-shot decoding; stop strings across tokens."""

from __future__ import annotations

import random

import pytest

from minivllm.engine.detokenizer import IncrementalDetokenizer, check_stop_strings, fast_decoder
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


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_rust_decode_shortcut_gives_the_tokenizers_text(
    tokenizer, skip_special_tokens: bool
) -> None:
    decode = fast_decoder(tokenizer)
    assert decode is not None  # a fast tokenizer without clean-up: the shortcut applies
    rng = random.Random(1)
    special = list(tokenizer.all_special_ids)
    for _ in range(50):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 8))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(special))
        assert decode(ids, skip_special_tokens=skip_special_tokens) == tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens
        )


def test_the_rust_decode_shortcut_is_not_taken_when_transformers_would_clean_up(
    tokenizer, monkeypatch
) -> None:
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert fast_decoder(tokenizer) is None
    assert fast_decoder(object()) is None  # not a transformers fast tokenizer


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


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stop_terminated", [False, True])
def test_a_step_of_several_ids_ends_on_the_one_completing_the_stop_string(
    tokenizer, include: bool, stop_terminated: bool
) -> None:
    """A speculative step may bring several ids at once. The stop string here is
    completed by the third of six; the three after it are reported in
    ``tokens_past_stop`` (the output processor drops them), so the request ends on the
    same id as decoding one id at a time, and the text is cut the same way."""
    prompt = tokenizer.encode("Prompt: ")
    pieces = [tokenizer.encode(w) for w in ("alpha", " beta", " gamma", " delta", " eps", " z")]
    assert all(len(p) >= 1 for p in pieces)
    ids = [t for p in pieces for t in p]
    completing = len(pieces[0]) + len(pieces[1]) + len(pieces[2]) - 1  # last id of " gamma"
    kwargs = dict(stop=["gamma"], include_stop_str_in_output=include)
    one_at_a_time = IncrementalDetokenizer(tokenizer, prompt, **kwargs)
    stopped_at = next(
        n for n, token in enumerate(ids) if one_at_a_time.update_and_check_stop([token], False)
    )
    assert stopped_at == completing and one_at_a_time.tokens_past_stop == 0
    batch = IncrementalDetokenizer(tokenizer, prompt, **kwargs)
    assert batch.update_and_check_stop(ids, stop_terminated) == "gamma"
    assert batch.tokens_past_stop == len(ids) - 1 - completing
    assert batch.output_text == one_at_a_time.output_text
    assert batch.output_text == ("alpha beta gamma" if include else "alpha beta ")
