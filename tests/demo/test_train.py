"""``python -m minivllm.demo.train``: the end-of-sequence embedding and deep models.

The tokenizer's pad id is its eos id, so by default (as the demo model was made) the eos
row of the embedding is transformers' padding row: zero and never trained. A window that
starts with eos then carries an all-zero residual stream, and every RMSNorm's backward at
zero scales the gradient by 1/sqrt(eps): a deep enough model gets a NaN gradient in its
first step. ``--train-eos-embedding`` learns that row instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.demo import demo_model_path
from minivllm.demo import train as demo_train

DEEP = ["--data", "unused.txt", "--out", "unused", "--tokenizer", "unused", "--seed", "0"]
DEEP += ["--hidden-size", "64", "--num-layers", "32", "--num-heads", "2", "--num-kv-heads", "1"]
DEEP += ["--intermediate-size", "176"]


def _first_grad_norm(extra: list[str]) -> float:
    import transformers

    args = demo_train.build_arg_parser().parse_args(DEEP + extra)
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_path())
    model = demo_train.build_model(args, tokenizer)
    gen = torch.Generator().manual_seed(0)
    window = torch.randint(2, len(tokenizer), (1, 33), generator=gen)
    window[0, 0] = tokenizer.eos_token_id  # the window starts right after a passage
    logits = model(input_ids=window[:, :-1]).logits
    F.cross_entropy(logits.flatten(0, 1), window[0, 1:]).backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def test_frozen_eos_row_makes_a_deep_model_nan() -> None:
    """The negative control: the default (the demo model's recipe) fails at 32 layers."""
    assert torch.isnan(torch.tensor(_first_grad_norm([])))


def test_train_eos_embedding_keeps_a_deep_model_finite() -> None:
    import transformers

    assert torch.isfinite(torch.tensor(_first_grad_norm(["--train-eos-embedding"])))
    args = demo_train.build_arg_parser().parse_args(DEEP + ["--train-eos-embedding"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_path())
    model = demo_train.build_model(args, tokenizer)
    eos_row = model.get_input_embeddings().weight[tokenizer.eos_token_id]
    assert eos_row.abs().sum() > 0  # initialized like any other row
    assert model.config.pad_token_id == tokenizer.pad_token_id  # still saved in config.json
