"""The messages on the tensor-parallel workers' pipes: typed msgpack, never pickle.

* Every call and every reply the executor and its workers exchange survives a round
  trip and decodes as its own type only.
* A malformed, mistyped or unknown message is refused: by ``make_call`` before anything
  is sent, by the worker (which answers with an error and serves on), by the engine
  (a reply that is not the call's type, or names another rank).
* No module of the package imports pickle.
"""

from __future__ import annotations

import multiprocessing
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import torch

import minivllm
from minivllm.core.step_message import NewRequestData, ScheduledRequestData, StepMessage
from minivllm.executor import worker_proc
from minivllm.executor.worker_messages import (
    WORKER_CALLS,
    DetermineNumBlocks,
    ExecuteModel,
    GetKVSpec,
    InitDevice,
    InitializeKVCache,
    LoadModel,
    Profile,
    Shutdown,
    WorkerError,
    WorkerMessageEncoder,
    WorkerReply,
    decode_call,
    decode_reply,
    make_call,
)
from minivllm.runner_outputs import LogprobsLists, ModelRunnerOutput, PromptLogprobsChunk
from minivllm.sampling_params import SamplingParams
from minivllm.worker.kv_cache import KVCacheSpec

encoder = WorkerMessageEncoder()


def _step_message() -> StepMessage:
    params = SamplingParams(temperature=0.7, seed=3, logprobs=2, stop_token_ids=[7])
    return StepMessage(
        new_requests=[NewRequestData("a", [5, 6, 7], params, eos_token_id=2)],
        scheduled=[
            ScheduledRequestData("a", 3, 0, [], [0, 1], True, True, False, True),
            ScheduledRequestData("b", 3, 9, [42], [4], False, False, False, True, [8, 9]),
        ],
        preempted_req_ids={"c"},
        finished_req_ids={"d", "e"},
    )


def _runner_output() -> ModelRunnerOutput:
    rows = LogprobsLists([[4, 1], [8, 2]], [[-0.5, -1.25], [-0.1, -3.0]], [1, 2], [0, 1, 2])
    return ModelRunnerOutput(
        req_ids=["a", "b"],
        sampled_token_ids=[4, 8],
        logprobs=rows,
        prompt_logprobs={"a": PromptLogprobsChunk(0, LogprobsLists([[6, 6]], [[-2.0]], [3]))},
        errors={"b": "the model's logits for this request were not finite"},
        num_accepted_tokens=[0, 1],
        draft_token_ids=[[1, 2], [3, 4]],
    )


CALLS = [
    InitDevice(),
    LoadModel(),
    GetKVSpec(),
    DetermineNumBlocks(),
    InitializeKVCache(17),
    ExecuteModel(_step_message()),
    Profile(True, "/tmp/traces"),
    Shutdown(),
]


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.method())
def test_every_call_round_trips_as_its_own_type(call) -> None:
    decoded = decode_call(encoder.encode(call))
    assert type(decoded) is type(call) and decoded == call
    assert {c.method() for c in CALLS} == {*WORKER_CALLS, "shutdown"}


REPLIES = [
    ("get_kv_spec", KVCacheSpec(16, 2, 64, torch.bfloat16, 3)),
    ("determine_num_blocks", 1234),
    ("execute_model", _runner_output()),
    ("execute_model", None),  # a rank other than 0 acknowledges a step
    ("init_device", None),
    ("profile", "/tmp/traces/rank0_trace.json"),
]


@pytest.mark.parametrize(("method", "value"), REPLIES, ids=[m for m, _ in REPLIES])
def test_every_reply_round_trips_with_its_value(method: str, value) -> None:
    reply = decode_reply(1, method, encoder.encode(WorkerReply(1, value)))
    assert reply == WorkerReply(1, value)
    assert type(reply.value) is type(value)


def test_an_error_reply_keeps_type_message_traceback_and_fatal() -> None:
    try:
        raise ValueError("rank 1 fails on purpose")
    except ValueError as exc:
        error = WorkerError.from_exception(exc, fatal=True)
    reply = decode_reply(1, "execute_model", encoder.encode(WorkerReply(1, error=error)))
    assert reply.value is None and reply.error == error
    assert reply.error.summary.startswith("ValueError: rank 1 fails on purpose; the GPU's")
    assert "raise ValueError" in reply.error.traceback


@pytest.mark.parametrize(
    "data",
    [
        msgspec.msgpack.encode(["initialize_kv_cache", "17"]),  # a string for an int
        msgspec.msgpack.encode(["initialize_kv_cache"]),  # an argument missing
        msgspec.msgpack.encode(["get_kv_spec", 1]),  # an argument too many
        msgspec.msgpack.encode(["no_such_method"]),
        msgspec.msgpack.encode(["execute_model", {"scheduled": "everything"}]),
        pickle.dumps(("determine_num_blocks", (), {})),  # not msgpack: never unpickled
    ],
)
def test_a_malformed_call_is_refused(data: bytes) -> None:
    with pytest.raises(msgspec.MsgspecError):
        decode_call(data)


