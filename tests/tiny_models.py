"""Tiny random-weight Hugging Face checkpoints for tests (no downloads).

Each checkpoint is built with transformers' own config class and model class and saved
with ``save_pretrained`` (safetensors), exactly as a real checkpoint folder looks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3")

# Small enough for the CPU, large enough to exercise GQA, several layers and blocks.
_COMMON: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def make_hf_config(arch: str, **overrides: Any):
    """Build a transformers config for ``arch`` (llama, qwen2 or qwen3)."""
    import transformers

    kwargs = {**_COMMON, **overrides}
    if arch == "llama":
        return transformers.LlamaConfig(**kwargs)
    if arch == "qwen2":
        return transformers.Qwen2Config(**kwargs)
    if arch == "qwen3":
        kwargs.setdefault("head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"])
        return transformers.Qwen3Config(**kwargs)
    raise ValueError(f"unknown test architecture {arch!r}")


def make_tiny_model(arch: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a random-weight ``arch`` model (float32) into ``path`` and return it."""
    import transformers

    config = make_hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init of HF uses std 0.02: logits are then nearly flat and greedy ties are
    # likely. A larger spread makes argmax decisions robust to float rounding.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf_model(path: Path):
    """Load a saved tiny model with transformers, float32, eager attention."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def add_tiny_tokenizer(path: Path, vocab_size: int = 512) -> Path:
    """Train a byte-level BPE tokenizer (<= ``vocab_size`` ids) into ``path``.

    Its text is a frozen snapshot of minivllm's own source (``tests/data/tokenizer_corpus.txt``),
    so the tokenizer has real merges; ids 0/1 are ``<|bos|>``/``<|eos|>``. Pair it with a
    model whose vocabulary is ``vocab_size``. Frozen, not the live source: trained on the
    package as it stands, every edit anywhere re-rolled the test tokenizer, and with it the
    token ids of every text prompt in the suite (an unrelated new file once moved a stop
    string inside an accepted speculative run).
    """
    from minivllm.demo import train_byte_level_tokenizer

    corpus = (Path(__file__).parent / "data" / "tokenizer_corpus.txt").read_text(encoding="utf-8")
    tokenizer = train_byte_level_tokenizer([corpus], vocab_size)
    tokenizer.save_pretrained(path)
    return path
