"""The packaged draft model (minivllm/demo/draft/): small, trained the demo model's way on
its tokenizer, and a working draft for it."""

from __future__ import annotations

import json

import pytest

from minivllm import LLM, SamplingParams
from minivllm.demo import demo_draft_path, demo_model_path


def test_draft_is_small_and_shares_the_demo_tokenizer() -> None:
    draft, demo = demo_draft_path(), demo_model_path()
    total = sum(f.stat().st_size for f in draft.iterdir())
    assert total < 3 * 1024 * 1024, f"the draft model is {total / 2**20:.1f} MiB"
    config = json.loads((draft / "config.json").read_text())
    demo_config = json.loads((demo / "config.json").read_text())
    assert config["vocab_size"] == demo_config["vocab_size"]
    assert config["num_hidden_layers"] < demo_config["num_hidden_layers"]
    log = json.loads((draft / "training_log.json").read_text())
    demo_log = json.loads((demo / "training_log.json").read_text())
    assert log["command"].startswith("python -m minivllm.demo.train")
    assert log["tokenizer_sha256"] == demo_log["tokenizer_sha256"]
    assert log["data"]["sha256"] == demo_log["data"]["sha256"]
    assert log["num_parameters"] < demo_log["num_parameters"] / 4


def test_missing_draft_file_is_a_clear_error(tmp_path, monkeypatch) -> None:
    import minivllm.demo as demo

    monkeypatch.setattr(demo, "DEMO_DRAFT_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="demo draft model .*config.json"):
        demo.demo_draft_path()


def test_demo_model_with_its_draft_writes_what_it_writes_alone() -> None:
    """The demo model with its draft: the greedy text of the demo model alone, with some
    drafts accepted and some rejected."""
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are"]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    args = dict(dtype="float32", device="cpu", max_model_len=128)
    alone = LLM(str(demo_model_path()), **args).generate(prompts, params, use_tqdm=False)
    spec = {"method": "draft_model", "model": str(demo_draft_path()), "num_speculative_tokens": 3}
    llm = LLM(str(demo_model_path()), speculative_config=spec, **args)
    drafted = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].text for o in drafted] == [o.outputs[0].text for o in alone]
    stats = llm.llm_engine.stats.spec_decoding_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
