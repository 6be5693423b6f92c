"""``python -m minivllm.demo.train --tokenizer DIR``: a model trained on the demo model's
tokenizer shares its vocabulary, which is what a draft model for it needs."""

from __future__ import annotations

import json

import pytest

from minivllm.config import ModelConfig, SpeculativeConfig
from minivllm.demo import demo_model_path
from minivllm.demo import train as demo_train
from minivllm.engine.arg_utils import EngineArgs

SMALL = ["--seed", "0", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2"]
SMALL += ["--num-kv-heads", "1", "--intermediate-size", "64", "--seq-len", "16"]
SMALL += ["--batch-size", "2", "--steps", "2", "--sample-tokens", "2", "--warmup-steps", "1"]
SMALL += ["--val-every", "2", "--eval-every", "2", "--device", "cpu"]


def _data(tmp_path):
    words = ["king", "men", "sons", "priests"] * 50
    lines = [f"And the {w} of the land went forth." for w in words]
    data = tmp_path / "tiny.txt"
    data.write_text("\n".join(lines) + "\n")
    return data


def test_reused_tokenizer_makes_a_draft_for_the_demo_model(tmp_path) -> None:
    out = tmp_path / "draft"
    args = ["--data", str(_data(tmp_path)), "--tokenizer", str(demo_model_path())]
    assert demo_train.main([*args, *SMALL, "--out", str(out)]) == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["tokenizer_source"] == str(demo_model_path())
    assert log["args"]["tokenizer"] == str(demo_model_path())
    assert log["args"]["vocab_size"] == 4096  # the demo tokenizer's size, not the default
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 4096
    # The engine accepts it as the demo model's draft: same vocabulary, id for id.
    config = EngineArgs(
        model=str(demo_model_path()),
        device="cpu",
        max_model_len=16,  # the draft's max_position_embeddings (its --seq-len)
        speculative_config={
            "method": "draft_model",
            "model": str(out),
            "num_speculative_tokens": 2,
        },
    ).create_engine_config()
    assert config.speculative_config.draft_model_config.hf_config.num_hidden_layers == 1


def test_trained_tokenizer_is_refused_as_a_draft_vocabulary(tmp_path) -> None:
    """The negative control: the same run with a tokenizer of its own is not the demo
    model's vocabulary, by size, and by its ids even where the sizes agree."""
    out = tmp_path / "own"
    args = ["--data", str(_data(tmp_path)), "--vocab-size", "300"]
    assert demo_train.main([*args, *SMALL, "--out", str(out)]) == 0
    assert json.loads((out / "training_log.json").read_text())["tokenizer_source"] == "trained"
    spec = SpeculativeConfig(method="draft_model", model=str(out), num_speculative_tokens=2)
    demo = EngineArgs(model=str(demo_model_path()), device="cpu").create_engine_config()
    own = EngineArgs(model=str(out), device="cpu").create_engine_config()
    spec.draft_model_config = own.model_config
    with pytest.raises(ValueError, match=r"vocab_size=\d+, the target model has vocab_size=4096"):
        spec.verify_equal_vocab(demo.model_config)
    # Same size is not enough: the ids must mean the same tokens.
    spec.draft_model_config = ModelConfig(
        model=str(out),
        hf_config=demo.model_config.hf_config,
        dtype=demo.model_config.dtype,
        max_model_len=128,
        tokenizer=str(out),
    )
    with pytest.raises(ValueError, match="different tokenizer.json"):
        spec.verify_equal_vocab(demo.model_config)


def test_tokenizer_folder_without_tokenizer_is_refused(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        demo_train.main(
            ["--data", str(_data(tmp_path)), "--tokenizer", str(tmp_path), "--out", str(tmp_path)]
        )
