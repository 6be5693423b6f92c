"""The built-in demo model: what ``minivllm generate`` runs when no ``--model`` is given.

A tiny Llama (about 5.5M parameters) trained on the King James Bible, with its own
byte-level BPE tokenizer, stored as an ordinary Hugging Face folder in ``model/`` and
installed with the package. It writes recognizable (archaic) English with no download,
which is all a demo needs: any other supported checkpoint is one ``--model`` away.
``minivllm.demo.train`` is the script that made it; docs/demo_model.md tells the story.

Beside it, ``draft/`` holds a smaller model trained the same way on the same text with
the same tokenizer: the demo model's draft model for speculative decoding.
"""

from __future__ import annotations

from pathlib import Path

from minivllm.demo.tokenizer import train_byte_level_tokenizer

__all__ = [
    "DEMO_DRAFT_DIR",
    "DEMO_MODEL_DIR",
    "demo_draft_path",
    "demo_model_path",
    "train_byte_level_tokenizer",
]

# Inside the package, so `pip install` ships it (see package-data in pyproject.toml).
DEMO_MODEL_DIR = Path(__file__).parent / "model"
DEMO_DRAFT_DIR = Path(__file__).parent / "draft"

# What a Hugging Face folder needs for minivllm and transformers to load it.
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def demo_model_path() -> Path:
    """The folder of the packaged demo model.

    Raises:
        FileNotFoundError: a file of the checkpoint is missing (an install that left out
            package data); the message names the file and how to rebuild it.
    """
    return _checked(DEMO_MODEL_DIR, "the demo model", "or pass --model")


def demo_draft_path() -> Path:
    """The folder of the packaged draft model for the demo model (2 layers, hidden 128,
    the demo model's tokenizer): ``speculative_config={"method": "draft_model", "model":
    str(demo_draft_path()), ...}``.

    Raises:
        FileNotFoundError: a file of the checkpoint is missing.
    """
    return _checked(DEMO_DRAFT_DIR, "the demo draft model", "or pass another draft model")


def _checked(folder: Path, what: str, alternative: str) -> Path:
    for name in _REQUIRED_FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{what} is incomplete: {folder / name} is missing; reinstall minivllm, "
                "rebuild it with `python -m minivllm.demo.train` (see docs/demo_model.md), "
                f"{alternative}"
            )
    return folder

