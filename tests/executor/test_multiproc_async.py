"""Async scheduling under tensor parallelism (TP=2 on the CPU, gloo, forked workers).

* Greedy, seeded-random and logprobs requests give the same tokens at TP=2 with async
  scheduling, at TP=2 without it, and at TP=1, through chunked prefills and preemptions.
* The overlap is real: the workers receive step N+1 before they answer step N.
* A step that fails on every rank fails its own requests only: the next step, already
  sent, still serves a request it admitted.

The workers are forked, so they inherit the monkeypatches set before the ``LLM`` starts.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.runner_outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from minivllm.worker.model_runner import ModelRunner
from minivllm.worker.worker import Worker
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.timeout(120)

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def _tokens(llm: LLM, prompts: list[list[int]], params) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def test_tp2_async_matches_tp2_sync_and_tp1(llama_path) -> None:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 9, 40, 70, 23)]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (9, 12, 5, 10)]
    # Seeded random with a penalty: each rank's runner reads the token still in flight.
    params.append(SamplingParams(temperature=1.0, seed=3, repetition_penalty=1.3, max_tokens=12))
    # A small pool (preemptions) and budget (chunked prefills).
    engine = dict(max_model_len=128, max_num_batched_tokens=32, num_kv_blocks=8)
    with LLM(str(llama_path), **engine) as llm:
        tp1 = _tokens(llm, prompts, params)
    runs = {}
    for async_scheduling in (True, False):
        with LLM(
            str(llama_path), tensor_parallel_size=2, async_scheduling=async_scheduling, **engine
        ) as llm:
            core = llm.llm_engine.engine_core.engine_core
            assert core.async_scheduling is async_scheduling
            runs[async_scheduling] = _tokens(llm, prompts, params)
            preemptions = llm.llm_engine.stats.num_preemptions
        assert preemptions > 0
    assert runs[True] == runs[False] == tp1
    assert multiprocessing.active_children() == []


class _AnswersAfterNextStep(AsyncModelRunnerOutput):
    """Rank-side handle that answers only once the next step's message has arrived."""

    def __init__(self, handle: AsyncModelRunnerOutput, next_step: threading.Event) -> None:
        self.handle, self.next_step = handle, next_step

    def get_output(self) -> ModelRunnerOutput:
        if not self.next_step.wait(timeout=20):
            raise RuntimeError("step 2 did not reach the worker before step 1 was answered")
        return self.handle.get_output()


def test_workers_receive_the_next_step_before_answering(llama_path, monkeypatch) -> None:
    with LLM(str(llama_path), max_model_len=128) as llm:
        expected = _tokens(llm, [[5, 6, 7], [9, 10]], GREEDY)

    def execute_model(self: Worker, msg):
        handle = original(self, msg)
        if not hasattr(self, "test_next_step"):  # the first step waits for the second
            self.test_next_step = threading.Event()
            return _AnswersAfterNextStep(handle, self.test_next_step)
        self.test_next_step.set()
        return handle

    original = Worker.execute_model
    monkeypatch.setattr(Worker, "execute_model", execute_model)
    with LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128) as llm:
        assert _tokens(llm, [[5, 6, 7], [9, 10]], GREEDY) == expected
    assert multiprocessing.active_children() == []


MARKER = [99, 98, 97]


def test_a_step_failing_on_every_rank_fails_only_its_requests(llama_path, monkeypatch) -> None:
    # A budget of 8 tokens: step 1 holds MARKER and the 5-token prompt, the 4-token one
    # is admitted in step 2, which is sent before step 1's failure is read.
    prompts = [MARKER, [11, 12, 13, 14, 15], [40, 41, 42, 43]]
    engine = dict(max_model_len=64, max_num_batched_tokens=8, max_num_seqs=4)
    with LLM(str(llama_path), **engine) as llm:
        solo = _tokens(llm, prompts[2:], GREEDY)

    def fails_before_the_forward(self: ModelRunner, scheduler_output):
        if any(
            s.is_new and s.request.prompt_token_ids == MARKER for s in scheduler_output.scheduled
        ):
            raise ValueError("every rank fails this step on purpose")
        return original(self, scheduler_output)

    original = ModelRunner.execute_model_async
    monkeypatch.setattr(ModelRunner, "execute_model_async", fails_before_the_forward)
    with LLM(str(llama_path), tensor_parallel_size=2, async_scheduling=True, **engine) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        for out in outputs[:2]:
            assert out.outputs[0].finish_reason == "error"
            assert "every rank fails this step on purpose" in out.outputs[0].stop_reason
        assert outputs[2].outputs[0].finish_reason == "length"
        assert [outputs[2].outputs[0].token_ids] == solo
        workers = llm.llm_engine.engine_core.engine_core.model_executor.workers
        assert all(w.is_alive() for w in workers)
    assert multiprocessing.active_children() == []


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tp2_async_matches_sync_on_two_gpus(llama_path) -> None:
    """NCCL, CUDA graphs and each worker's reply thread on its own GPU: overlapping steps
    must not change a token (greedy and seeded-penalized)."""
    prompts = [[5, 6, 7], list(range(3, 60)), [9, 10] * 20]
    params = [
        GREEDY,
        GREEDY,
        SamplingParams(temperature=1.0, seed=3, repetition_penalty=1.3, max_tokens=12),
    ]
    runs = []
    for async_scheduling in (True, False):
        with LLM(
            str(llama_path),
            tensor_parallel_size=2,
            async_scheduling=async_scheduling,
            dtype="float32",
            max_model_len=128,
            gpu_memory_utilization=0.2,
        ) as llm:
            runs.append(_tokens(llm, prompts, params))
    assert runs[0] == runs[1]
    assert multiprocessing.active_children() == []
