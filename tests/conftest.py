"""Test-suite set-up shared by every test module.

Triton reads ``TRITON_INTERPRET`` when it is first imported, so without a GPU it must be
set before anything imports triton: that is why this happens at the top of conftest.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# minivllm's logger prints through its own handler and does not propagate (as vLLM's);
# pytest's caplog listens on the root logger, so let records reach it under test. The
# import installs the handler first, so the setting below is the one that stays.
import minivllm  # noqa: E402,F401

logging.getLogger("minivllm").propagate = True


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random-weight Llama with a trained byte-level tokenizer (one per module)."""
    from tests.tiny_models import add_tiny_tokenizer, make_tiny_model

    path = make_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return add_tiny_tokenizer(path)


@pytest.fixture(scope="module")
def llm(model_dir):
    """An ``LLM`` on ``model_dir``: float32 on the CPU, max_model_len 128."""
    from minivllm import LLM

    return LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=128)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests cleanly when CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
