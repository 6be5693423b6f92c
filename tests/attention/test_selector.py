"""The attention backend selector refuses a backend that cannot run on the device."""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.selector import check_attn_backend, get_attn_backend, triton_available
from minivllm.engine.arg_utils import EngineArgs
from tests.tiny_models import make_tiny_model

CPU = torch.device("cpu")
needs_triton = pytest.mark.skipif(not triton_available()[0], reason=triton_available()[1])


def _assert_explains_triton_on_cpu(message: str) -> None:
    assert message.startswith(
        "attention_backend='triton' needs a CUDA GPU, but the device is 'cpu'"
    )
    assert "attention_backend='torch'" in message and "TRITON_INTERPRET=1" in message


@needs_triton
@pytest.mark.parametrize("interpret", [None, "0", "true"])
def test_triton_on_cpu_without_the_interpreter_says_how_to_fix_it(monkeypatch, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    for call in (check_attn_backend, get_attn_backend):
        with pytest.raises(ValueError) as err:
            call("triton", CPU)
        _assert_explains_triton_on_cpu(str(err.value))
    # "auto" and "torch" still work on the CPU.
    assert get_attn_backend("auto", CPU).name == "torch"
    assert get_attn_backend("torch", CPU).name == "torch"


@needs_triton
def test_engine_args_refuse_triton_on_cpu_before_loading(monkeypatch, tmp_path):
    """The check runs at construction: the model folder is not even read."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = EngineArgs(model=str(tmp_path / "absent"), device="cpu", attention_backend="triton")
    with pytest.raises(ValueError) as err:
        args.create_engine_config()
    _assert_explains_triton_on_cpu(str(err.value))


@needs_triton
def test_triton_with_the_interpreter_or_a_gpu_is_allowed(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_attn_backend("triton", CPU)
    path = make_tiny_model("llama", tmp_path / "m")
    config = EngineArgs(
        model=str(path), device="cpu", attention_backend="triton", max_model_len=64
    ).create_engine_config()
    assert config.attention_backend == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    check_attn_backend("triton", torch.device("cuda"))  # a name check: no GPU is touched


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match=r"attention_backend must be one of .*got 'flash'"):
        check_attn_backend("flash", CPU)