def test_a_reply_of_another_type_or_rank_is_refused() -> None:
    spec = encoder.encode(WorkerReply(0, KVCacheSpec(16, 2, 64, torch.float16, 3)))
    with pytest.raises(RuntimeError, match="rank 0: malformed reply to determine_num_blocks"):
        decode_reply(0, "determine_num_blocks", spec)
    with pytest.raises(RuntimeError, match="rank 1: its reply to get_kv_spec names rank 0"):
        decode_reply(1, "get_kv_spec", spec)
    # A dtype crosses by name, and only a name torch knows as a dtype comes back.
    forged = msgspec.msgpack.encode(
        [
            0,
            {
                **msgspec.to_builtins(KVCacheSpec(16, 2, 64, torch.float16, 3), enc_hook=str),
                "dtype": "Tensor",
            },
        ]
    )
    with pytest.raises(RuntimeError, match="'Tensor' is not a torch dtype"):
        decode_reply(0, "get_kv_spec", forged)


def test_a_tensor_cannot_cross() -> None:
    with pytest.raises(TypeError, match="a Tensor cannot cross a worker pipe"):
        encoder.encode(WorkerReply(0, torch.zeros(2)))


def test_make_call_refuses_before_sending() -> None:
    assert make_call("initialize_kv_cache", kwargs={"num_blocks": 3}) == InitializeKVCache(3)
    with pytest.raises(ValueError, match="'no_such_method' is not a Worker method"):
        make_call("no_such_method")
    with pytest.raises(ValueError, match="'shutdown' is not"):  # the executor's own
        make_call("shutdown")
    with pytest.raises(TypeError, match="Worker.initialize_kv_cache: Expected `int`"):
        make_call("initialize_kv_cache", ("3",))
    with pytest.raises(TypeError, match="Worker.determine_num_blocks: .*no_such_argument"):
        make_call("determine_num_blocks", kwargs={"no_such_argument": 1})


class _FakeWorker:
    """Stands in for ``Worker`` in a forked worker loop: no model, no process group."""

    def __init__(self, vllm_config, rank: int, distributed_init_method: str) -> None:
        self.vllm_config, self.rank = vllm_config, rank

    def load_model(self) -> None:
        pass

    def determine_num_blocks(self) -> int:
        return 7 + self.rank

    def initialize_kv_cache(self, num_blocks: int) -> None:
        raise ValueError(f"no room for {num_blocks} blocks")

    def shutdown(self) -> None:
        pass


def _recv(conn) -> bytes:
    assert conn.poll(10), "the worker loop did not answer within 10 s"
    return conn.recv_bytes()


def test_the_worker_loop_answers_a_malformed_call_with_an_error_and_serves_on(
    monkeypatch,
) -> None:
    monkeypatch.setattr("minivllm.worker.worker.Worker", _FakeWorker)
    ctx = multiprocessing.get_context("fork")
    engine_end, worker_end = ctx.Pipe()
    config = SimpleNamespace(device=torch.device("cpu"))
    proc = ctx.Process(
        target=worker_proc.worker_main, args=(config, 1, "", worker_end, []), daemon=True
    )
    proc.start()
    worker_end.close()
    try:
        engine_end.send_bytes(pickle.dumps(("determine_num_blocks", (), {})))
        engine_end.send_bytes(encoder.encode(LoadModel()))
        engine_end.send_bytes(encoder.encode(DetermineNumBlocks()))
        engine_end.send_bytes(encoder.encode(InitializeKVCache(5)))
        refused = decode_reply(1, "determine_num_blocks", _recv(engine_end)).error
        # Pickle's bytes read as a msgpack map, which no call is: refused, not unpickled.
        assert refused.type_name in ("DecodeError", "ValidationError")
        # A method that returns None is answered too (an acknowledgement).
        assert decode_reply(1, "load_model", _recv(engine_end)) == WorkerReply(1)
        assert decode_reply(1, "determine_num_blocks", _recv(engine_end)).value == 8
        failed = decode_reply(1, "initialize_kv_cache", _recv(engine_end)).error
        assert failed.summary == "ValueError: no room for 5 blocks" and not failed.fatal
        assert "in initialize_kv_cache" in failed.traceback  # the worker's own frame
        engine_end.send_bytes(encoder.encode(Shutdown()))
        proc.join(timeout=10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        engine_end.close()


def test_no_module_imports_pickle() -> None:
    package = Path(minivllm.__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+(cloud)?pickle\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
