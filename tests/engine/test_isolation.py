"""One request that fails inside a step fails alone; the engine keeps serving.

Two kinds of failure, with async scheduling off and on:

* **A model error on one request**: a checkpoint whose embedding row for one token is
  NaN (a broken weight that only some inputs reach), and a forward hook that turns the
  hidden states past one position into NaN (an overflow mid-decode). The request whose
  logits are not finite finishes with ``finish_reason="error"``; the three others in the
  same batch get exactly the tokens of their solo runs; the pool is full afterwards and
  the next ``generate`` works.
* **A step that raises** (injected into the model runner, at queueing or at reading the
  results): exactly the requests that step scheduled finish with an error, a request
  that was waiting runs normally, later requests succeed, and nothing is left held.
  Issue 19's item 2 (one failed ``step()`` poisoning the rest of its batch for ever) is
  a regression test here.

Last, the front end's side on its own: a failed sample of an ``n > 1`` request.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from safetensors.torch import load_file, save_file

from minivllm import LLM, SamplingParams
from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from minivllm.engine.exceptions import EngineGenerateError
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind
from minivllm.worker.async_utils import AsyncOutput
from minivllm.worker.model_runner import ModelRunner
from tests.tiny_models import make_tiny_model

POISON = 500  # its embedding row is NaN in the poisoned checkpoint
GOOD = [[11, 12, 13, 14, 15], [40, 41], [7, 8, 9, 10, 11, 12, 13, 14], [300, 301, 302]]
BAD = [21, 22, POISON, 23]
LONG = list(range(100, 120))  # 20 tokens: the only request that reaches position 22
ARGS = dict(dtype="float32", device="cpu", max_model_len=128, block_size=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def poisoned_model(path, token: int = POISON):
    """A tiny Llama whose embedding of ``token`` is NaN (the LM head is untied)."""
    make_tiny_model("llama", path)
    shard = next(path.glob("*.safetensors"))
    weights = load_file(shard)
    weights["model.embed_tokens.weight"][token] = float("nan")
    save_file(weights, shard, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return poisoned_model(tmp_path_factory.mktemp("poisoned"))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request, model_path):
    return LLM(str(model_path), async_scheduling=request.param, **ARGS)


@pytest.fixture(scope="module")
def solo(model_path) -> dict[tuple[int, ...], list[int]]:
    """Each good prompt's greedy tokens when it runs alone (a fresh engine)."""
    single = LLM(str(model_path), **ARGS)
    runs = {}
    for prompt in [*GOOD, LONG]:
        out = single.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
        assert out.outputs[0].finish_reason == "length"  # the poison is never generated
        runs[tuple(prompt)] = out.outputs[0].token_ids
    return runs


def pool_is_full(llm: LLM) -> bool:
    kv = llm.llm_engine.engine_core.engine_core.kv_cache_manager
    return kv.num_free_blocks == kv.num_blocks


def _generate(llm: LLM, prompts: list[list[int]]) -> list[RequestOutput]:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)


def _assert_good(outputs: list[RequestOutput], prompts, solo) -> None:
    for out, prompt in zip(outputs, prompts):
        completion = out.outputs[0]
        assert completion.finish_reason == "length", completion
        assert completion.token_ids == solo[tuple(prompt)]


# ---- a model error on one request -------------------------------------------------------


def test_nan_logits_in_prefill_fail_only_that_request(llm: LLM, solo) -> None:
    prompts = [GOOD[0], GOOD[1], BAD, GOOD[2], GOOD[3]]
    outputs = _generate(llm, prompts)
    assert [o.prompt_token_ids for o in outputs] == prompts  # nothing lost, in order
    bad = outputs[2].outputs[0]
    assert bad.finish_reason == "error" and bad.token_ids == []
    assert "not finite" in bad.stop_reason
    _assert_good(outputs[:2] + outputs[3:], GOOD, solo)
    assert pool_is_full(llm)
    # The bad request's NaN K/V went back to the pool; the blocks serve others now.
    _assert_good(_generate(llm, GOOD), GOOD, solo)
    assert pool_is_full(llm)


