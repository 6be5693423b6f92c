"""``minivllm.demo.passages``: prompts cut on one side of ``demo.train``'s split.

The held-out benchmark and the distillation data both rest on one claim: a prompt cut
from the validation side holds no training passage, and one cut from the training side
holds no validation passage, with the split ``demo.train`` itself made.
"""

from __future__ import annotations

import random

import pytest

from minivllm.demo import demo_model_path
from minivllm.demo.passages import cut_prompts, split_runs
from minivllm.demo.train import read_passages, split_passages

WORDS = ("and", "the", "LORD", "said", "unto", "Moses", "behold", "I", "will", "send", "thee")


def write_data(path, num_lines: int = 400) -> list[str]:
    """A demo.train data file of unique verses (with references, as ``bible -f`` prints
    them); returns the passages ``read_passages`` makes of it."""
    rng = random.Random(0)
    lines = [
        f"Ge{i // 30 + 1}:{i % 30 + 1} Verse {i}: "
        + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        + "."
        for i in range(num_lines)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return read_passages(str(path))


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(demo_model_path())


@pytest.mark.parametrize(("num", "val_every"), [(1234, 3), (400, 2), (250, 50), (99, 1)])
def test_runs_are_train_py_split(num: int, val_every: int) -> None:
    train, val = split_passages(list(range(num)), val_every)
    train_runs, val_runs = split_runs(num, val_every)
    assert [i for r in train_runs for i in r] == train
    assert [i for r in val_runs for i in r] == val
    for runs in (train_runs, val_runs):  # maximal runs: a gap between any two
        assert all(a.stop < b.start for a, b in zip(runs, runs[1:]))


@pytest.mark.parametrize("side", [0, 1])
def test_prompts_stay_on_their_side_of_the_split(tmp_path, tokenizer, side: int) -> None:
    passages = write_data(tmp_path / "data.txt", 400)
    train_text, val_text = split_passages(passages, 2)
    runs = split_runs(len(passages), 2)[side]
    prompts = cut_prompts(tokenizer, passages, runs, 12, 40)
    own, other = (train_text, val_text) if side == 0 else (val_text, train_text)
    eos = tokenizer.eos_token_id
    for p in prompts:
        texts = passages[p.first : p.first + p.count]
        assert set(texts) <= set(own) and not set(texts) & set(other)
        expected = [t for text in texts for t in [*tokenizer.encode(text), eos]]
        assert p.token_ids == expected  # the training stream's layout
        assert len(p.token_ids) >= 40  # the fewest passages that reach 40 tokens
        assert len(p.token_ids) - len(tokenizer.encode(texts[-1])) - 1 < 40
    # Round-robin over the runs: the first prompts come from different runs.
    assert prompts[0].first == runs[0].start and prompts[1].first == runs[1].start


def test_too_many_prompts_or_bad_counts_name_the_argument(tmp_path, tokenizer) -> None:
    passages = write_data(tmp_path / "data.txt", 400)
    _, val_runs = split_runs(len(passages), 2)
    with pytest.raises(ValueError, match=r"--num-prompts 1000: .* only \d+ prompts"):
        cut_prompts(tokenizer, passages, val_runs, 1000, 40)
    with pytest.raises(ValueError, match="--prompt-tokens must be >= 1"):
        cut_prompts(tokenizer, passages, val_runs, 2, 0)
    with pytest.raises(ValueError, match="val_every must be >= 1"):
        split_runs(10, 0)
