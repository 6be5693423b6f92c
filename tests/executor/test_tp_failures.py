"""Failures under tensor parallelism (TP=2 on the CPU, gloo, forked workers).

* A rank that raises while every rank still answers (after the step's collectives, as
  a deterministic error would on every rank): the step's requests fail, the workers
  serve on, and the ``LLM`` gives the same tokens as before.
* A rank that raises before a collective leaves its peer blocked in it: the executor
  waits ``STRAGGLER_TIMEOUT_S`` for the peer, then stops every worker; the engine is
  dead (``EngineDeadError`` naming the rank), and so is every later call.
* A worker process killed mid-step or while idle: dead, with a clear error, at once.
* A rank whose GPU context is broken (it would fail every later call): dead at once,
  naming the rank, even though every rank answered.

The workers are forked, so they inherit the monkeypatches set before the ``LLM`` starts.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.exceptions import EngineDeadError
from minivllm.executor import multiproc_executor, worker_proc
from minivllm.worker.worker import Worker
from tests.tiny_models import make_tiny_model

PROMPTS = [[5, 6, 7], [11, 12, 13, 14, 15], [40, 41], [7, 8, 9, 10]]
MARKER = [99, 98, 97]  # a request whose step rank 1 fails
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def _generate(llm: LLM, prompts: list[list[int]]):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def _schedules_marker(msg) -> bool:
    return any(new.prompt_token_ids == MARKER for new in msg.new_requests)


def _workers(llm: LLM) -> list:
    return list(llm.llm_engine.engine_core.engine_core.model_executor.workers)


def test_a_rank_error_fails_the_step_and_the_llm_serves_on(llama_path, monkeypatch) -> None:
    def fails_after_the_step(self: Worker, msg):
        output = original(self, msg)
        if self.rank == 1 and _schedules_marker(msg):
            raise ValueError("rank 1 fails this step on purpose")
        return output

    original = Worker.execute_model
    monkeypatch.setattr(Worker, "execute_model", fails_after_the_step)
    with LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128) as llm:
        expected = _tokens(_generate(llm, PROMPTS))
        workers = _workers(llm)
        outputs = _generate(llm, [*PROMPTS, MARKER])
        # Every request of the failed step (the first: all were admitted together).
        for out in outputs:
            completion = out.outputs[0]
            assert completion.finish_reason == "error" and completion.token_ids == []
            assert "rank 1: ValueError: rank 1 fails this step on purpose" in (
                completion.stop_reason
            )
        assert all(w.is_alive() for w in workers)
        kv = llm.llm_engine.engine_core.engine_core.kv_cache_manager
        assert kv.num_free_blocks == kv.num_blocks
        # The workers dropped the failed requests' mirrors and serve the same tokens.
        assert _tokens(_generate(llm, PROMPTS)) == expected
    assert multiprocessing.active_children() == []


def test_a_rank_stuck_in_a_collective_makes_the_engine_dead(llama_path, monkeypatch) -> None:
    def fails_before_the_step(self: Worker, msg):
        if self.rank == 1:
            raise ValueError("boom on purpose")  # rank 0 waits in an all-reduce for ever
        return original(self, msg)

    original = Worker.execute_model
    monkeypatch.setattr(Worker, "execute_model", fails_before_the_step)
    monkeypatch.setattr(multiproc_executor, "STRAGGLER_TIMEOUT_S", 1.0)
    llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
    workers = _workers(llm)
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match="rank 1: ValueError: boom on purpose") as info:
        _generate(llm, PROMPTS[:1])
    assert time.monotonic() - started < 30
    assert "did not answer within 1.0 s" in str(info.value)
    assert not any(w.is_alive() for w in workers)
    assert multiprocessing.active_children() == []
    with pytest.raises(EngineDeadError, match="shut down"):
        _generate(llm, PROMPTS[:1])


def test_a_worker_killed_mid_step_makes_the_engine_dead(llama_path, monkeypatch) -> None:
    def dies(self: Worker, msg):
        if self.rank == 1 and _schedules_marker(msg):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, msg)

    original = Worker.execute_model
    monkeypatch.setattr(Worker, "execute_model", dies)
    llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
    _generate(llm, PROMPTS[:1])
    with pytest.raises(EngineDeadError, match="rank 1: the worker process died"):
        _generate(llm, [MARKER])
    assert multiprocessing.active_children() == []


def test_a_worker_killed_while_idle_is_reported_at_the_next_step(llama_path) -> None:
    llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
    workers = _workers(llm)
    _generate(llm, PROMPTS[:1])
    os.kill(workers[1].pid, signal.SIGKILL)
    workers[1].join(timeout=10)
    with pytest.raises(EngineDeadError, match="rank 1"):
        _generate(llm, PROMPTS[:1])
    assert multiprocessing.active_children() == []
    kv = llm.llm_engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks  # generate aborted its requests


def test_a_rank_whose_gpu_context_is_broken_makes_the_engine_dead(llama_path, monkeypatch):
    def fails_after_the_step(self: Worker, msg):
        output = original(self, msg)
        if self.rank == 1 and _schedules_marker(msg):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return output

    original = Worker.execute_model
    monkeypatch.setattr(Worker, "execute_model", fails_after_the_step)
    # Stands in for a CUDA context that fails every call: the CPU has none to break.
    monkeypatch.setattr(worker_proc, "_device_is_broken", lambda worker: worker.rank == 1)
    llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
    workers = _workers(llm)
    _generate(llm, PROMPTS[:1])  # no error, so nothing asks whether the GPU is broken
    broken = r"rank 1: RuntimeError: CUDA error.*context is broken"
    with pytest.raises(EngineDeadError, match=broken):
        _generate(llm, [MARKER])
    assert not any(w.is_alive() for w in workers)
    assert multiprocessing.active_children() == []
