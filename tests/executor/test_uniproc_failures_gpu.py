"""On a GPU: a step error that leaves the device usable fails that step only; one that
breaks the CUDA context (a device-side assert) makes the engine dead, not a server that
fails every later request.

The broken context cannot be repaired in a process, so the scenario runs in a child
process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import make_tiny_model

SCRIPT = r"""
import sys

import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.exceptions import EngineDeadError
from minivllm.worker.model_runner import ModelRunner

llm = LLM(sys.argv[1], device="cuda", dtype="float32", max_model_len=128)
params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
prompt = {"prompt_token_ids": [5, 6, 7]}
expected = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
original = ModelRunner.execute_model_async


def usable_error(self, scheduler_output):
    ModelRunner.execute_model_async = original
    raise torch.OutOfMemoryError("injected: the device is still usable")


ModelRunner.execute_model_async = usable_error
out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
assert out.finish_reason == "error" and "OutOfMemoryError" in out.stop_reason, out
assert llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == expected


def device_assert(self, scheduler_output):
    index = torch.tensor([1 << 20], device="cuda")
    torch.zeros(4, device="cuda")[index].item()  # out of bounds: a device-side assert


ModelRunner.execute_model_async = device_assert
try:
    llm.generate(prompt, params, use_tqdm=False)
except EngineDeadError as exc:
    print("DEAD:", exc)
else:
    raise AssertionError("a broken CUDA context did not make the engine dead")
"""


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_a_broken_cuda_context_makes_the_engine_dead(tmp_path) -> None:
    path = make_tiny_model("llama", tmp_path / "llama")
    root = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=root,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DEAD: EngineCore encountered an issue: the executor cannot run" in result.stdout
    assert "device-side assert" in result.stdout