def test_nan_logits_mid_decode_fail_only_that_request(llm: LLM, solo) -> None:
    def nan_past_position(module, args, output):
        _, positions = args
        output[positions >= len(LONG) + 2] = float("nan")

    hooks = llm.collective_rpc(lambda runner: runner.model.register_forward_hook(nan_past_position))
    try:
        outputs = _generate(llm, [*GOOD, LONG])
    finally:
        hooks[0].remove()
    long = outputs[-1].outputs[0]
    assert long.finish_reason == "error" and "not finite" in long.stop_reason
    # Its first three tokens came from positions 19, 20 and 21; position 22 failed.
    assert long.token_ids == solo[tuple(LONG)][:3]
    _assert_good(outputs[:-1], GOOD, solo)
    assert pool_is_full(llm)
    _assert_good(_generate(llm, [LONG]), [LONG], solo)


# ---- a step that raises -------------------------------------------------------------------


class FailOnce:
    """Patch ``owner.name`` to raise once, on the first call for which ``when`` is true."""

    def __init__(self, monkeypatch, owner, name: str, when=lambda *args: True) -> None:
        self.armed, self.when, self.calls = True, when, 0
        original = getattr(owner, name)

        def patched(*args, **kwargs):
            self.calls += 1
            if self.armed and self.when(*args):
                self.armed = False
                raise RuntimeError("injected step failure")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, patched)


def _engine(model_path, async_scheduling: bool, **kwargs) -> LLMEngine:
    return LLM(str(model_path), async_scheduling=async_scheduling, **ARGS, **kwargs).llm_engine


def _run(engine: LLMEngine) -> dict[str, RequestOutput]:
    finished = {}
    for _ in range(200):  # far more steps than these requests need: a hang fails here
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        if not engine.has_unfinished_requests():
            return finished
    raise AssertionError("the engine did not finish its requests")


def _add(engine: LLMEngine, prompt: list[int]) -> str:
    return engine.add_request({"prompt_token_ids": prompt}, GREEDY)


