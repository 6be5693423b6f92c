"""``ModelRunner``'s per-step shortcuts: work a step skips when nobody needs it."""

from __future__ import annotations

import pytest

import minivllm.worker.model_runner as model_runner
from minivllm import LLM, SamplingParams


def _runner(llm: LLM) -> model_runner.ModelRunner:
    return llm.llm_engine.engine_core.engine_core.model_executor.model_runner


def test_prompt_logprobs_are_computed_only_while_a_request_asks(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = model_runner.compute_prompt_logprobs

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_runner, "compute_prompt_logprobs", counted)
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    plain = SamplingParams(max_tokens=3)
    llm.generate([prompt], plain, use_tqdm=False)
    assert calls == []  # no request asked: no step scanned for one
    out = llm.generate([prompt], SamplingParams(max_tokens=3, prompt_logprobs=1), use_tqdm=False)
    assert calls and len(out[0].prompt_logprobs) == 5
    llm.generate([prompt], plain, use_tqdm=False)  # its first step says the asker finished
    assert _runner(llm)._prompt_logprobs_req_ids == set()
    calls.clear()
    llm.generate([prompt], plain, use_tqdm=False)
    assert calls == []
