"""The engine at tensor_parallel_size=2: two worker processes over gloo on the CPU.

Greedy outputs must equal both the single-process engine and Hugging Face, token for
token: on a Llama whose 2 KV heads split one per rank, and on a Qwen3 with a single KV
head that both ranks replicate (run with a KV pool small enough to force preemption, so
the workers' mirrors see requests re-admitted with new blocks). A seeded, penalized
random request must also draw the same tokens as in one process. A bad checkpoint and
Ctrl-C must leave no process behind (errors in a rank during a step, a rank stuck in a
collective and a killed worker: ``tests/executor/test_tp_failures.py``).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.worker import Worker
from tests.tiny_models import load_hf_model, make_tiny_model

PROMPT_LENS = [1, 7, 33, 70]
MAX_TOKENS = [8, 12, 5, 10]
ENGINE = dict(max_model_len=128, max_num_batched_tokens=32)  # several prefill chunks

CASES = {
    # name: (arch, model overrides, engine overrides, KV heads per rank at tp=2)
    "llama-kv2": ("llama", dict(num_key_value_heads=2), dict(), 1),
    "qwen3-kv1": ("qwen3", dict(num_key_value_heads=1), dict(num_kv_blocks=8), 1),
}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf_greedy(path, prompts: list[list[int]]) -> list[list[int]]:
    model = load_hf_model(path)
    outs = []
    with torch.no_grad():
        for ids, n in zip(prompts, MAX_TOKENS):
            inp = torch.tensor([ids])
            gen = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=n,
                                 do_sample=False, eos_token_id=2, pad_token_id=0)
            outs.append(gen[0, len(ids):].tolist())
    return outs


def _run(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    # One seeded random request with a penalty: it reads the output tokens the workers'
    # mirrors hold, and draws from the seeded generator on each rank.
    params.append(SamplingParams(temperature=1.0, seed=7, repetition_penalty=1.3,
                                 max_tokens=12))
    inputs = [{"prompt_token_ids": p} for p in prompts + [prompts[2]]]
    return [o.outputs[0].token_ids for o in llm.generate(inputs, params, use_tqdm=False)]


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_matches_tp1_and_hf(tmp_path, case: str) -> None:
    arch, model_overrides, engine_overrides, kv_heads_per_rank = CASES[case]
    path = make_tiny_model(arch, tmp_path / arch, **model_overrides)
    prompts = _prompts()
    kwargs = {**ENGINE, **engine_overrides}
    tp1 = _run(LLM(str(path), **kwargs), prompts)
    with LLM(str(path), tensor_parallel_size=2, **kwargs) as llm:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        assert executor.kv_spec.num_kv_heads == kv_heads_per_rank
        # The model lives in the workers: a method name reaches every rank, a callable
        # (it would have to be pickled) is refused.
        specs = llm.collective_rpc("get_kv_spec")
        assert [s.num_kv_heads for s in specs] == [kv_heads_per_rank] * 2
        with pytest.raises(TypeError, match="name of a Worker method"):
            llm.collective_rpc(lambda worker: worker.rank)
        tp2 = _run(llm, prompts)
        preemptions = llm.llm_engine.stats.num_preemptions
    assert tp2 == tp1
    assert tp2[:-1] == _hf_greedy(path, prompts)
    if "num_kv_blocks" in engine_overrides:
        assert preemptions > 0
    assert multiprocessing.active_children() == []


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_bad_checkpoint_fails_init_cleanly(tmp_path) -> None:
    path = make_tiny_model("llama", tmp_path / "bad")
    shard = next(path.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated file
    with pytest.raises(RuntimeError, match=r"rank [01]: \w+"):
        LLM(str(path), tensor_parallel_size=2, max_model_len=128)
    assert multiprocessing.active_children() == []


def test_ctrl_c_terminates_workers(llama_path, monkeypatch) -> None:
    def hanging_execute(self: Worker, msg):
        time.sleep(60)

    # Python turns SIGINT into KeyboardInterrupt under its default handler, which a
    # terminal's Python has; a shell starts background jobs with SIGINT ignored, so a
    # suite run as one (`pytest &`) would inherit SIG_IGN. Install the default here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(Worker, "execute_model", hanging_execute)
    llm = None
    try:
        llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
        workers = list(llm.llm_engine.engine_core.engine_core.model_executor.workers)
        main = threading.main_thread().ident
        timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)
    finally:
        signal.signal(signal.SIGINT, previous)
        if llm is not None and multiprocessing.active_children():
            llm.shutdown()  # the test failed: leave no worker behind for the next one
    assert time.monotonic() - started < 20
    assert not any(w.is_alive() for w in workers)
    assert multiprocessing.active_children() == []


def test_shutdown_is_idempotent_and_leaves_nothing(llama_path) -> None:
    llm = LLM(str(llama_path), tensor_parallel_size=2, max_model_len=128)
    workers = list(llm.llm_engine.engine_core.engine_core.model_executor.workers)
    assert all(w.is_alive() for w in workers)
    llm.shutdown()
    llm.shutdown()
    assert [w.exitcode for w in workers] == [0, 0]  # exited by themselves, not killed
    assert multiprocessing.active_children() == []