@pytest.mark.parametrize("where", ["execute_model_async", "get_output"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_step_that_raises_fails_exactly_its_requests(
    model_path, solo, monkeypatch, caplog, where: str, async_scheduling: bool
) -> None:
    # Two sequence slots: GOOD[2] waits while GOOD[0] and GOOD[1] run.
    engine = _engine(model_path, async_scheduling, max_num_seqs=2)
    ids = [_add(engine, p) for p in GOOD[:3]]
    for _ in range(3):
        assert all(not o.finished for o in engine.step())
    owner = ModelRunner if where == "execute_model_async" else AsyncOutput
    fail = FailOnce(monkeypatch, owner, where)
    outputs = _run(engine)
    assert not fail.armed
    for rid in ids[:2]:  # the failed step's requests: their tokens so far, then "error"
        completion = outputs[rid].outputs[0]
        assert completion.finish_reason == "error"
        assert "RuntimeError: injected step failure" in completion.stop_reason
        prompt = GOOD[int(rid) - int(ids[0])]
        assert completion.token_ids == solo[tuple(prompt)][: len(completion.token_ids)]
    assert outputs[ids[2]].outputs[0].token_ids == solo[tuple(GOOD[2])]
    assert caplog.text.count("injected step failure") >= 1  # the traceback, logged
    later = _add(engine, GOOD[3])
    assert _run(engine)[later].outputs[0].token_ids == solo[tuple(GOOD[3])]
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_llm_generate_keeps_every_output_when_a_step_raises(
    model_path, solo, monkeypatch, async_scheduling: bool
) -> None:
    llm = LLM(str(model_path), async_scheduling=async_scheduling, **ARGS)
    # Fail the third step: every request is running by then, so all fail, and
    # generate returns each one's output with finish_reason "error" instead of raising.
    steps = iter(range(100))
    FailOnce(monkeypatch, ModelRunner, "execute_model_async", lambda *a: next(steps) == 2)
    outputs = _generate(llm, GOOD)
    assert [o.prompt_token_ids for o in outputs] == GOOD
    assert all(o.outputs[0].finish_reason == "error" for o in outputs)
    assert pool_is_full(llm)
    _assert_good(_generate(llm, GOOD), GOOD, solo)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_issue_19_item_2_a_failed_step_does_not_poison_the_batch(
    model_path, solo, monkeypatch, async_scheduling: bool
) -> None:
    """Issue 19, item 2: a good request and a bad one; the step with the bad one raises;
    abort the bad one; the engine must go on, not fail every later step."""
    engine = _engine(model_path, async_scheduling)
    good = _add(engine, GOOD[0])
    engine.step()
    engine.step()  # the good request is decoding (with a token in flight, async)

    def schedules_marker(runner, scheduler_output) -> bool:
        return any(s.request.prompt_token_ids == GOOD[1] for s in scheduler_output.scheduled)

    FailOnce(monkeypatch, ModelRunner, "execute_model_async", schedules_marker)
    bad = _add(engine, GOOD[1])
    outputs = {o.request_id: o for o in engine.step()}  # no exception escapes step()
    outputs.update(_run_after_abort(engine, bad))
    assert outputs[bad].outputs[0].finish_reason == "error"
    assert outputs[good].outputs[0].finish_reason == "error"  # it shared the failed step
    later = [_add(engine, p) for p in GOOD]
    finished = _run(engine)
    for rid, prompt in zip(later, GOOD):
        assert finished[rid].outputs[0].token_ids == solo[tuple(prompt)]
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def _run_after_abort(engine: LLMEngine, rid: str) -> dict[str, RequestOutput]:
    engine.abort_request([rid])  # already finished with an error: a no-op
    return _run(engine)


# ---- the front end's side -----------------------------------------------------------------


def _n2_request(queue, kind: RequestOutputKind) -> tuple[OutputProcessor, list[str]]:
    proc = OutputProcessor(None)
    params = SamplingParams(n=2, max_tokens=5, seed=1, output_kind=kind)
    request = EngineCoreRequest("p", [5, 6], params, None, 0.0)
    parent = ParentRequest("p", params)
    children = []
    for index in range(2):
        child_id, child_params = parent.get_child_info(index)
        child = msgspec.structs.replace(request, request_id=child_id, sampling_params=child_params)
        proc.add_request(child, None, parent, index, queue)
        children.append(child_id)
    return proc, children


def test_a_failed_sample_of_a_stream_raises_and_stops_its_sibling() -> None:
    queue = RequestOutputCollector(RequestOutputKind.DELTA)
    proc, (first, second) = _n2_request(queue, RequestOutputKind.DELTA)
    error = EngineCoreOutput(first, [], finish_reason=FinishReason.ERROR, stop_reason="boom")
    result = proc.process_outputs([EngineCoreOutput(second, [7]), error], 0.0)
    assert result.reqs_to_abort == [second]  # the core still runs the sibling
    assert not proc.has_unfinished_requests()
    with pytest.raises(EngineGenerateError, match="request p failed: boom"):
        asyncio.run(queue.get())


def test_a_failed_sample_offline_is_an_output_with_finish_reason_error() -> None:
    proc, (first, second) = _n2_request(None, RequestOutputKind.FINAL_ONLY)
    error = EngineCoreOutput(first, [], finish_reason=FinishReason.ERROR, stop_reason="boom")
    done = EngineCoreOutput(second, [7], finish_reason=FinishReason.LENGTH)
    outputs = proc.process_outputs([EngineCoreOutput(first, [8]), error, done], 0.0)
    assert outputs.reqs_to_abort == []
    (final,) = outputs.request_outputs
    assert final.finished and final.request_id == "p"
    completions = {c.index: (c.token_ids, c.finish_reason, c.stop_reason) for c in final.outputs}
    assert completions == {0: ([8], "error", "boom"), 1: ([7], "length", None)}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_failed_prefill_leaves_no_block_in_the_prefix_cache(
    model_path, solo, monkeypatch, async_scheduling: bool
) -> None:
    """The prefix cache indexes a block when it is allocated, before the step writes its
    K/V; a step that failed may never have written it. The same prompt again must be
    computed afresh, not served from those blocks."""
    engine = _engine(model_path, async_scheduling)
    FailOnce(monkeypatch, ModelRunner, "execute_model_async")
    rid = _add(engine, GOOD[2])  # 8 tokens: two full blocks of 4
    assert _run(engine)[rid].outputs[0].finish_reason == "error"
    again = _add(engine, GOOD[2])
    out = _run(engine)[again]
    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == solo[tuple(GOOD[2])]
