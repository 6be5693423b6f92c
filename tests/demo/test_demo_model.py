"""The packaged demo model: it loads, agrees with transformers, and writes real English.

The oracle is transformers' own ``LlamaForCausalLM.generate`` on the same folder, in float32
on the CPU; minivllm must produce the same greedy tokens. A random-weight twin of the model
(same config, same tokenizer) shows that the English check is one a model can fail.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.cli import main
from minivllm.demo import DEMO_MODEL_DIR, demo_model_path
from minivllm.demo import train as demo_train

PROMPTS = ["In the beginning", "And God said unto Moses", "The LORD is my shepherd", "Blessed"]
MAX_TOKENS = 16
# The most frequent words of the King James text; ordinary English shares most of them.
COMMON_WORDS = frozenset(
    "the and of to that in he shall unto for i his a lord they be is him not them it with "  # noqa: SIM905
    "all thou thy was my me which but ye their have thee will from as are when this".split()
)


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(demo_model_path())


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def _hf_greedy(model, prompt_ids: list[list[int]]) -> list[list[int]]:
    outs = []
    with torch.no_grad():
        for ids in prompt_ids:
            inp = torch.tensor([ids])
            gen = model.generate(
                inp, attention_mask=torch.ones_like(inp), max_new_tokens=MAX_TOKENS, do_sample=False
            )
            outs.append(gen[0, len(ids) :].tolist())
    return outs


def _english_score(text: str) -> tuple[int, float]:
    """(number of words, fraction of them that are common English words)."""
    words = re.findall(r"[a-z']+", text.lower())
    return len(words), sum(w in COMMON_WORDS for w in words) / max(1, len(words))


@pytest.fixture(scope="module")
def minivllm_outputs(prompt_ids):
    llm = LLM(str(demo_model_path()), dtype="float32", device="cpu", num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)


def test_checkpoint_is_small_and_documented() -> None:
    path = demo_model_path()
    total = sum(f.stat().st_size for f in path.iterdir())
    assert total <= 20 * 1024 * 1024, f"demo model is {total / 2**20:.1f} MiB"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    log = json.loads((path / "training_log.json").read_text())
    assert log["seed"] == 0 and log["command"].startswith("python -m minivllm.demo.train")
    assert 1e6 < log["num_parameters"] < 2e7
    assert log["final_val_loss"] < log["eval"][0]["val_loss"], "validation loss never fell"


def test_greedy_matches_transformers(prompt_ids, minivllm_outputs) -> None:
    from tests.tiny_models import load_hf_model

    expected = _hf_greedy(load_hf_model(demo_model_path()), prompt_ids)
    got = [o.outputs[0].token_ids for o in minivllm_outputs]
    for prompt, g, e in zip(PROMPTS, got, expected):
        assert g == e, f"prompt {prompt!r}: minivllm {g} != transformers {e}"
    eos = json.loads((DEMO_MODEL_DIR / "generation_config.json").read_text())["eos_token_id"]
    for o, e in zip(minivllm_outputs, expected):
        assert o.outputs[0].finish_reason == ("stop" if e[-1] == eos else "length")


def test_text_is_recognizable_english(tokenizer, prompt_ids, minivllm_outputs) -> None:
    import transformers

    text = " ".join(o.outputs[0].text for o in minivllm_outputs)
    n_words, common = _english_score(text)
    assert n_words >= 20 and common >= 0.3, f"not English-like ({common:.0%}): {text!r}"
    assert {"the", "and", "of"} <= set(re.findall(r"[a-z]+", text.lower()))
    # The same check on a random-weight twin must fail, or it would prove nothing.
    config = transformers.AutoConfig.from_pretrained(demo_model_path())
    torch.manual_seed(0)
    twin = transformers.LlamaForCausalLM(config).eval()
    twin_ids = _hf_greedy(twin, prompt_ids)
    twin_text = " ".join(tokenizer.decode(ids, skip_special_tokens=True) for ids in twin_ids)
    n_twin, common_twin = _english_score(twin_text)
    assert n_twin < 20 or common_twin < 0.3, f"random model passed: {twin_text!r}"


def test_cli_generate_without_model(capsys) -> None:
    argv = ["generate", "And God said", "--max-tokens", "8", "--device", "cpu"]
    assert main([*argv, "--num-kv-blocks", "32"]) == 0
    out = capsys.readouterr().out
    assert "built-in demo model" in out and str(DEMO_MODEL_DIR) in out
    completion = re.search(r"--- prompt: 'And God said'\n'(.*)'\n", out)
    assert completion and _english_score(completion.group(1))[0] >= 3, out


def test_missing_file_is_a_clear_error(tmp_path, monkeypatch) -> None:
    import minivllm.demo as demo

    monkeypatch.setattr(demo, "DEMO_MODEL_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        demo.demo_model_path()


def test_training_script_is_reproducible(tmp_path) -> None:
    lines = [
        f"Ge{i // 10 + 1}:{i % 10 + 1} And the {w} of the land went forth unto the city."
        for i, w in enumerate(["king", "men", "sons", "priests", "people"] * 40)
    ]
    data = tmp_path / "tiny.txt"
    data.write_text("\n".join(lines) + "\n")
    assert (
        demo_train.read_passages(str(data))[0]
        == "And the king of the land went forth unto the city."
    )
    small = ["--data", str(data), "--seed", "0", "--vocab-size", "300", "--hidden-size", "32"]
    small += ["--num-layers", "1", "--num-heads", "2", "--num-kv-heads", "1"]
    small += ["--intermediate-size", "64", "--seq-len", "16", "--batch-size", "2", "--steps", "3"]
    small += [
        "--sample-tokens",
        "2",
        "--warmup-steps",
        "1",
        "--val-every",
        "2",
        "--eval-every",
        "3",
        "--device",
        "cpu",
    ]
    logs = []
    for run in ("a", "b"):
        assert demo_train.main([*small, "--out", str(tmp_path / run)]) == 0
        logs.append(json.loads((tmp_path / run / "training_log.json").read_text()))
    assert logs[0]["model_sha256"] == logs[1]["model_sha256"]
    assert logs[0]["loss_curve"] == logs[1]["loss_curve"]
    llm = LLM(str(tmp_path / "a"), dtype="float32", device="cpu", num_kv_blocks=8)
    out = llm.generate(["And the"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_training_script_rejects_bad_data(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--data"):
        demo_train.main(["--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")])
